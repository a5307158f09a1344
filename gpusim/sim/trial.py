"""Stage ``trial``: the per-world trial clock of trial mode (docs/design.md section 9, docs/trial.md).

Kernel ``kernels.trial.trial_step``: agents reaching their goal are removed, a trial ends when all
active agents are removed or ``scenario_length`` steps have passed; the episode ends after
``k_trials`` trials. It owns ``terminal`` / ``truncation`` / ``trial_ended`` and the world/slot
done flags in trial mode. The restore of a new trial is done by stage ``restart``
(``step.restart``). Outside trial mode the stage only sets the all-False flags.
"""

from __future__ import annotations

import torch

from gpusim.kernels.trial import trial_step
from gpusim.sim.context import SimContext, StepVars, slots
from gpusim.state import EnvState


def trial(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """Sets ``step.truncation``, ``step.trial_ended`` [W, C] (and in trial mode ``step.terminal``,
    ``step.restart`` [W], ``step.info["trial_end"]`` [W]); in trial mode changes ``removed``,
    ``present``, ``trial_count``, ``trial_start``, ``world_done``, ``slot_done``, the
    ``trial_*`` flags, ``trial_clean`` (clean: goal without collision/offroad, the kernel's ``trial_score``) and
    ``trial_reached`` (goal reached in the trial, computed here)."""
    cfg, C = ctx.config, ctx.num_slots
    if not cfg.trial_mode:
        zeros = torch.zeros(ctx.num_worlds, C, dtype=torch.bool, device=ctx.device)
        step.truncation, step.trial_ended = zeros, zeros.clone()
        return {}
    tr = trial_step(
        goal_now=step.goal_now,
        collided=slots(step.in_play & step.collided, C),
        offroad=slots(step.in_play & step.offroad, C),
        removed=state.removed,
        present=state.present,
        controlled=state.controlled,
        slot_active=state.slot_active.contiguous(),
        slot_done=state.slot_done,
        world_done=state.world_done,
        truncated=step.truncated,
        episode_end=ctx.end_flags[int(step.episode_end)],
        step=state.step,
        trial_start=state.trial_start,
        trial_count=state.trial_count,
        trial_goal=state.trial_goal,
        trial_collided=state.trial_collided,
        trial_offroad=state.trial_offroad,
        trial_score=state.trial_clean,
        per_trial_timeout=cfg.scenario_length,
        k_trials=cfg.k_trials,
        backend=step.backend,
    )
    # goal reached in the trial that ended (docs/design.md section 9's trial_k_score; the kernel's
    # trial_score is the stricter clean score): a few elementwise ops, no sync
    reached = state.trial_goal | (slots(step.goal_now, C) & state.slot_active)
    # one-hot of the trial index by comparison (torch's one_hot checks its input range on the host)
    k_index = torch.arange(state.trial_reached.shape[2], device=ctx.device)
    at_k = k_index[None, :] == state.trial_count.to(torch.int64).clamp(0, cfg.k_trials - 1)[:, None]
    write = tr.trial_end[:, None, None] & at_k[:, None, :]
    trial_reached = torch.where(write, reached[:, :, None], state.trial_reached)
    step.terminal, step.truncation, step.trial_ended = tr.terminal, tr.truncation, tr.trial_ended
    step.restart = tr.restart
    step.info["trial_end"] = tr.trial_end
    return {"removed": tr.removed, "present": tr.present, "trial_count": tr.trial_count,
            "trial_start": tr.trial_start, "world_done": tr.world_done, "slot_done": tr.slot_done,
            "trial_goal": tr.trial_goal, "trial_collided": tr.trial_collided,
            "trial_offroad": tr.trial_offroad, "trial_clean": tr.trial_score, "trial_reached": trial_reached}
