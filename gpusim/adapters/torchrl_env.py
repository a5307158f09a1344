"""TorchRL ``EnvBase`` over :class:`gpusim.env.DriveEnv` (optional ``torchrl`` extra).

Batch size ``[W, C]`` (world, policy slot); every ``TensorDict`` lives on the env's device.

Keys (shapes after the batch ``[W, C]``):

* ``observation`` ``[D]`` float32; ``active`` ``[1]`` bool: the step trains (DriveEnv's
  ``loss_mask``; in a reset tensordict: an agent occupies the slot);
* ``action`` ``[]`` int64 in ``[0, 91)`` (discrete) or ``[2]`` float32 in [-1, 1] (continuous);
* ``reward`` ``[1]`` float32; ``terminated``, ``truncated``, ``done`` ``[1]`` bool, with
  ``done = terminated | truncated``.

Resets: DriveEnv's episodes are synchronous and the step that reaches the horizon already returns
the first observation of the next episode (docs/design.md section 7). A full :meth:`reset` (no
``_reset`` entry, or one that is all True) starts a new episode everywhere. A *partial* reset
(TorchRL's rollout asks for one where ``done`` is set) never restarts a single slot: it returns
the current observation with ``done`` False: after the horizon step that is already the next
episode's first observation; a slot that finished earlier (world truncated, agent stopped or
removed) idles with ``active`` False until the common reset. In trial mode ``truncated`` marks a
trial boundary (stop bootstrapping, keep a memory policy's context).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

from gpusim.adapters.actions import env_actions
from gpusim.config import ActionSpace


class DriveTorchRLEnv(EnvBase):
    """TorchRL environment with batch size ``[W, C]`` wrapping a :class:`~gpusim.env.DriveEnv`.

    Args:
        env: the DriveEnv (its worlds, slots, device and config are used as they are).

    Attributes:
        env: the wrapped DriveEnv.
    """

    def __init__(self, env):
        W, C = int(env.num_worlds), int(env.num_slots)
        super().__init__(device=env.device, batch_size=torch.Size([W, C]))
        self.env = env
        self.continuous = env.config.action_space == ActionSpace.CONTINUOUS
        dev = env.device
        self.observation_spec = Composite(
            observation=Unbounded(shape=(W, C, int(env.obs_dim)), dtype=torch.float32, device=dev),
            active=Categorical(2, shape=(W, C, 1), dtype=torch.bool, device=dev),
            shape=(W, C), device=dev)
        if self.continuous:
            self.action_spec = Bounded(-1.0, 1.0, shape=(W, C, 2), dtype=torch.float32, device=dev)
        else:
            self.action_spec = Categorical(int(env.num_actions), shape=(W, C), dtype=torch.int64, device=dev)
        self.reward_spec = Unbounded(shape=(W, C, 1), dtype=torch.float32, device=dev)
        self.done_spec = Composite(
            done=Categorical(2, shape=(W, C, 1), dtype=torch.bool, device=dev),
            terminated=Categorical(2, shape=(W, C, 1), dtype=torch.bool, device=dev),
            truncated=Categorical(2, shape=(W, C, 1), dtype=torch.bool, device=dev),
            shape=(W, C), device=dev)
        self._obs = None
        self._t = 0  # steps into the current episode
        self._idle = torch.zeros(self.batch_size, dtype=torch.bool, device=dev)  # slots whose episode ended

    def _flags(self, terminated, truncated) -> dict:
        t = terminated.unsqueeze(-1).to(torch.bool)
        u = truncated.unsqueeze(-1).to(torch.bool)
        return {"terminated": t, "truncated": u, "done": t | u}

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        mask = tensordict.get("_reset", None) if tensordict is not None else None
        if self._obs is None or mask is None or bool(mask.all()):
            self._obs = self.env.reset()
            self._t = 0
            self._idle = ~self.env.state.slot_active
        # else: a partial reset changes nothing (synchronous episodes, see the module docstring)
        active = ~self._idle
        no = torch.zeros(self.batch_size, dtype=torch.bool, device=self.device)
        return TensorDict({"observation": self._obs.clone(), "active": active.unsqueeze(-1).clone(),
                           **self._flags(no, no)}, batch_size=self.batch_size, device=self.device)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = env_actions(tensordict.get("action"), self.device, self.continuous, "DriveTorchRLEnv.step")
        res = self.env.step(action)  # dtype kept: the env's own action checks apply
        self._obs = res.obs
        self._t += 1
        if self._t >= self.env.horizon:  # the env started the next episode of every world
            self._t = 0
            self._idle = ~self.env.state.slot_active
        else:
            self._idle = self._idle | res.terminal
        return TensorDict({"observation": res.obs.clone(), "reward": res.reward.unsqueeze(-1).to(torch.float32),
                           "active": res.loss_mask.unsqueeze(-1).clone(), **self._flags(res.terminal, res.truncation)},
                          batch_size=self.batch_size, device=self.device)

    def _set_seed(self, seed: int | None):
        if seed is not None:
            self.env.reset(seed=int(seed))  # re-seeds the env's generator; the next reset() starts afresh
            self._obs = None

    def metrics(self, kind: str = "ema") -> dict[str, float]:
        """The wrapped env's episode metrics (:meth:`gpusim.env.DriveEnv.metrics`)."""
        return self.env.metrics(kind)


__all__ = ["DriveTorchRLEnv"]
