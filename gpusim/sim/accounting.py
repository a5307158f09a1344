"""Stage ``accounting``: the per-slot episode accumulators and the metrics of finished
agent-episodes (``gpusim.metrics``: per-slot EMA and plain means, kept on the device).

Only valid steps count: returns add the step's reward (0 on invalid steps), lengths count
``loss_mask``, the contact flags count contacts of agents in play. When a slot's ``terminal`` is
set its episode's tallies go to the metrics log as the registry's columns
(:data:`gpusim.metrics.METRICS`, :func:`~gpusim.metrics.episode_rows`, per-trial scores in trial
mode). The op is :func:`gpusim.kernels.accounting.accumulate` on the
step's backend; on the CPU (torch and C backends) it also returns the number of terminal slots
without a sync, and a step where none is ``terminal`` skips the metrics log (adding no episode
changes nothing, and it saves ~30 small torch ops per step). A new metric = one
:class:`~gpusim.metrics.Metric` in ``METRICS`` (``gpusim/metrics.py``) and, if it needs a new
accumulator, a state field written here and its tally (docs/architecture.md).
"""

from __future__ import annotations

from gpusim.kernels.accounting import bind_accumulate
from gpusim.metrics import episode_rows
from gpusim.sim.context import SimContext, StepVars, bound_op
from gpusim.state import EnvState


def accounting(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """Changes ``ep_return``, ``ep_length``, ``goal_reached``, ``ever_collided``, ``ever_offroad``,
    ``ever_red_light``;
    records the finished agent-episodes (``step.terminal``) in ``ctx.metrics`` (ego slots) and
    ``ctx.coplayer_metrics`` (co-player slots, when the env has co-players)."""
    changes, col_ip, off_ip, terminals = bound_op(ctx, step, "accumulate", bind_accumulate)(
        state.ep_return, step.reward, state.ep_length, step.loss_mask, state.goal_reached, step.goal_now,
        step.in_play, step.collided, step.offroad, state.ever_collided, state.ever_offroad, state.ever_red_light,
        state.red_light_now, step.terminal)
    step.set_contacts_in_play(collided=col_ip, offroad=off_ip)
    if terminals != 0:  # None (no host read on this backend) records too
        record_finished(ctx, state, step, changes)
    return changes


def record_finished(ctx: SimContext, state: EnvState, step: StepVars, changes: dict) -> None:
    """Add the agent-episodes that end in this step (``step.terminal`` [W, C]) to ``ctx.metrics``
    (ego slots) and ``ctx.coplayer_metrics`` (co-player slots), with the accumulators ``changes``
    (this stage's new ``ep_return`` ... ``ever_red_light``) and ``state`` as the stage saw it."""
    C, cfg = ctx.num_slots, ctx.config
    tallies = {"return": changes["ep_return"], "length": changes["ep_length"],
               "goal": changes["goal_reached"][:, :C], "collided": changes["ever_collided"][:, :C],
               "offroad": changes["ever_offroad"][:, :C], "red_light": changes["ever_red_light"],
               "trial_reached": state.trial_reached, "trial_clean": state.trial_clean}
    values = episode_rows(tallies, cfg.k_trials if cfg.trial_mode else None)
    # roles (gpusim/sim/roles.py): egos feed the main log, co-players their own (ego = slot_active
    # without co-players, and terminal is only set on active slots, so nothing changes then)
    ctx.metrics.add(values, step.terminal & state.ego, step.backend)
    if ctx.coplayer_metrics is not None:
        ctx.coplayer_metrics.add(values, step.terminal & ~state.ego, step.backend)
