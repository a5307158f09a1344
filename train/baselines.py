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

``make_baseline(name, seed)`` builds one by name (:data:`BASELINES`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpusim.kernels import dynamics

#: Names accepted by :func:`make_baseline` (and by ``train/evaluate.py --policy``).
BASELINES = ("steer_to_goal", "constant_speed", "expert", "random")


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
        t_left = ((cfg.scenario_length - (st.step - st.trial_start)).to(torch.float32) * cfg.dt)[:, None]
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
    raise ValueError(f"unknown baseline {name!r}; known: {', '.join(BASELINES)}")

