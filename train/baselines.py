"""Reference drivers for evaluation: ``act(env) -> actions`` callables over the native ``[W, C]`` API.

Each baseline reads the env's public state (``env.state``: device tensors) and returns one action
per policy slot — discrete ``[W, C]`` int64 joint indices, or continuous ``[W, C, 2]`` float32 in
``[-1, 1]`` when ``env.config.action_space`` is continuous — computed with batched torch ops on the
env's device and no host read. Actions of empty or out-of-play slots are valid but ignored by the
env.

* ``steer_to_goal`` (:class:`SteerToGoal`): a hand-tuned controller that steers toward the goal
  (pure pursuit) at the speed needed to arrive in the time left, slowing down when the goal is
  close or behind.
* ``constant_speed``: zero acceleration, zero steering — the agent keeps its logged initial speed
  and heading (straight ahead; the kinematic bicycle keeps the speed exactly with 0 m/s^2).
* ``expert``: ``env.expert_actions()`` (inverse dynamics that track the log).
* ``random``: uniform over the action space, from a generator seeded by ``seed``.
* ``partner_ceiling`` / ``partner_floor``: the scripted references of the partner task
  (``gpusim/sim/partner_task.py``, docs/trial.md): :class:`PartnerCeiling` is told the partner's
  type and plays the best response (log tracking against a yielder; against a non-yielder, log
  tracking on a delayed clock that arrives at the conflict place after the partner has crossed and
  catches up afterwards); :func:`partner_floor` ignores the type (log tracking, like ``expert``).

``make_baseline(name, seed)`` builds one by name (:data:`BASELINES`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpusim.kernels import dynamics
from gpusim.kernels.clocks import log_index, trial_time

#: The partner task's references: they need an env with the partner task (``--partner-task crossing``).
PARTNER_BASELINES = ("partner_ceiling", "partner_floor")
#: Names accepted by :func:`make_baseline` (and by ``train/evaluate.py --policy``).
BASELINES = ("steer_to_goal", "constant_speed", "expert", "random") + PARTNER_BASELINES


def _action_space(env) -> int:
    return int(env.config.action_space)


def _slots(env, name: str) -> torch.Tensor:
    """``env.state.<name>`` restricted to the C policy slots (``[W, C, ...]``)."""
    return getattr(env.state, name)[:, : env.num_slots]


@dataclass(frozen=True)
class SteerToGoal:
    """Steer toward the goal at the speed needed to arrive in time (a tuned heuristic).

    Per policy slot, with the goal at distance ``d`` and bearing ``alpha`` in the agent's frame
    (``alpha = 0`` straight ahead) and ``t`` seconds left in the trial/episode
    (``(scenario_length - (step - trial_start)) * dt``):

    * steering: pure pursuit of the goal — the arc through the goal has curvature
      ``kappa = 2 sin(alpha) / d``, and the bicycle follows curvature ``tan(delta) / L`` (box
      length ``L`` as wheelbase, slip ignored), so ``delta = atan(steer_gain * kappa * L)``, clipped
      to +-1 rad and rounded to the nearest grid value by ``dynamics.encode_actions``; with the goal
      behind (``|alpha| > pi / 2``) full lock toward the goal's side (left when straight behind);
    * target speed: ``v* = clip(d / max(t * time_fraction, dt), min_speed, max_speed)``; capped at
      ``turn_speed`` when ``|alpha| > turn_angle`` (goal to the side or behind) and at
      ``near_speed`` when ``d < near_distance`` (so the agent does not circle its goal);
    * acceleration ``clip(accel_gain * (v* - v), -4, 4)`` m/s^2, rounded to the grid.

    Defaults were tuned by small grid searches on ``data/womd_sample`` with the training env
    settings (docs/evaluation.md: goal 0.829 there, 0.681 on the 72 shared WOMD scenarios).

    Attributes (units: m, s, rad, m/s, 1/s): time_fraction, min_speed, max_speed, turn_angle,
    turn_speed, near_distance, near_speed, steer_gain, accel_gain.
    """

    time_fraction: float = 0.7
    min_speed: float = 2.0
    max_speed: float = 20.0
    turn_angle: float = 1.0
    turn_speed: float = 3.0
    near_distance: float = 6.0
    near_speed: float = 4.0
    steer_gain: float = 2.0
    accel_gain: float = 2.0

    def controls(self, env) -> tuple[torch.Tensor, torch.Tensor]:
        """``(accel [W, C] m/s^2, steer [W, C] rad)`` float32 before grid rounding."""
        cfg = env.config
        pos, goal = _slots(env, "pos"), _slots(env, "goal")
        heading, speed, length = _slots(env, "heading"), _slots(env, "speed"), _slots(env, "length")
        st = env.state
        dx, dy = (goal - pos).unbind(-1)
        c, s = torch.cos(heading), torch.sin(heading)
        fwd, left = c * dx + s * dy, -s * dx + c * dy
        dist = torch.sqrt(dx * dx + dy * dy).clamp_min(1e-3)
        alpha = torch.atan2(left, fwd)
        kappa = 2.0 * torch.sin(alpha) / dist
        steer = torch.atan(self.steer_gain * kappa * length.clamp_min(dynamics.MIN_LENGTH))
        steer = steer.clamp(-dynamics.MAX_STEER, dynamics.MAX_STEER)
        # goal behind: full lock toward its side (left when exactly behind, where sin(alpha) = 0)
        lock = torch.where(left < 0, -dynamics.MAX_STEER, dynamics.MAX_STEER)
        steer = torch.where(fwd < 0, lock, steer)
        t_left = ((cfg.scenario_length - trial_time(st.step, st.trial_start)).to(torch.float32) * cfg.dt)[:, None]
        v_target = (dist / (t_left * self.time_fraction).clamp_min(cfg.dt)).clamp(self.min_speed, self.max_speed)
        v_target = torch.where(alpha.abs() > self.turn_angle, v_target.clamp_max(self.turn_speed), v_target)
        v_target = torch.where(dist < self.near_distance, v_target.clamp_max(self.near_speed), v_target)
        accel = (self.accel_gain * (v_target - speed)).clamp(-dynamics.MAX_ACCEL, dynamics.MAX_ACCEL)
        return accel, steer

    def __call__(self, env) -> torch.Tensor:
        """Actions ``[W, C]`` int64 (discrete) or ``[W, C, 2]`` float32 (continuous)."""
        accel, steer = self.controls(env)
        return dynamics.encode_actions(accel.contiguous(), steer.contiguous(), _action_space(env))


def constant_speed(env) -> torch.Tensor:
    """Zero acceleration and zero steering for every slot: keep the logged initial speed, straight ahead.

    Returns:
        discrete ``[W, C]`` int64 (index of (0 m/s^2, 0 rad)); continuous ``[W, C, 2]`` zeros.
    """
    zeros = torch.zeros(env.num_worlds, env.num_slots, device=env.device)
    return dynamics.encode_actions(zeros, zeros, _action_space(env))


def expert(env) -> torch.Tensor:
    """The env's inverse-dynamics actions that track the log (``env.expert_actions()``)."""
    return env.expert_actions()


def partner_floor(env) -> torch.Tensor:
    """The partner task's floor: log tracking whatever the partner's type (``env.expert_actions()``:
    the best response to a yielder, a collision with a non-yielder)."""
    return env.expert_actions()


@dataclass(frozen=True)
class PartnerCeiling:
    """The partner task's ceiling: told each world's partner type (``env.state.partner_type``),
    it plays the best response (``gpusim/sim/partner_task.py``).

    Against a yielder, or without a partner: log tracking (``env.expert_actions()``). Against a
    non-yielder: the same inverse dynamics toward the ego's logged pose on a delayed log clock,
    ``u = x - lag(x)`` at log step ``x``, interpolated linearly between log steps (speed times the
    clock's rate). ``lag`` rises linearly from 0 at ``init_steps`` to ``delta`` at ``lead_steps``
    before the logged arrival ``t_c`` at the conflict place, stays ``delta`` until ``pass_steps``
    after the delayed arrival, then falls linearly to 0 at ``catchup_end_steps`` before the trial's
    last log step (at least 10 steps later). ``delta`` (s) is the time the non-yielder needs to
    clear the ego's path, ``(PARTNER_LENGTH + ego width) / 2 / APPROACH_SPEED``, plus the time the
    ego's own half length and the partner's half width take at the logged speed ``v_c`` there,
    ``(ego length + PARTNER_WIDTH) / 2 / v_c``, plus ``margin`` (unscaled boxes: a safety margin
    over the collision boxes).

    Attributes: margin (s), lead_steps, pass_steps, catchup_end_steps (log steps).
    """

    margin: float = 0.3
    lead_steps: int = 5
    pass_steps: int = 10
    catchup_end_steps: int = 3

    def __call__(self, env) -> torch.Tensor:
        """Actions ``[W, C]`` int64 (discrete) or ``[W, C, 2]`` float32 (continuous)."""
        from gpusim.config import DT
        from gpusim.sim import partner_task as pt
        from gpusim.sim.motion import model_for
        from gpusim.sim.random_start import log_origin

        ctx, st, cfg, p = env.sim, env.state, env.config, env.sim.pack
        base = env.expert_actions()
        if cfg.partner_task == "none":
            return base
        has, t_c = pt.conflict_log_step(ctx, st)
        s = st.scenario
        T = p.traj_pos.shape[2]
        x = (log_index(cfg.init_steps, st.step, log_origin(ctx, st)) + 1).to(torch.float32)  # the next log step
        t_c = t_c.to(torch.float32)
        v_c = torch.linalg.vector_norm(p.traj_vel[s, 0, t_c.to(torch.int64)], dim=-1).clamp_min(pt.MIN_SPEED)
        delta = (self.margin + (pt.PARTNER_LENGTH + st.width[:, 0]) / 2 / pt.APPROACH_SPEED
                 + (st.length[:, 0] + pt.PARTNER_WIDTH) / 2 / v_c) / DT  # [W] log steps
        x_b = t_c - self.lead_steps
        x_c = t_c + delta + self.pass_steps
        x_d = torch.maximum(x_c + 10, torch.full_like(x_c, cfg.init_steps + cfg.scenario_length - 1
                                                        - self.catchup_end_steps))
        ramp_in = ((x - cfg.init_steps) / (x_b - cfg.init_steps)).clamp(0.0, 1.0)
        ramp_out = (1.0 - (x - x_c) / (x_d - x_c)).clamp(0.0, 1.0)
        lag = delta * torch.where(x <= x_c, ramp_in, ramp_out)
        one = torch.ones_like(x)  # the clock's rate du/dx: slower on the way in, faster while catching up
        rate = torch.where(x <= x_b, 1.0 - delta / (x_b - cfg.init_steps),
                           torch.where((x > x_c) & (x <= x_d), 1.0 + delta / (x_d - x_c), one)).clamp_min(0.0)
        u = (x - lag).clamp(0.0, T - 1.0)
        i0 = u.floor().to(torch.int64)
        i1 = (i0 + 1).clamp(max=T - 1)
        w = u - i0.to(torch.float32)
        pos = p.traj_pos[s, 0, i0] * (1 - w)[:, None] + p.traj_pos[s, 0, i1] * w[:, None]
        h0, h1 = p.traj_heading[s, 0, i0], p.traj_heading[s, 0, i1]
        heading = h0 + torch.atan2(torch.sin(h1 - h0), torch.cos(h1 - h0)) * w
        vel = p.traj_vel[s, 0, i0] * (1 - w)[:, None] + p.traj_vel[s, 0, i1] * w[:, None]
        speed = torch.linalg.vector_norm(vel, dim=-1) * rate
        valid = p.traj_valid[s, 0, i0] & p.traj_valid[s, 0, i1] & (x < T)
        accel, steer = model_for(ctx).inverse(
            pos=st.pos[:, :1].contiguous(), heading=st.heading[:, :1].contiguous(),
            speed=st.speed[:, :1].contiguous(), length=st.length[:, :1].contiguous(),
            target_pos=pos[:, None].contiguous(), target_heading=heading[:, None].contiguous(),
            target_speed=speed[:, None].contiguous(), target_valid=valid[:, None].contiguous(), dt=cfg.dt)
        warped = dynamics.encode_actions(accel, steer, _action_space(env))
        ny = (has & (st.partner_type == 1))[:, None]
        return torch.where(ny if warped.dim() == 2 else ny[..., None], warped, base)


class RandomActions:
    """Uniformly random actions from a seeded generator on the env's device.

    Args:
        seed: generator seed (the generator is created on the first call, on ``env.device``).

    Calling it returns discrete ``[W, C]`` int64 uniform over ``[0, 91)`` or continuous
    ``[W, C, 2]`` float32 uniform over ``[-1, 1)``.
    """

    def __init__(self, seed: int = 0):
        self.seed = int(seed)
        self._gen = None

    def __call__(self, env) -> torch.Tensor:
        if self._gen is None or self._gen.device != torch.device(env.device):
            self._gen = torch.Generator(device=env.device)
            self._gen.manual_seed(self.seed)
        shape = (env.num_worlds, env.num_slots)
        if _action_space(env) == 0:
            return torch.randint(dynamics.NUM_ACTIONS, shape, generator=self._gen, device=env.device)
        return torch.rand(*shape, 2, generator=self._gen, device=env.device) * 2.0 - 1.0


def make_baseline(name: str, seed: int = 0):
    """The baseline called ``name`` (one of :data:`BASELINES`) as an ``act(env) -> actions`` callable.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    if name == "steer_to_goal":
        return SteerToGoal()
    if name == "constant_speed":
        return constant_speed
    if name == "expert":
        return expert
    if name == "random":
        return RandomActions(seed)
    if name == "partner_ceiling":
        return PartnerCeiling()
    if name == "partner_floor":
        return partner_floor
    raise ValueError(f"unknown baseline {name!r}; known: {', '.join(BASELINES)}")

