"""`EnvState`: the whole simulator state as device tensors (DESIGN.md section 4).

Axes: W worlds, A = ``max_agents`` agent slots, C = ``max_controlled`` policy slots. Policy slot
``c`` is agent slot ``c`` (controlled agents come first in a :class:`~gpusim.data.ScenarioPack`),
so every ``[W, C]`` tensor lines up with the first C columns of the ``[W, A]`` tensors.

Units: metres, radians (heading counter-clockwise from +x), metres per second. Positions are in the
scenario-centred frame of the pack.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

#: Field name -> (shape kind, dtype). Shape kinds: "W" = [W], "WA" = [W, A], "WA2" = [W, A, 2],
#: "WC" = [W, C], "WCK" = [W, C, K] (K = ``EnvConfig.k_trials`` trial slots).
STATE_FIELDS: dict[str, tuple[str, torch.dtype]] = {
    # ---- world tensors [W]
    "scenario": ("W", torch.int64),  # scenario index into the pack
    "step": ("W", torch.int32),  # steps taken in the current episode (0 right after a reset)
    "trial_count": ("W", torch.int32),  # trials completed in this episode (trial mode; else 0)
    "trial_start": ("W", torch.int32),  # `step` at which the current trial started (else 0)
    "world_done": ("W", torch.bool),  # episode over early (STOP truncation; trial mode: all trials done); idles until reset
    # ---- agent tensors [W, A]
    "pos": ("WA2", torch.float32),  # centre position (m)
    "heading": ("WA", torch.float32),  # heading (rad)
    "speed": ("WA", torch.float32),  # signed longitudinal speed (m/s)
    "length": ("WA", torch.float32),  # logged box length (m), 0 for padding
    "width": ("WA", torch.float32),  # logged box width (m), 0 for padding
    "goal": ("WA2", torch.float32),  # goal position (m)
    "agent_type": ("WA", torch.int8),  # ObjectType code, -1 for padding
    "controlled": ("WA", torch.bool),  # slot is a controlled agent (a < num_controlled[scenario])
    "present": ("WA", torch.bool),  # in the scene: takes part in contacts and observations
    "stopped": ("WA", torch.bool),  # stopped by a contact or by the goal (STOP behaviours)
    "contact_stopped": ("WA", torch.bool),  # stopped by a collision / offroad (counts for truncation)
    "removed": ("WA", torch.bool),  # removed from the scene (REMOVE behaviour)
    "goal_reached": ("WA", torch.bool),  # reached a goal at least once this episode
    "ever_collided": ("WA", torch.bool),  # collided at a valid step this episode
    "ever_offroad": ("WA", torch.bool),  # went offroad at a valid step this episode
    "collided_now": ("WA", torch.bool),  # in collision after the last step
    "offroad_now": ("WA", torch.bool),  # offroad after the last step
    # ---- policy-slot tensors [W, C]
    "slot_active": ("WC", torch.bool),  # a controlled agent occupies the slot
    "slot_done": ("WC", torch.bool),  # terminal already emitted for the slot in this episode
    "ep_return": ("WC", torch.float32),  # sum of rewards this episode
    "ep_length": ("WC", torch.int32),  # valid (loss_mask = 1) steps this episode
    "last_reward": ("WC", torch.float32),  # reward of the last step (observation feature)
    # ---- trial mode (gpusim/kernels/trial.py; all False outside trial mode)
    "trial_goal": ("WC", torch.bool),  # reached its goal in the current trial
    "trial_collided": ("WC", torch.bool),  # collided at a valid step of the current trial
    "trial_offroad": ("WC", torch.bool),  # offroad at a valid step of the current trial
    "trial_score": ("WCK", torch.bool),  # [w, c, k]: trial k finished with goal, no collision/offroad
}


@dataclass
class EnvState:
    """Device tensors of a :class:`~gpusim.env.DriveEnv` (fields and meaning in ``STATE_FIELDS``).

    World tensors are ``[W]``, agent tensors ``[W, A]`` (``pos`` and ``goal`` ``[W, A, 2]``),
    policy-slot tensors ``[W, C]``, ``trial_score`` ``[W, C, K]``. All tensors live on one device.
    Trial fields (``trial_count``, ``trial_start``, ``trial_goal``, ``trial_collided``,
    ``trial_offroad``, ``trial_score``) stay 0 / False outside trial mode; in trial mode
    ``world_done`` is the world's "episode over" flag (all trials done).
    """

    scenario: torch.Tensor
    step: torch.Tensor
    trial_count: torch.Tensor
    trial_start: torch.Tensor
    world_done: torch.Tensor
    pos: torch.Tensor
    heading: torch.Tensor
    speed: torch.Tensor
    length: torch.Tensor
    width: torch.Tensor
    goal: torch.Tensor
    agent_type: torch.Tensor
    controlled: torch.Tensor
    present: torch.Tensor
    stopped: torch.Tensor
    contact_stopped: torch.Tensor
    removed: torch.Tensor
    goal_reached: torch.Tensor
    ever_collided: torch.Tensor
    ever_offroad: torch.Tensor
    collided_now: torch.Tensor
    offroad_now: torch.Tensor
    slot_active: torch.Tensor
    slot_done: torch.Tensor
    ep_return: torch.Tensor
    ep_length: torch.Tensor
    last_reward: torch.Tensor
    trial_goal: torch.Tensor
    trial_collided: torch.Tensor
    trial_offroad: torch.Tensor
    trial_score: torch.Tensor

    @property
    def num_worlds(self) -> int:
        """W."""
        return self.scenario.shape[0]

    @property
    def num_agents(self) -> int:
        """A."""
        return self.present.shape[1]

    @property
    def num_slots(self) -> int:
        """C."""
        return self.slot_active.shape[1]

    @property
    def device(self) -> torch.device:
        return self.pos.device

    def tensors(self) -> dict[str, torch.Tensor]:
        """All fields by name (same order as ``STATE_FIELDS``)."""
        return {name: getattr(self, name) for name in STATE_FIELDS}

    def clone(self) -> "EnvState":
        """A deep copy (every tensor cloned, same device)."""
        return EnvState(**{k: v.clone() for k, v in self.tensors().items()})

    def copy_(self, other: "EnvState") -> None:
        """Overwrite every tensor in place with ``other``'s values (shapes must match)."""
        for name in STATE_FIELDS:
            getattr(self, name).copy_(getattr(other, name))

    def where(self, mask_w: torch.Tensor, other: "EnvState", keep: tuple[str, ...] = ()) -> "EnvState":
        """A new state: worlds where ``mask_w`` ([W] bool) is True take ``other``'s values, except
        the fields named in ``keep`` (always this state's). Inputs are not modified; fields that
        neither changes are shared, not copied."""
        out = {}
        for name in STATE_FIELDS:
            dst = getattr(self, name)
            if name in keep:
                out[name] = dst
                continue
            src = getattr(other, name)
            m = mask_w.view(-1, *([1] * (dst.dim() - 1)))
            out[name] = torch.where(m, src, dst)
        return EnvState(**out)

    def where_(self, mask_w: torch.Tensor, other: "EnvState") -> None:
        """In place: worlds where ``mask_w`` ([W] bool) is True take ``other``'s values."""
        for name in STATE_FIELDS:
            dst = getattr(self, name)
            src = getattr(other, name)
            m = mask_w.view(-1, *([1] * (dst.dim() - 1)))
            dst.copy_(torch.where(m, src, dst))

    def equal(self, other: "EnvState") -> bool:
        """True if every tensor is bit-identical (NaN-aware) to ``other``'s. Reads to host."""
        for name in STATE_FIELDS:
            a, b = getattr(self, name), getattr(other, name)
            if a.shape != b.shape or a.dtype != b.dtype:
                return False
            if a.is_floating_point():
                if not torch.equal(a.view(torch.int32), b.view(torch.int32)):
                    return False
            elif not torch.equal(a, b):
                return False
        return True

    def validate(self) -> None:
        """Check shapes, dtypes, one device, finite floats and flag consistency.

        Reads tensors to the host: for tests and debugging, not for per-step code.

        Raises:
            ValueError: naming the first bad field and what is wrong with it.
        """
        W = self.scenario.shape[0] if isinstance(self.scenario, torch.Tensor) else -1
        A = self.present.shape[1] if isinstance(self.present, torch.Tensor) and self.present.dim() == 2 else -1
        C = self.slot_active.shape[1] if isinstance(self.slot_active, torch.Tensor) and self.slot_active.dim() == 2 else -1
        if W < 0 or A < 0 or C < 0:
            raise ValueError("EnvState: scenario must be [W], present [W, A] and slot_active [W, C] tensors")
        if C > A:
            raise ValueError(f"EnvState: {C} policy slots exceed {A} agent slots")
        K = self.trial_score.shape[2] if isinstance(self.trial_score, torch.Tensor) and self.trial_score.dim() == 3 else -1
        if K < 1:
            raise ValueError("EnvState.trial_score must be a [W, C, K] tensor with K >= 1")
        shapes = {"W": (W,), "WA": (W, A), "WA2": (W, A, 2), "WC": (W, C), "WCK": (W, C, K)}
        device = self.pos.device if isinstance(self.pos, torch.Tensor) else None
        for name, (kind, dtype) in STATE_FIELDS.items():
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"EnvState.{name} is not a tensor")
            if t.dtype != dtype:
                raise ValueError(f"EnvState.{name} has dtype {t.dtype}, expected {dtype}")
            if tuple(t.shape) != shapes[kind]:
                raise ValueError(f"EnvState.{name} has shape {tuple(t.shape)}, expected {shapes[kind]}")
            if t.device != device:
                raise ValueError(f"EnvState.{name} is on {t.device}, expected {device}")
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise ValueError(f"EnvState.{name} has non-finite values")
        if bool((self.present & self.removed).any()):
            raise ValueError("EnvState: an agent is both present and removed")
        if bool((self.contact_stopped & ~self.stopped).any()):
            raise ValueError("EnvState.contact_stopped is set for an agent that is not stopped")
        if bool((self.slot_active & ~self.controlled[:, :C]).any()):
            raise ValueError("EnvState.slot_active is set for a slot that holds no controlled agent")
        if bool((self.trial_start > self.step).any()) or bool((self.trial_count < 0).any()):
            raise ValueError("EnvState: trial_start must be <= step and trial_count >= 0")
        if bool((self.step < 0).any()) or bool((self.scenario < 0).any()):
            raise ValueError("EnvState.step and scenario must be >= 0")


def state_field_names() -> list[str]:
    """Names of the EnvState tensor fields, in order."""
    return [f.name for f in dataclasses.fields(EnvState)]
