"""Stage ``rewards``: the reward of the step, goals reached, contact behaviours and the episode
flags (``kernels.events``).

**The reward** (docs/design.md section 8) is computed here, per controlled slot that was in play::

    reward = reward_goal      * goal reached now (within goal_radius)
           + reward_collision * collided now
           + reward_offroad   * offroad now            (0 on invalid steps)
           + reward_red_light * crossed a red stop line now   (stage ``signals``; default 0)

With ``EnvConfig.reward_conditioning`` the reward is instead each agent's own weighted sum of
the style terms (goal, collision, offroad, red light, overspeed above its target speed, |accel|,
|yaw rate|, time; :func:`gpusim.sim.styles.conditioned_reward`, units in :mod:`gpusim.styles`),
computed in torch ops on the device after the events op, for every backend.

With goal behaviour CONTINUE the kernel's goal test (every step within ``goal_radius``) is kept to
the first arrival of the episode (``goal_now & ~goal_reached``) and the repeated goal rewards are
taken back, so an agent that drives on through its goal is paid once; nothing else changes (the
kernel acts on the goal for STOP only).

The same kernel applies STOP / REMOVE for collisions and offroad, STOP for the goal, early
truncation (``stop_truncate_fraction`` of a world's agents contact-stopped) and ``terminal``.
In trial mode the trial clock owns ``world_done``, ``slot_done`` and ``terminal`` (stage
``trial``), so this stage leaves them alone there. With random start (outside trial mode) a
world's episode also ends when its log does (:func:`gpusim.sim.random_start.log_ended`).

The op is :func:`gpusim.kernels.events.events` on the step's backend, bound once per pack
(:func:`~gpusim.sim.context.bound_op`, :func:`~gpusim.kernels.events.bind_events`).
"""

from __future__ import annotations

from gpusim.enums import GoalBehavior
from gpusim.kernels.events import bind_events
from gpusim.sim.context import SimContext, StepVars, bound_op
from gpusim.sim.random_start import log_ended
from gpusim.sim.styles import conditioned_reward
from gpusim.state import EnvState


def rewards(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """Sets ``step.reward`` [W, C], ``step.goal_now`` [W, A], ``step.truncated`` [W],
    ``step.terminal`` [W, C]; changes ``speed``, ``present``, ``stopped``, ``contact_stopped``,
    ``removed``, ``last_reward`` (and ``world_done``, ``slot_done`` outside trial mode)."""
    cfg = ctx.config
    end = ctx.end_flags[int(step.episode_end)]
    log_end = log_ended(ctx, state)  # random start: a world's episode also ends with its log (else None)
    ev = bound_op(ctx, step, "events", lambda backend, check: bind_events(backend, check, **event_scalars(cfg)))(
        state.pos, state.goal, state.speed, state.controlled, step.in_play, state.present, step.collided,
        step.offroad, step.hit, state.stopped, state.contact_stopped, state.removed, state.world_done,
        end if log_end is None else end | log_end, state.controlled, state.slot_done)  # slot_active: first C columns
    changes = _apply(ctx, state, step, ev)
    if log_end is not None:
        changes["world_done"] = changes["world_done"] | log_end  # it idles until the synchronous reset
    return changes


_LAST: list = [None, None]  # (config, event_scalars(config)) of the last call


def event_scalars(cfg) -> dict:
    """The scalar keyword arguments of ``events`` from ``cfg`` (``EnvConfig``, frozen: the dict of the
    last config is kept and returned again for the same object; do not modify it)."""
    if _LAST[0] is cfg:
        return _LAST[1]
    scalars = dict(goal_radius=cfg.goal_radius, reward_goal=cfg.reward_goal, reward_collision=cfg.reward_collision,
                   reward_offroad=cfg.reward_offroad, goal_behavior=int(cfg.goal_behavior),
                   collision_behavior=int(cfg.collision_behavior), offroad_behavior=int(cfg.offroad_behavior),
                   stop_truncate_fraction=cfg.stop_truncate_fraction)
    _LAST[:] = [cfg, scalars]
    return _LAST[1]


def _apply(ctx: SimContext, state: EnvState, step: StepVars, ev) -> dict:
    """Record ``ev``'s per-step values in ``step``; the state changes of the stage."""
    cfg = ctx.config
    reward, goal_now = ev.reward, ev.goal_now
    if cfg.goal_behavior == GoalBehavior.CONTINUE:  # the goal counts at the first arrival of the episode only
        goal_now = goal_now & ~state.goal_reached
        again = (ev.goal_now & ~goal_now)[:, : reward.shape[1]]
        reward = reward - cfg.reward_goal * again.to(reward.dtype)
    if cfg.reward_conditioning:  # per-agent weights (gpusim/sim/styles.py) replace the config's
        reward = conditioned_reward(ctx, state, step, goal_now)
    elif cfg.reward_red_light != 0.0:  # red_light_now is only set for in-play slots (gpusim/sim/signals.py)
        reward = reward + cfg.reward_red_light * state.red_light_now.to(reward.dtype)
    step.reward, step.goal_now, step.truncated, step.terminal = reward, goal_now, ev.truncated, ev.terminal
    changes = {"speed": ev.speed, "present": ev.present, "stopped": ev.stopped,
               "contact_stopped": ev.contact_stopped, "removed": ev.removed, "last_reward": reward}
    if not cfg.trial_mode:
        changes.update(world_done=ev.world_done, slot_done=ev.slot_done)
    return changes
