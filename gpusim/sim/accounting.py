"""Stage ``accounting``: the per-slot episode accumulators and the metrics of finished
agent-episodes (``gpusim.metrics``: per-slot EMA and plain means, kept on the device).

Only valid steps count: returns add the step's reward (0 on invalid steps), lengths count
``loss_mask``, the contact flags count contacts of agents in play. When a slot's ``terminal`` is
set its episode's values (:func:`~gpusim.metrics.episode_values`, plus the per-trial scores in
trial mode) go to the metrics log; on the CPU torch backend outside ``compile``, a step where no slot is
``terminal`` skips that (adding no episode changes nothing; the host read of ``terminal.any()``
costs no sync there, and it saves ~30 small torch ops per step). With the C kernels
(``EnvConfig.cpu_kernels``, eager) the accumulators, the contacts of agents in play and the
terminal count come from one C pass (``kernels.step_cpu.accounting_cpu``). A new metric column = a column
in ``gpusim/metrics.py`` and, if it needs a new accumulator, a state field written here
(docs/architecture.md).
"""

from __future__ import annotations

import torch

from gpusim.metrics import episode_values
from gpusim.kernels.step_cpu import accounting_cpu
from gpusim.sim.context import SimContext, StepVars, on_torch, use_step_c
from gpusim.state import EnvState


def accounting(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """Changes ``ep_return``, ``ep_length``, ``goal_reached``, ``ever_collided``, ``ever_offroad``,
    ``ever_red_light``;
    records the finished agent-episodes (``step.terminal``) in ``ctx.metrics`` (ego slots) and
    ``ctx.coplayer_metrics`` (co-player slots, when the env has co-players)."""
    C = ctx.num_slots
    cfg = ctx.config
    if use_step_c(ctx, state, step):  # one C pass; the terminal count comes back as a host int
        changes, col_ip, off_ip, terminals = accounting_cpu(
            ep_return=state.ep_return, reward=step.reward, ep_length=state.ep_length, loss_mask=step.loss_mask,
            goal_reached=state.goal_reached, goal_now=step.goal_now, in_play=step.in_play, collided=step.collided,
            offroad=step.offroad, ever_collided=state.ever_collided, ever_offroad=state.ever_offroad,
            ever_red_light=state.ever_red_light, red_light_now=state.red_light_now, terminal=step.terminal,
            check=not step.checked)
        step.set_contacts_in_play(collided=col_ip, offroad=off_ip)
        if terminals == 0:
            return changes
    else:
        changes = {
            "ep_return": state.ep_return + step.reward,
            "ep_length": state.ep_length + step.loss_mask,  # int32 + bool -> int32
            "goal_reached": state.goal_reached | step.goal_now,
            "ever_collided": state.ever_collided | step.collided_in_play(),
            "ever_offroad": state.ever_offroad | step.offroad_in_play(),
            "ever_red_light": state.ever_red_light | state.red_light_now,  # in-play slots only (stage signals)
        }
        if not cfg.compile and on_torch(state, step) and step.terminal.device.type == "cpu" \
                and not bool(step.terminal.any()):
            return changes
    record_finished(ctx, state, step, changes)
    return changes


def record_finished(ctx: SimContext, state: EnvState, step: StepVars, changes: dict) -> None:
    """Add the agent-episodes that end in this step (``step.terminal`` [W, C]) to ``ctx.metrics``
    (ego slots) and ``ctx.coplayer_metrics`` (co-player slots), with the accumulators ``changes``
    (this stage's new ``ep_return`` ... ``ever_red_light``) and ``state`` as the stage saw it."""
    C, cfg = ctx.num_slots, ctx.config
    values = episode_values(
        ep_return=changes["ep_return"],
        ep_length=changes["ep_length"],
        goal_reached=changes["goal_reached"][:, :C],
        collided=changes["ever_collided"][:, :C],
        offroad=changes["ever_offroad"][:, :C],
        red_light=changes["ever_red_light"],
        extra=(torch.cat([state.trial_reached, state.trial_score], dim=-1).float()
               if cfg.trial_mode else None),
    )
    # roles (gpusim/sim/roles.py): egos feed the main log, co-players their own (ego = slot_active
    # without co-players, and terminal is only set on active slots, so nothing changes then)
    ctx.metrics.add(values, step.terminal & state.ego)
    if ctx.coplayer_metrics is not None:
        ctx.coplayer_metrics.add(values, step.terminal & ~state.ego)
