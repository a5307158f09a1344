"""The compiled CPU step (``EnvConfig.compile=True`` on the torch backend; issue 20).

The eager stages of :data:`gpusim.sim.pipeline.PIPELINE` stay the oracle; this module runs the
SAME stage functions through ``torch.compile`` (inductor's C++/OpenMP code generation,
``dynamic=False``: every shape of an env is static), so their elementwise ops, gathers and masks
fuse into a few loops. A step is three compiled calls and one eager compaction:

1. ``physics``: the stages from the first to ``accounting`` (actions → motion → replay →
   signals → contacts → rewards → goals → trial → accounting, the metric log updates included),
   plus the trial restore of stage ``restart`` when the step does not end the episode. It is
   specialised on the host flag ``episode_end`` (two graphs per env size).
2. On the step that ends the episode (after step H) the auto-reset (``begin_episode``: new
   scenarios drawn with the env's generator, initial state, roles) runs eagerly: it is one step in
   H, and the generator draw is not traceable.
3. ``prep``: the observation inputs of the new state (active slots, ego extras) and the traffic
   signal block, written straight into the observation buffer.
4. The partner/road block: the active slots are compacted eagerly (``nonzero``, no device sync
   on the CPU) and processed in fixed-size row blocks by one compiled graph (two block sizes), as
   in :mod:`gpusim.kernels.observations.compiled`, but written straight into the full-width
   buffer (no ``obs_core`` copy).

Results equal the eager step's within float32 rounding (tests/test_compiled_step.py, real
scenarios, every goal and contact behaviour, trial mode). With a stage hook set
(``DriveEnv.stage_hook``, e.g. ``bench_env.py --breakdown``) the env runs the eager pipeline,
since fused stages cannot be timed one by one.

Compile cost: the first step of a new env size compiles (tens of seconds on 2 cores; printed by
``profiling/bench_env.py`` as ``reset_s`` + ``first_step_s``); inductor's on-disk FX graph and
code caches (``TORCHINDUCTOR_CACHE_DIR``, default ``/tmp/torchinductor_$USER``) make the next
process with the same sizes start in a few seconds (docs/performance.md).
"""

from __future__ import annotations

import dataclasses

import torch

from gpusim.kernels.observations.naive import block_arguments, observe_block_functional, padded_blocks
from gpusim.kernels.signals import SIGNAL_DIM, signal_observations
from gpusim.sim.context import SimContext, StepVars, slots
from gpusim.sim.episode import begin_episode, draw_scenarios
from gpusim.sim.observe import ego_extra, observe_state
from gpusim.sim.signals import signal_log_index
from gpusim.state import TRIAL_KEEP, EnvState

#: Observations through the compiled row blocks (True) or the eager observation stage (False).
#: Measured on the 2-core machine (1 thread, 256 worlds x 8 slots, docs/performance.md): the
#: inductor blocks of ``observe_block_functional`` took ~2x the eager stage's time, so False.
COMPILED_OBSERVE = False

#: Slot rows per compiled observation block (full blocks of the first size while that many rows
#: remain, then blocks of the second; a short last block is padded with copies of its last row).
BLOCK_ROWS = (512, 64)

#: Stages run eagerly inside the compiled step: their kernels' torch references compact sparse
#: candidates (``nonzero``, boolean indexing), whose sizes change every step.
EAGER_STAGES = frozenset({"contacts", "goals"})

#: dynamo's graphs-per-code-object limit while a compiled step exists (raised, never lowered;
#: 4 segment graphs x 2 episode_end flags per env size, plus the observation prep graph).
RECOMPILE_LIMIT = 128

#: StepVars fields returned by the physics graph (the rest of the step reads them).
_STEP_OUT = ("in_play", "loss_mask", "collided", "offroad", "hit", "goal_now", "reward", "truncated", "terminal",
             "truncation", "trial_ended", "restart")


class CompiledStep:
    """The compiled step of one env (module docstring).

    Args:
        ctx: the env's :class:`~gpusim.sim.context.SimContext` (its ``obs_buf`` must exist before
            the first call).
        stages: the env's pipeline; must end with stages ``restart`` and ``observe`` (the compiled
            step replaces those two).

    Raises:
        ValueError: a pipeline that does not end with ``restart``, ``observe``.
    """

    def __init__(self, ctx: SimContext, stages: tuple):
        names = [s.name for s in stages]
        if names[-2:] != ["restart", "observe"]:
            raise ValueError(f"CompiledStep: the pipeline must end with restart, observe; got {names}")
        self.ctx = ctx
        self.pipeline = stages
        # all segments of all envs share one code object, and each (segment, env size,
        # episode_end) is its own graph: dynamo's default limit of 8 graphs per code object would
        # silently send the rest back to eager
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        # Stages with data-dependent shapes inside (sparse candidate compaction) run eagerly between
        # compiled segments of the other stages (a graph break inside the stage loop would make
        # dynamo fall back to eager for the rest of the loop).
        self.segments = []  # (compiled?, callable(tensors, vars, actions, episode_end))
        run: list = []
        for stage in stages[:-2]:
            if stage.name in EAGER_STAGES:
                if run:
                    self.segments.append(torch.compile(_Segment(ctx, tuple(run)), dynamic=False))
                    run = []
                self.segments.append(_Segment(ctx, (stage,)))
            else:
                run.append(stage)
        self.segments.append(torch.compile(_Segment(ctx, tuple(run), restore=True), dynamic=False))
        # the eager observation stage reads the config: a copy of the context with compile off
        self._obs_ctx = dataclasses.replace(ctx, config=dataclasses.replace(ctx.config, compile=False))
        self._prep = torch.compile(self._prep_eager, dynamic=False)
        self._block = torch.compile(_observe_rows_into, dynamic=False)

    # ---------------------------------------------------------------- graph bodies (eager code)
    def _prep_eager(self, tensors: dict, full: torch.Tensor):
        ctx, cfg, p, C = self.ctx, self.ctx.config, self.ctx.pack, self.ctx.num_slots
        state = EnvState(**tensors)
        active = state.slot_active & state.present[:, :C]
        extra = ego_extra(ctx, state)
        if cfg.num_signals > 0:
            d0 = full.shape[-1] - cfg.num_signals * SIGNAL_DIM
            sig = signal_observations(
                pos=slots(state.pos, C), heading=slots(state.heading, C), active=active, scenario=state.scenario,
                log_index=signal_log_index(ctx, state), signal_pos=p.signal_pos, signal_dir=p.signal_dir,
                signal_state=p.signal_state, signal_valid=p.signal_valid, num_signals=p.num_signals,
                num_obs=cfg.num_signals, radius=cfg.road_radius)
            full[..., d0:].copy_(sig.view(*full.shape[:2], -1))
        return active, extra

    # ---------------------------------------------------------------- the step
    def __call__(self, state: EnvState, step: StepVars) -> EnvState:
        """Run one step from ``state`` (``step`` holds the validated actions and the host flag
        ``episode_end``); sets the fields of ``step`` the result needs and returns the new state."""
        ctx = self.ctx
        tensors, svars, info = state.tensors(), {}, {}
        for seg in self.segments:
            tensors, svars, info = seg(tensors, svars, info, step.actions, bool(step.episode_end))
        for k, v in svars.items():
            setattr(step, k, v)
        step.info.update(info)
        state = EnvState(**tensors)
        if step.episode_end:
            state = begin_episode(ctx, draw_scenarios(ctx))
        step.obs = self.observe(state)
        return state

    def observe(self, state: EnvState) -> torch.Tensor:
        """Observation [W, C, D] of ``state`` written into ``ctx.obs_buf`` (returned): the eager
        observation stage (:data:`COMPILED_OBSERVE` False, measured faster) or the compiled blocks."""
        if not COMPILED_OBSERVE:
            octx = self._obs_ctx
            octx.obs_buf, octx.obs_written, octx.obs_core = self.ctx.obs_buf, self.ctx.obs_written, self.ctx.obs_core
            full = observe_state(octx, state)
            self.ctx.obs_written, self.ctx.obs_core = octx.obs_written, octx.obs_core
            return full
        return self._observe_compiled(state)

    def _observe_compiled(self, state: EnvState) -> torch.Tensor:
        ctx, cfg, p, C = self.ctx, self.ctx.config, self.ctx.pack, self.ctx.num_slots
        full = ctx.obs_buf
        active, extra = self._prep(state.tensors(), full)
        D = full.shape[-1]
        d0 = D - cfg.num_signals * SIGNAL_DIM
        flat = active.view(-1)
        obs2d = full.view(-1, D)
        stale = (ctx.obs_written & ~flat).nonzero().squeeze(1)
        if stale.numel():
            obs2d.index_fill_(0, stale, 0.0)  # slots that left play: all zero (signal block too)
        ctx.obs_written = flat.clone()
        live = flat.nonzero().squeeze(1)
        n = live.numel()
        if n == 0:
            return full
        args = block_arguments(
            pos=state.pos, heading=state.heading, speed=state.speed, length=state.length, width=state.width,
            agent_type=state.agent_type, present=state.present, goal=slots(state.goal, C), ego_extra=extra,
            scenario=state.scenario, road_seg=p.road_seg, road_type=p.road_type, grid_road=p.grid_road,
            grid_origin=p.grid_origin, grid_dims=p.grid_dims, cell_size=p.cell_size, grid_start=p.grid_start,
            num_partners=cfg.num_partners, partner_radius=cfg.partner_radius, road_radius=cfg.road_radius)
        for r in padded_blocks(live, BLOCK_ROWS):
            self._block(obs2d, d0, r, args)
        return full


class _Segment:
    """Stages run in order on a state given as a dict of tensors; the StepVars fields set so far
    travel between segments as a dict (:data:`_STEP_OUT`) plus ``info``. ``restore``: also apply
    the trial restore of stage ``restart`` (last segment, steps that do not end the episode)."""

    def __init__(self, ctx: SimContext, stages: tuple, restore: bool = False):
        self.ctx, self.stages, self.restore = ctx, stages, restore

    def __call__(self, tensors: dict, svars: dict, info: dict, actions: torch.Tensor, episode_end: bool):
        ctx = self.ctx
        state = EnvState(**tensors)
        step = StepVars(actions=actions, episode_end=episode_end, info=dict(info), **svars)
        for stage in self.stages:
            changes = stage.run(ctx, state, step)
            if changes:
                state = state.replace(**changes)
        if self.restore and not episode_end and step.restart is not None:  # trial restore (stage restart)
            state = state.where(step.restart, ctx.start, keep=TRIAL_KEEP)
        out = {k: getattr(step, k) for k in _STEP_OUT if getattr(step, k) is not None}
        return state.tensors(), out, step.info


def _observe_rows_into(obs2d: torch.Tensor, d0: int, rows: torch.Tensor, args: dict) -> None:
    """Partner/road block (:func:`observe_block_functional`) of ``rows`` written into the first
    ``d0`` columns of ``obs2d`` [W*C, D] (inside the compiled graph: written once, in place)."""
    obs2d[:, :d0].index_copy_(0, rows, observe_block_functional(rows=rows, **args))
