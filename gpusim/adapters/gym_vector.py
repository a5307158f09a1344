"""``gymnasium.vector.VectorEnv`` over :class:`gpusim.env.DriveEnv` (optional ``gymnasium`` extra).

Sub-environment ``i = w * C + c`` is policy slot ``c`` of world ``w`` (``num_envs = W * C``).
Tensors stay torch tensors on the env's device, in and out (no NumPy copies): observations
``[N, D]`` float32, rewards ``[N]`` float32, terminations / truncations ``[N]`` bool. The spaces
describe one slot (``single_observation_space``: ``Box(-inf, inf, (D,))``;
``single_action_space``: ``Discrete(91)`` or ``Box(-1, 1, (2,))``) and their batched versions;
``action_space.sample()`` gives NumPy, which :meth:`step` also accepts.

Autoreset (``metadata["autoreset_mode"] = AutoresetMode.SAME_STEP``): DriveEnv's episodes are
synchronous. The step that reaches the horizon ends the episode of every active slot
(``terminations``) and returns the first observation of the next episode of every world in the
same call; the last observation of the ended episode is not kept (PPO does not bootstrap from it).
Slots whose episode ended earlier (a world truncated by ``stop_truncate_fraction``, agents stopped
or removed) keep stepping as idle slots until then: their steps have ``info["active"] = False``
and reward 0. Empty slots (fewer controlled agents than ``C``) are never active. In trial mode
``truncations`` marks a trial boundary: stop bootstrapping there, but the slot's episode (and a
memory policy's context) goes on until ``terminations``.

``info`` (torch tensors ``[N]``): ``active`` (the step trains: DriveEnv's ``loss_mask``),
``slot_active`` (an agent occupies the slot), ``removed``, ``stopped``, ``goal_reached``.
"""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from gpusim.adapters.actions import env_actions
from gpusim.config import ActionSpace


class DriveVectorEnv(VectorEnv):
    """Gymnasium vector env with the agents of a :class:`~gpusim.env.DriveEnv` flattened.

    Args:
        env: the DriveEnv (its worlds, slots, device and config are used as they are).

    Attributes:
        env: the wrapped DriveEnv. num_envs: ``W * C``. device: the env's torch device.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(self, env):
        self.env = env
        self.num_envs = int(env.num_worlds) * int(env.num_slots)
        self.device = env.device
        self.continuous = env.config.action_space == ActionSpace.CONTINUOUS
        self.single_observation_space = spaces.Box(-np.inf, np.inf, (int(env.obs_dim),), np.float32)
        if self.continuous:
            self.single_action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        else:
            self.single_action_space = spaces.Discrete(int(env.num_actions))
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Start a new episode in every world.

        Args:
            seed: re-seeds the env (same seed => same scenarios). options: ``{"scenarios": [W]
                int tensor}`` pins the scenario of each world.

        Returns:
            ``(obs [N, D] float32, info)``; info as in :meth:`step` with no step taken yet.
        """
        scen = (options or {}).get("scenarios")
        obs = self.env.reset(seed=seed, scenarios=scen) if scen is not None else self.env.reset(seed=seed)
        N = self.num_envs
        active = self.env.state.slot_active.reshape(N).clone() if hasattr(self.env, "state") else torch.ones(
            N, dtype=torch.bool, device=self.device)
        zeros = torch.zeros(N, dtype=torch.bool, device=self.device)
        info = {"active": active, "slot_active": active.clone(), "removed": zeros, "stopped": zeros.clone(),
                "goal_reached": zeros.clone()}
        return obs.reshape(N, -1).clone(), info

    def step(self, actions):
        """One env step of every slot.

        Args:
            actions: ``[N]`` integer (discrete) or ``[N, 2]`` float in [-1, 1] (continuous), a torch
                tensor (any device; moved to the env's) or anything ``torch.as_tensor`` takes. The
                dtype is kept, so the env's own checks apply (:mod:`gpusim.adapters.actions`).

        Returns:
            ``(obs [N, D], reward [N], terminated [N], truncated [N], info)``, torch tensors on the
            env's device (see the module docstring for their meaning).

        Raises:
            ValueError: wrong action shape, dtype (float for a discrete env, integer for a
                continuous one) or values (NaN named; from DriveEnv; the state is untouched).
        """
        W, C = self.env.num_worlds, self.env.num_slots
        a = env_actions(actions, self.device, self.continuous, "DriveVectorEnv.step")
        expect = (self.num_envs, 2) if self.continuous else (self.num_envs,)
        if tuple(a.shape) != expect:
            raise ValueError(f"DriveVectorEnv.step: actions must have shape {expect}, got {tuple(a.shape)}")
        res = self.env.step(a.reshape(W, C, *a.shape[1:]))
        N = self.num_envs
        goal = (res.info or {}).get("goal_reached")
        info = {"active": res.loss_mask.reshape(N), "slot_active": res.slot_active.reshape(N),
                "removed": res.removed.reshape(N), "stopped": res.stopped.reshape(N),
                "goal_reached": goal.reshape(N) if goal is not None else torch.zeros_like(res.loss_mask.reshape(N))}
        return (res.obs.reshape(N, -1).clone(), res.reward.reshape(N).clone(), res.terminal.reshape(N).clone(),
                res.truncation.reshape(N).clone(), info)

    def metrics(self, kind: str = "ema") -> dict[str, float]:
        """The wrapped env's episode metrics (:meth:`gpusim.env.DriveEnv.metrics`)."""
        return self.env.metrics(kind)

    def close_extras(self, **kwargs):
        """Nothing to release (the env is plain tensors)."""


__all__ = ["DriveVectorEnv"]
