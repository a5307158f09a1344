"""Driving styles on the device: the per-episode draw of ``EnvState.style``, the conditioned reward
and the observation block (``EnvConfig.reward_conditioning``; the terms and ranges are in
:mod:`gpusim.styles`, the mechanism in docs/styles.md).

* **Draw** (:func:`draw_styles`, from ``gpusim.sim.episode.begin_episode``, after the roles): one
  ``[W, A, R]`` uniform draw from the env's seeded generator, ``low + u * (high - low)`` per entry;
  ego slots take ``EnvConfig.style`` when set; co-player slots take one row of
  ``EnvConfig.partner_styles`` per world (one ``[W]`` integer draw) when set. Conditioning off:
  nothing is drawn and the field stays 0, so the random stream is that of an env without styles.
  A new trial keeps the field (``trial="keep"``): a partner's style never changes inside an episode.
  The range, style and table tensors are made once per env (``SimContext.cached``), so a draw
  inside a captured CUDA graph copies nothing from the host.
* **Reward** (:func:`conditioned_reward`, called by the rewards stage): the weighted sum of the
  terms for every backend, in torch ops on the state's device (fixed shapes, no host sync, so the
  CUDA graph captures it).
* **Observation** (:func:`style_observation`, called by the observe stage): the agent's own
  entries normalised by the ranges, ``(v - low) / (high - low)`` in [0, 1] (0 for a fixed entry).
"""

from __future__ import annotations

import torch

from gpusim.kernels import dynamics
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
        fixed = ctx.cached("style_fixed", lambda c: torch.tensor(c.style, dtype=torch.float32, device=ctx.device))
        style = torch.where(ego, fixed, style)
    if cfg.partner_styles is not None:
        table = ctx.cached("style_partners",
                           lambda c: torch.tensor(c.partner_styles, dtype=torch.float32, device=ctx.device))
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
    speed = state.speed[:, :C]
    accel_abs, yaw_factor = _control_factors(ctx, step.actions)  # |accel| (m/s^2), |cos(beta) tan(steer)|
    yaw_abs = speed.abs() * yaw_factor / state.length[:, :C].clamp(min=MIN_LENGTH)
    events = torch.stack([goal_now[:, :C], step.collided[:, :C], step.offroad[:, :C], state.red_light_now],
                         dim=-1).to(torch.float32)  # [W, C, 4]
    terms = torch.stack([(speed - w[..., 8]).clamp(min=0.0), accel_abs, yaw_abs, torch.ones_like(speed)], dim=-1)
    total = (events * w[..., :4]).sum(-1) + (terms * w[..., 4:8]).sum(-1)
    return torch.where(step.in_play[:, :C], total, torch.zeros_like(speed))


def _control_factors(ctx, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(|accel|, |cos(beta) tan(steer)|)`` [W, C] float32 of the actions: a lookup in a per-action
    table for discrete actions (computed once per context), computed for continuous ones."""
    if int(ctx.config.action_space) == 0:
        def make(cfg):
            k = torch.arange(dynamics.NUM_ACTIONS, device=ctx.device)
            a, d = decode_actions(k, 0)
            tan_d = torch.tan(d)
            return torch.stack([a.abs(), (torch.cos(torch.atan(0.5 * tan_d)) * tan_d).abs()], dim=-1)
        f = ctx.cached("style_control_factors", make)[actions.clamp(0, dynamics.NUM_ACTIONS - 1)]
        return f[..., 0], f[..., 1]
    a, d = decode_actions(actions, int(ctx.config.action_space))
    tan_d = torch.tan(d)
    return a.abs(), (torch.cos(torch.atan(0.5 * tan_d)) * tan_d).abs()


def style_observation(ctx, state, active: torch.Tensor) -> torch.Tensor:
    """[W, C, R] float32: each slot's own style normalised to [0, 1] by the ranges, ``(v - low) /
    (high - low)`` (0 for fixed entries), where ``active`` [W, C] bool (the observed slots), else 0."""
    C = ctx.num_slots
    lo, inv_span = ctx.cached("style_norm", lambda cfg: _norm_tensors(ctx))
    norm = (state.style[:, :C] - lo) * inv_span
    return torch.where(active[..., None], norm, torch.zeros_like(norm))


def _norm_tensors(ctx) -> tuple[torch.Tensor, torch.Tensor]:
    """``(low, 1 / (high - low))`` [R] float32, 0 where ``low == high``."""
    lo, hi = _range_tensors(ctx)
    span = hi - lo
    return lo, torch.where(span > 0, 1.0 / torch.where(span > 0, span, torch.ones_like(span)), torch.zeros_like(span))
