"""Action validation of :meth:`DriveEnv.step <gpusim.env.DriveEnv.step>`, sync or async.

Type, shape, dtype and device are checked on the host (free: metadata only). Values (range, NaN)
are checked on the device, in one of two modes (``EnvConfig.check_actions``):

* ``"sync"``: one device reduction read to the host each step; a bad action raises ``ValueError``
  at once and the state is left unchanged (a host sync per step: the CPU default, and for
  debugging on a GPU).
* ``"async"``: no host read. The first bad slot (world, slot, env step counted from construction,
  1-based) is recorded in a small device tensor and raised as ``ValueError`` at the next host read
  (:meth:`DriveEnv.metrics`, :meth:`DriveEnv.check_errors`). A bad slot's action is replaced by
  the **no-op action** (zero acceleration, zero steering: the agent coasts straight on at its
  speed for that step); every other slot and the rest of the step run normally, so no state is
  corrupted. The CUDA default.

``"auto"`` means sync on the CPU, async on CUDA.

A policy whose logits are NaN or infinite has no action to give: ``policy.ActorCritic.sample``
returns :data:`NO_ACTION` (discrete) or NaN (continuous) there, which these checks refuse like any
bad action, with a message that names the policy's output as the cause.
"""

from __future__ import annotations

import torch

from gpusim.config import ActionSpace
from gpusim.kernels import dynamics

#: Discrete joint index of zero acceleration and zero steering (the no-op of an async bad action).
NOOP_DISCRETE = dynamics.ACCEL_VALUES.index(0.0) * dynamics.NUM_STEER + dynamics.STEER_VALUES.index(0.0)
#: The discrete "action" of a slot whose policy logits are not finite (``policy.ActorCritic.sample``):
#: out of range, so the check refuses it; fits int32 as well as int64.
NO_ACTION = -(2 ** 31)
#: What a non-finite policy output means, in the messages of both modes.
_NO_ACTION_WORDS = ("the policy's logits are NaN or infinite, so it drew no action (its weights or its "
                    "observations hold NaN/inf)")


def resolve_mode(mode: str, device: torch.device) -> str:
    """``"sync"`` or ``"async"`` for ``EnvConfig.check_actions`` on ``device`` (``"auto"``: sync on
    the CPU, async on CUDA)."""
    if mode == "auto":
        return "async" if device.type == "cuda" else "sync"
    return mode


class ActionCheck:
    """Validates actions for W worlds x C slots (module docstring for the modes).

    Args:
        mode: ``"sync"`` | ``"async"`` | ``"auto"``. action_space: ``ActionSpace``.
        num_worlds, num_slots: W, C. device: the env's normalised device.
    """

    def __init__(self, mode: str, action_space: ActionSpace, num_worlds: int, num_slots: int, device: torch.device):
        self.mode = resolve_mode(mode, device)
        self.discrete = action_space == ActionSpace.DISCRETE
        self.shape = (num_worlds, num_slots) if self.discrete else (num_worlds, num_slots, 2)
        self.device = device
        n = num_worlds * num_slots
        self._index = torch.arange(n, dtype=torch.int64, device=device)
        self._none = torch.full((), n, dtype=torch.int64, device=device)
        self._steps = torch.zeros((), dtype=torch.int64, device=device)
        self._record = torch.full((4,), -1, dtype=torch.int64, device=device)  # flat slot, step, value, set
        self._noop = (torch.full((), NOOP_DISCRETE, dtype=torch.int64, device=device) if self.discrete
                      else torch.zeros(2, dtype=torch.float32, device=device))

    def __call__(self, actions) -> torch.Tensor:
        """Validated actions (discrete int64 [W, C], continuous float32 [W, C, 2]).

        Raises:
            ValueError: wrong type, shape, dtype or device; in sync mode also NaN / out of range.
        """
        kind = "discrete" if self.discrete else "continuous"
        if not isinstance(actions, torch.Tensor):
            raise ValueError(f"actions must be a torch.Tensor, got {type(actions).__name__}")
        if actions.device != self.device:
            raise ValueError(f"actions are on {actions.device}, the env on {self.device}")
        if tuple(actions.shape) != self.shape:
            dims = "[W, C]" if self.discrete else "[W, C, 2]"
            raise ValueError(f"{kind} actions must have shape {dims} = {self.shape}, got {tuple(actions.shape)}")
        if self.discrete and (actions.is_floating_point() or actions.is_complex() or actions.dtype == torch.bool):
            raise ValueError(f"discrete actions must be an integer tensor, got {actions.dtype}")
        if not self.discrete and not actions.is_floating_point():
            raise ValueError(f"continuous actions must be a float tensor, got {actions.dtype}")
        a = actions.to(torch.int64) if self.discrete else actions.to(torch.float32)
        return self._check_sync(a) if self.mode == "sync" else self._check_async(a)

    def _bad(self, a: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            return (a < 0) | (a >= dynamics.NUM_ACTIONS)
        return (torch.isnan(a) | (a.abs() > 1.0)).any(-1)  # +-inf counted as out of range

    def _check_sync(self, a: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            if a.numel():  # one reduction (min and max), one host read
                lo, hi = torch.aminmax(a)
                lo, hi = torch.stack([lo, hi]).tolist() if a.is_cuda else (int(lo), int(hi))
                if lo == NO_ACTION:
                    raise ValueError(f"discrete actions: {_NO_ACTION_WORDS}")
                if lo < 0 or hi >= dynamics.NUM_ACTIONS:
                    raise ValueError(f"discrete actions must be in [0, {dynamics.NUM_ACTIONS}), got values in "
                                     f"[{lo}, {hi}]")
            return a
        flags = torch.stack([torch.isnan(a).any(), (a.abs() > 1.0).any()]).tolist()
        if flags[0]:
            raise ValueError("continuous actions contain NaN (from a policy: its outputs are NaN or infinite)")
        if flags[1]:
            raise ValueError("continuous actions must be in [-1, 1]")
        return a

    def _check_async(self, a: torch.Tensor) -> torch.Tensor:
        bad = self._bad(a)
        self._steps.add_(1)
        first = torch.where(bad.view(-1), self._index, self._none).min()
        found = first < self._none
        value = a.view(-1) if self.discrete else self._index  # continuous: no single value to show
        shown = value.gather(0, first.clamp(max=self._none - 1).view(1)).squeeze(0)  # gather: no sync
        new = torch.stack([first, self._steps, shown, found.to(torch.int64)])
        self._record = torch.where(found & (self._record[3] < 1), new, self._record)
        mask = bad if self.discrete else bad[..., None]
        return torch.where(mask, self._noop, a)

    def raise_if_error(self) -> None:
        """Raise the first recorded async error, then forget it (one small host read).

        Raises:
            ValueError: naming the world, slot and step of the first bad action since the last check.
        """
        flat, step, value, found = self._record.tolist()
        if found < 1:
            return
        self._record.fill_(-1)
        C = self.shape[1]
        w, c = divmod(flat, C)
        what = (_NO_ACTION_WORDS if self.discrete and value == NO_ACTION
                else f"out of range [0, {dynamics.NUM_ACTIONS}) (value {value})" if self.discrete
                else "NaN or outside [-1, 1] (NaN from a policy: its outputs are NaN or infinite)")
        raise ValueError(f"bad action at env step {step}, world {w}, slot {c}: {what}; that slot's action "
                         "was applied as a no-op (zero acceleration and steering). Set "
                         "EnvConfig(check_actions='sync') to raise at the step itself")
