"""The stages of one simulator step, in order: :data:`PIPELINE`, and the loop that runs them.

::

    actions ─▶ signals_before ─▶ motion ─▶ replay ─▶ partner ─▶ signals ─▶ contacts ─▶ rewards ─▶ decoys ─▶ goals
            ─▶ trial ─▶ accounting ─▶ restart ─▶ observe ─▶ StepResult

Each stage is ``fn(ctx, state, step) -> changes`` (see :mod:`gpusim.sim.context`); the pipeline
applies the changes after each one (to its one working copy of the input state). A stage hook (``DriveEnv.stage_hook``)
may wrap every stage call, e.g. to time it (``profiling/timers.py``) or to put it in a profiler
range (``profiling/trace.py``): ``hook(name, call) -> changes`` where ``call()`` runs the stage.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from gpusim.backend import step_backend
from gpusim.sim.accounting import accounting
from gpusim.sim.candidates import decoys
from gpusim.sim.contacts import contacts
from gpusim.sim.context import SimContext, StepVars
from gpusim.sim.episode import restart
from gpusim.sim.goals import goals
from gpusim.sim.motion import motion
from gpusim.sim.observe import observe
from gpusim.sim.partner_task import partner
from gpusim.sim.replay import replay
from gpusim.sim.rewards import rewards
from gpusim.sim.signals import signals, signals_before
from gpusim.sim.trial import trial
from gpusim.state import EnvState


class Stage(NamedTuple):
    """A named stage: ``run(ctx, state, step) -> dict`` of the state fields it changes."""

    name: str
    run: Callable


#: The step, in order (docs/architecture.md). Insert a new stage here.
PIPELINE: tuple[Stage, ...] = (
    Stage("signals_before", signals_before),  # slot centres before the motion (red-light test)
    Stage("motion", motion),          # who acts; actions -> controls -> dynamics (controlled agents)
    Stage("replay", replay),          # clock +1; experts follow the log
    Stage("partner", partner),        # partner task: the scripted crossing partner (slot A - 1)
    Stage("signals", signals),        # red-light crossings of this step (signals on the log clock)
    Stage("contacts", contacts),      # collisions, offroad, hit-by (collision REMOVE)
    Stage("rewards", rewards),        # reward, goals reached, contact behaviours, terminal
    Stage("decoys", decoys),          # memory task: a wrong candidate goal stops the agent
    Stage("goals", goals),            # RESPAWN / NEW_GOAL after a goal
    Stage("trial", trial),            # trial clock (trial mode)
    Stage("accounting", accounting),  # episode accumulators, metrics of finished agent-episodes
    Stage("restart", restart),        # auto-reset after step H; trial restore
    Stage("observe", observe),        # observation of the new state
)


def run_pipeline(ctx: SimContext, state: EnvState, step: StepVars, hook: Callable | None = None,
                 stages: tuple[Stage, ...] = PIPELINE) -> EnvState:
    """Run ``stages`` on ``state``; returns the new state (``step`` holds the per-step values).

    ``state`` itself is not modified: the stages work on one copy of it (``state.replace()``), to
    which each stage's changes are applied in place (``EnvState.set_fields``), so a stage sees the
    fields as the stages before it left them. ``step.backend``, when None, is set first
    (:func:`gpusim.backend.step_backend`: the ops' backend for the whole step)."""
    if step.backend is None:
        step.backend = step_backend(state.pos, ctx.config.cpu_kernels)
    work = state.replace()
    for stage in stages:
        if hook is None:
            changes = stage.run(ctx, work, step)
        else:
            changes = hook(stage.name, lambda stage=stage, work=work: stage.run(ctx, work, step))
        if changes:
            work.set_fields(changes)
    return work
