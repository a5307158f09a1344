"""`EnvState`: the whole simulator state as device tensors (docs/design.md section 5).

Axes: W worlds, A = ``max_agents`` agent slots, C = ``max_controlled`` policy slots, K =
``k_trials`` trial slots. Policy slot ``c`` is agent slot ``c`` (controlled agents come first in a
:class:`~gpusim.data.ScenarioPack`), so every ``[W, C]`` tensor lines up with the first C columns
of the ``[W, A]`` tensors.

Units: metres, radians (heading counter-clockwise from +x), metres per second. Positions are in the
scenario-centred frame of the pack.

**Each field is declared once**, below, with its shape kind, dtype, meaning and what a new trial
does with it (``trial="keep"``: the episode's value survives a trial restart; ``"restore"``: the
value at the episode's reset comes back). Everything else derives from that declaration:
:data:`STATE_FIELDS`, :data:`TRIAL_KEEP`, :meth:`EnvState.build` (zeros for every field not given,
used by the initial state), :meth:`EnvState.where` (trial restore) and :meth:`EnvState.validate`.
Adding a field is one ``_field(...)`` line (plus the stage that writes it); see docs/architecture.md.

Liveness flags (who takes part in what), each documented in its declaration:
``controlled`` (static: the agent is policy-driven), ``present`` (in the scene: contacts and
observations), ``removed`` (out of the scene: REMOVE behaviour, trial-mode goal), ``stopped`` /
``contact_stopped`` (STOP behaviours; the second counts for early truncation), ``world_done``
(the world's episode is over early), ``slot_done`` (terminal already emitted). ``slot_active`` is
not stored: it is ``controlled[:, :C]`` (a property). An agent acts ("in play") when
``controlled & present & ~stopped & ~removed & ~world_done`` (:func:`in_play`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from gpusim.styles import NUM_STYLE_TERMS

#: Shape kinds of the declarations: "W" = [W], "WA" = [W, A], "WA2" = [W, A, 2], "WC" = [W, C],
#: "WCK" = [W, C, K], "WC2" = [W, C, 2], "WAR" = [W, A, R] (R = ``gpusim.styles.NUM_STYLE_TERMS``),
#: "WCG2" = [W, C, G, 2] (G = max(1, ``goal_candidates``), sizes key "G", default 1).
SHAPE_KINDS = ("W", "WA", "WA2", "WC", "WCK", "WC2", "WAR", "WCG2")


def _field(kind: str, dtype: torch.dtype, doc: str, trial: str = "restore"):
    """One state field: shape kind (:data:`SHAPE_KINDS`), dtype, meaning, trial-restart rule."""
    assert kind in SHAPE_KINDS and trial in ("keep", "restore")
    return dataclasses.field(metadata={"kind": kind, "dtype": dtype, "doc": doc, "trial": trial})


@dataclass
class EnvState:
    """Device tensors of a :class:`~gpusim.env.DriveEnv` (one declaration per field, below).

    World tensors are ``[W]``, agent tensors ``[W, A]`` (``pos`` and ``goal`` ``[W, A, 2]``),
    policy-slot tensors ``[W, C]``, ``trial_clean`` ``[W, C, K]``. All tensors live on one device.
    Trial fields stay 0 / False outside trial mode. Stages of the step never modify a tensor in
    place: they return new tensors and the pipeline builds a new state with :meth:`replace`.
    """

    # ---- world tensors [W]
    scenario: torch.Tensor = _field("W", torch.int64, "scenario index into the pack", "keep")
    step: torch.Tensor = _field("W", torch.int32, "steps taken in the current episode (0 right after a reset)",
                                "keep")
    trial_count: torch.Tensor = _field("W", torch.int32, "trials completed in this episode (trial mode; else 0)",
                                       "keep")
    trial_start: torch.Tensor = _field("W", torch.int32, "`step` at which the current trial started (else 0)", "keep")
    world_done: torch.Tensor = _field(
        "W", torch.bool, "episode over early (STOP truncation; trial mode: all trials done); idles until reset")
    # ---- agent tensors [W, A]
    pos: torch.Tensor = _field("WA2", torch.float32, "centre position (m)")
    heading: torch.Tensor = _field("WA", torch.float32, "heading (rad)")
    speed: torch.Tensor = _field("WA", torch.float32, "signed longitudinal speed (m/s)")
    length: torch.Tensor = _field("WA", torch.float32, "logged box length (m), 0 for padding")
    width: torch.Tensor = _field("WA", torch.float32, "logged box width (m), 0 for padding")
    goal: torch.Tensor = _field("WA2", torch.float32, "goal position (m)")
    agent_type: torch.Tensor = _field("WA", torch.int8, "ObjectType code, -1 for padding")
    controlled: torch.Tensor = _field("WA", torch.bool, "policy-driven agent (a < num_controlled[scenario]); static")
    present: torch.Tensor = _field("WA", torch.bool, "in the scene: takes part in contacts and observations")
    stopped: torch.Tensor = _field("WA", torch.bool, "stopped by a contact or by the goal (STOP behaviours)")
    contact_stopped: torch.Tensor = _field(
        "WA", torch.bool, "stopped by a collision / offroad (counts for early truncation); implies stopped")
    removed: torch.Tensor = _field("WA", torch.bool, "removed from the scene (REMOVE; trial mode: goal reached)")
    goal_reached: torch.Tensor = _field("WA", torch.bool, "reached a goal at least once this episode", "keep")
    ever_collided: torch.Tensor = _field("WA", torch.bool, "collided at a valid step this episode", "keep")
    ever_offroad: torch.Tensor = _field("WA", torch.bool, "went offroad at a valid step this episode", "keep")
    collided_now: torch.Tensor = _field("WA", torch.bool, "in collision after the last step")
    offroad_now: torch.Tensor = _field("WA", torch.bool, "offroad after the last step")
    style: torch.Tensor = _field(
        "WAR", torch.float32, "[w, a, r]: the agent's reward weights and target speed (m/s), entries "
        "gpusim.styles.STYLE_TERMS; drawn per episode with reward conditioning (gpusim/sim/styles.py), "
        "kept across trials; all 0 when conditioning is off", "keep")
    # ---- policy-slot tensors [W, C]
    slot_done: torch.Tensor = _field("WC", torch.bool, "terminal already emitted for the slot this episode", "keep")
    ep_return: torch.Tensor = _field("WC", torch.float32, "sum of rewards this episode", "keep")
    ep_length: torch.Tensor = _field("WC", torch.int32, "valid (loss_mask = 1) steps this episode", "keep")
    last_reward: torch.Tensor = _field("WC", torch.float32, "reward of the last step (observation feature)")
    # ---- traffic signals (gpusim/sim/signals.py)
    pos_before: torch.Tensor = _field("WC2", torch.float32, "slot centre at the start of the current step (m; "
                                      "stage signals_before; read by the red-light test)")
    red_light_now: torch.Tensor = _field("WC", torch.bool, "crossed a red signal's stop line in the last step")
    ever_red_light: torch.Tensor = _field("WC", torch.bool, "crossed a red signal's stop line at a valid step "
                                          "this episode (metric red_light_violation)", "keep")
    ego: torch.Tensor = _field(
        "WC", torch.bool, "role: the learning policy drives the slot (else a co-player); set per episode "
        "(gpusim/sim/roles.py), False for empty slots", "keep")
    # ---- trial mode (gpusim/kernels/trial.py; all False outside trial mode)
    trial_goal: torch.Tensor = _field("WC", torch.bool, "reached its goal in the current trial")
    trial_collided: torch.Tensor = _field("WC", torch.bool, "collided at a valid step of the current trial")
    trial_offroad: torch.Tensor = _field("WC", torch.bool, "offroad at a valid step of the current trial")
    trial_clean: torch.Tensor = _field(
        "WCK", torch.bool, "[w, c, k]: trial k finished with goal, no collision/offroad (clean score)", "keep")
    trial_reached: torch.Tensor = _field("WCK", torch.bool, "[w, c, k]: goal reached in trial k", "keep")
    # ---- memory task (gpusim/sim/candidates.py; all 0 when goal_candidates < 2)
    goal_cand: torch.Tensor = _field(
        "WCG2", torch.float32, "[w, c, g]: candidate goal g of the slot (m), drawn per episode", "keep")
    cand_true: torch.Tensor = _field("WC", torch.int64, "index of the true goal among the candidates", "keep")
    at_decoy: torch.Tensor = _field("WC", torch.bool, "stopped at a wrong candidate in the current trial")
    # ---- partner task (gpusim/sim/partner_task.py; all 0 when partner_task is "none")
    partner_type: torch.Tensor = _field(
        "W", torch.int8, "the world's partner type (gpusim.sim.partner_task.PARTNER_TYPES), drawn per episode, "
        "never observed", "keep")
    # ---- random start (gpusim/sim/random_start.py; all 0 when random_start_steps = 0)
    start_offset: torch.Tensor = _field(
        "W", torch.int32, "log steps skipped at the episode start: the world's log index is init_steps + "
        "start_offset + (step - trial_start)")

    # ------------------------------------------------------------------ sizes and derived flags
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
        return self.slot_done.shape[1]

    @property
    def device(self) -> torch.device:
        return self.pos.device

    @property
    def slot_active(self) -> torch.Tensor:
        """[W, C] bool: a controlled agent occupies the slot (= ``controlled[:, :C]``; a view)."""
        return self.controlled[:, : self.num_slots]

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(cls, sizes: dict[str, int], device, **given: torch.Tensor) -> "EnvState":
        """A state whose fields are ``given``, and zeros (declared dtype and shape) for the rest.

        Args:
            sizes: ``{"W": W, "A": A, "C": C, "K": K}``.
            device: device of the zero fields.
            given: field name -> tensor.

        Raises:
            TypeError: an unknown field name in ``given``.
        """
        unknown = set(given) - set(STATE_FIELDS)
        if unknown:
            raise TypeError(f"EnvState.build: unknown fields {sorted(unknown)}")
        shapes = _shapes(sizes["W"], sizes["A"], sizes["C"], sizes["K"], sizes.get("G", 1))
        out = {}
        for name, (kind, dtype) in STATE_FIELDS.items():
            out[name] = given[name] if name in given else torch.zeros(shapes[kind], dtype=dtype, device=device)
        return cls(**out)

    def replace(self, **changes: torch.Tensor) -> "EnvState":
        """A new state with the named fields replaced (the other tensors are shared, not copied).

        The pipeline calls this after every stage, so it copies the instance dict (~1 us) instead
        of going through ``dataclasses.replace`` (~6 us, it re-runs ``__init__``); under
        ``torch.compile`` tracing it is ``dataclasses.replace``.

        Raises:
            TypeError: a name that is not a state field.
        """
        if torch.compiler.is_compiling():
            return dataclasses.replace(self, **changes)
        if not _FIELD_SET.issuperset(changes):
            raise TypeError(f"EnvState.replace: unknown fields {sorted(set(changes) - _FIELD_SET)}")
        new = object.__new__(EnvState)
        d = new.__dict__
        d.update(self.__dict__)
        d.update(changes)
        return new

    def set_fields(self, changes: dict) -> None:
        """Replace the named fields of *this* state in place (no new object). Only for a state that
        nothing else holds yet: :func:`gpusim.sim.pipeline.run_pipeline` makes one copy of its input
        with :meth:`replace` and applies every stage's changes to that copy (one copy per step
        instead of one per stage; the input state is never modified).

        Raises:
            TypeError: a name that is not a state field.
        """
        if not _FIELD_SET.issuperset(changes):
            raise TypeError(f"EnvState.set_fields: unknown fields {sorted(set(changes) - _FIELD_SET)}")
        self.__dict__.update(changes)

    def tensors(self) -> dict[str, torch.Tensor]:
        """All fields by name (declaration order)."""
        return {name: getattr(self, name) for name in STATE_FIELDS}

    def clone(self) -> "EnvState":
        """A deep copy (every tensor cloned, same device)."""
        return EnvState(**{k: v.clone() for k, v in self.tensors().items()})

    def where(self, mask_w: torch.Tensor, other: "EnvState", keep: tuple[str, ...] = ()) -> "EnvState":
        """A new state: worlds where ``mask_w`` ([W] bool) is True take ``other``'s values, except
        the fields named in ``keep`` (always this state's; e.g. :data:`TRIAL_KEEP`). Inputs are not
        modified; kept fields are shared, not copied."""
        out = {}
        for name in STATE_FIELDS:
            dst = getattr(self, name)
            if name in keep:
                out[name] = dst
                continue
            m = mask_w.view(-1, *([1] * (dst.dim() - 1)))
            out[name] = torch.where(m, getattr(other, name), dst)
        return EnvState(**out)

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
        W = _dim(self.scenario, 1, 0)
        A = _dim(self.present, 2, 1)
        C = _dim(self.slot_done, 2, 1)
        K = _dim(self.trial_clean, 3, 2)
        if min(W, A, C) < 0:
            raise ValueError("EnvState: scenario must be [W], present [W, A] and slot_done [W, C] tensors")
        if C > A:
            raise ValueError(f"EnvState: {C} policy slots exceed {A} agent slots")
        if K < 1:
            raise ValueError("EnvState.trial_clean must be a [W, C, K] tensor with K >= 1")
        shapes = _shapes(W, A, C, K, max(_dim(self.goal_cand, 4, 2), 1))
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
        if bool((self.trial_start > self.step).any()) or bool((self.trial_count < 0).any()):
            raise ValueError("EnvState: trial_start must be <= step and trial_count >= 0")
        if bool((self.step < 0).any()) or bool((self.scenario < 0).any()):
            raise ValueError("EnvState.step and scenario must be >= 0")


def in_play(state: EnvState) -> torch.Tensor:
    """[W, A] bool: the agent acts this step (controlled, present, not stopped/removed, world live)."""
    return state.controlled & state.present & ~state.stopped & ~state.removed & ~state.world_done[:, None]


def _dim(t, ndim: int, axis: int) -> int:
    return t.shape[axis] if isinstance(t, torch.Tensor) and t.dim() == ndim else -1


def _shapes(W: int, A: int, C: int, K: int, G: int = 1) -> dict[str, tuple[int, ...]]:
    return {"W": (W,), "WA": (W, A), "WA2": (W, A, 2), "WC": (W, C), "WCK": (W, C, K), "WC2": (W, C, 2),
            "WAR": (W, A, NUM_STYLE_TERMS), "WCG2": (W, C, G, 2)}


#: Field name -> (shape kind, dtype), derived from the declarations of :class:`EnvState`.
STATE_FIELDS: dict[str, tuple[str, torch.dtype]] = {
    f.name: (f.metadata["kind"], f.metadata["dtype"]) for f in dataclasses.fields(EnvState)
}
_FIELD_SET = frozenset(STATE_FIELDS)
#: Trial mode: fields a new trial keeps (episode clock and accumulators); every other field is
#: restored to its value at the episode's reset (``last_reward`` 0, the per-trial flags, poses...).
TRIAL_KEEP: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(EnvState) if f.metadata["trial"] == "keep")
