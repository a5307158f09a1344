"""Driving styles on the device: the per-episode draw of ``EnvState.style``, the conditioned reward
and the observation block (``EnvConfig.reward_conditioning``; the terms and ranges are in
:mod:`gpusim.styles`, the mechanism in docs/styles.md).

* **Draw** (:func:`draw_styles`, from ``gpusim.sim.episode.begin_episode``, after the roles): one
  ``[W, A, R]`` uniform draw from the env's seeded generator, ``low + u * (high - low)`` per entry;
  ego slots take ``EnvConfig.style`` when set; co-player slots take one row of
  ``EnvConfig.partner_styles`` per world (one ``[W]`` integer draw) when set. Conditioning off:
  nothing is drawn and the field stays 0, so the random stream is that of an env without styles.
  A new trial keeps the field (``trial="keep"``): a partner's style never changes inside an episode.
* **Reward** (:func:`conditioned_reward`, called by the rewards stage): the weighted sum of the
  terms for every backend, in torch ops on the state's device (fixed shapes, no host sync, so the
  CUDA graph captures it).
* **Observation** (:func:`style_observation`, called by the observe stage): the agent's own
  entries normalised by the ranges, ``(v - low) / (high - low)`` in [0, 1] (0 for a fixed entry).
"""

from __future__ import annotations

import torch

from gpusim.kernels.dynamics import MIN_LENGTH, decode_actions
from gpusim.styles import NUM_STYLE_TERMS


def _range_tensors(ctx) -> tuple[torch.Tensor, torch.Tensor]:
    """``(low, high)`` [R] float32 on the env's device (cached per context)."""
    def make(cfg):
        r = torch.tensor(cfg.style_ranges, dtype=torch.float32, device=ctx.device)
        return r[:, 0].contiguous(), r[:, 1].contiguous()
    return ctx.cached("style_ranges", make)


def draw_styles(ctx, state):
    """``state`` (a new episode's state, roles assigned) with ``style`` [W, A, R] drawn (module
    docstring); unchanged when conditioning is off."""
    cfg = ctx.config
    if not cfg.reward_conditioning:
        return state
    W, A = state.pos.shape[:2]
    C = state.ego.shape[1]
    lo, hi = _range_tensors(ctx)
    u = torch.rand((W, A, NUM_STYLE_TERMS), generator=ctx.generator, device=ctx.device)
    style = lo + u * (hi - lo)
    pad = torch.zeros(W, A - C, dtype=torch.bool, device=ctx.device)
    if cfg.style is not None:
        ego = torch.cat([state.ego, pad], dim=1)[..., None]
        fixed = torch.tensor(cfg.style, dtype=torch.float32, device=ctx.device)
        style = torch.where(ego, fixed, style)
    if cfg.partner_styles is not None:
        table = torch.tensor(cfg.partner_styles, dtype=torch.float32, device=ctx.device)
        row = torch.randint(table.shape[0], (W,), generator=ctx.generator, device=ctx.device)
        co = torch.cat([state.slot_active & ~state.ego, pad], dim=1)[..., None]
        style = torch.where(co, table[row][:, None, :], style)
    return state.replace(style=style.contiguous())


def conditioned_reward(ctx, state, step, goal_now: torch.Tensor) -> torch.Tensor:
    """[W, C] float32 reward of the step with per-agent weights (``EnvState.style``)::

        r = w_goal * goal_now + w_collision * collided + w_offroad * offroad
          + w_red_light * red_light_now + w_overspeed * max(0, speed - target_speed)
          + w_accel * |accel| + w_yaw_rate * |yaw rate| + w_time

    for slots in play this step, 0 otherwise (units in :mod:`gpusim.styles`). ``speed`` is the
    speed after the motion (m/s), ``accel`` the commanded acceleration of the action (m/s^2) and the
    yaw rate that of the kinematic bicycle, ``v * cos(beta) * tan(steer) / L`` with ``beta =
    atan(tan(steer) / 2)`` and ``L`` the box length (gpusim/kernels/dynamics.py). Args: ``state``
    as the rewards stage receives it (after motion, contacts, signals), ``step`` the step's
    :class:`~gpusim.sim.context.StepVars`, ``goal_now`` [W, A] bool of the events op.
    """
    C = ctx.num_slots
    w = state.style[:, :C]  # [W, C, R]
    in_play = step.in_play[:, :C]
    f = torch.float32
    accel, steer = decode_actions(step.actions, int(ctx.config.action_space))
    speed = state.speed[:, :C]
    tan_d = torch.tan(steer)
    yaw_rate = speed * torch.cos(torch.atan(0.5 * tan_d)) * tan_d / state.length[:, :C].clamp(min=MIN_LENGTH)
    terms = torch.stack([
        goal_now[:, :C].to(f),
        step.collided[:, :C].to(f),
        step.offroad[:, :C].to(f),
        state.red_light_now.to(f),
        (speed - w[..., 8]).clamp(min=0.0),
        accel.abs(),
        yaw_rate.abs(),
        torch.ones_like(speed),
    ], dim=-1)  # [W, C, 8]
    return torch.where(in_play, (terms * w[..., :8]).sum(-1), torch.zeros_like(speed))


def style_observation(ctx, state) -> torch.Tensor:
    """[W, C, R] float32: each slot's own style normalised to [0, 1] by the ranges (0 for fixed
    entries and for empty slots)."""
    C = ctx.num_slots
    lo, hi = _range_tensors(ctx)
    span = hi - lo
    norm = torch.where(span > 0, (state.style[:, :C] - lo) / torch.where(span > 0, span, torch.ones_like(span)),
                       torch.zeros_like(span))
    return torch.where(state.slot_active[..., None], norm, torch.zeros_like(norm))
