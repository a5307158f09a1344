"""What the stages of a step share: the static context (:class:`SimContext`) and the per-step
scratch values that are not state (:class:`StepVars`), plus small slot-view helpers.

A stage is ``fn(ctx: SimContext, state: EnvState, step: StepVars) -> dict[str, Tensor]``: it reads
the state as the previous stages left it, may set fields of ``step`` for later stages and for the
:class:`~gpusim.env.StepResult`, and returns only the :class:`~gpusim.state.EnvState` fields it
changes (the pipeline applies them with ``state.replace(**changes)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from gpusim.config import EnvConfig
from gpusim.data.pack import ScenarioPack


def slots(t: torch.Tensor, num_slots: int) -> torch.Tensor:
    """The policy-slot columns ``t[:, :C]`` of a ``[W, A, ...]`` tensor, contiguous."""
    return t[:, :num_slots].contiguous()


def with_slots(t: torch.Tensor, slot_values: torch.Tensor) -> torch.Tensor:
    """``t`` [W, A, ...] with its first C columns replaced by ``slot_values`` [W, C, ...] (new tensor)."""
    return torch.cat([slot_values, t[:, slot_values.shape[1]:]], dim=1)


def bound_op(ctx: "SimContext", step: "StepVars", name: str, make: Callable) -> Callable:
    """The op call ``make(backend, check)`` of a stage, bound once per pack, step backend
    (``step.backend``) and check flag (``not step.checked``) and kept in the context's pack facts
    (:meth:`SimContext.pack_fact`). ``make`` is an op module's ``bind_*`` factory with the stage's
    static arguments (pack tensors, config scalars): the call it returns takes the per-step tensors
    positionally, and on the C backend without checks goes straight to the kernel."""
    key = (name, step.backend, step.checked)
    pack, facts = ctx.pack_facts
    fn = facts.get(key) if pack is ctx.pack else None
    if fn is None:
        fn = ctx.pack_fact(key, lambda pk: make(step.backend, not step.checked))
    return fn


@dataclass
class SimContext:
    """Static context of the stages plus the env's host-side counters.

    Attributes:
        config, pack, device (normalised), generator (seeded; scenario draws, NEW_GOAL samples),
        num_worlds (W), num_slots (C), metrics (:class:`~gpusim.metrics.EpisodeMetrics`),
        t: steps taken in the current synchronous episode (host int; the auto-reset clock),
        start: the state of the current episode at its reset (trial restarts restore from it),
        end_flags: cached constant [W] bool tensors ``(all False, all True)`` for the kernels'
        ``episode_end`` argument (no per-step host->device copy), end_scalars: their first elements
        (0-d views, ``StepResult.info["episode_end"]``), obs_buf / obs_written: the
        reused observation buffer [W, C, D] and the [W*C] bool slots that may be non-zero, obs_scratch:
        the torch observation path's own [W, C, D0] buffer when later blocks follow (``"buf"``),
        coplayer_metrics: the co-player slots' metrics log (None without co-players),
        pack_facts: host values derived from the pack, per pack object (:meth:`pack_fact`),
        last_checked: ``(state, pack)`` after the last eager step of the built-in pipeline whose
        input was :meth:`checkable` (:meth:`step_checked`), config_facts: values derived from the
        config, computed once (:meth:`cached`).
    """

    config: EnvConfig
    pack: ScenarioPack
    device: torch.device
    generator: torch.Generator
    num_worlds: int
    num_slots: int
    metrics: object
    t: int = 0
    start: object = None
    end_flags: tuple = ()
    end_scalars: tuple = ()
    obs_buf: torch.Tensor | None = None
    obs_written: torch.Tensor | None = None
    obs_scratch: dict = field(default_factory=dict)  # the torch observation path's contiguous buffer
    coplayer_metrics: object = None
    pool: object = None  # gpusim.data.pool.ScenarioPool when streaming, else None
    pack_facts: tuple = (None, {})  # (pack, {name: value}): host facts of the pack (pack_fact)
    last_checked: tuple = (None, None)  # (state, pack) of the last eager built-in step (step_checked)
    config_facts: dict = field(default_factory=dict)  # {name: value} derived from the config (cached)

    def __post_init__(self):
        W = self.num_worlds
        self.end_flags = (torch.zeros(W, dtype=torch.bool, device=self.device),
                          torch.ones(W, dtype=torch.bool, device=self.device))
        self.end_scalars = (self.end_flags[0][0], self.end_flags[1][0])  # 0-d views: the result's flag

    def step_checked(self, state) -> bool:
        """True when ``state`` is what the last eager step of the built-in pipeline returned and
        the pack is the one it ran on, and that step's input was :meth:`checkable`
        (``StepVars.checked``)."""
        last_state, last_pack = self.last_checked
        return state is last_state and self.pack is last_pack

    def checkable(self, state) -> bool:
        """True when a step with the checks on, on ``state`` and the current pack, establishes the
        layout for the steps after it: every state and pack tensor is contiguous (the kernels'
        checks raise on a wrong dtype or shape but copy a non-contiguous tensor, which a field
        carried over unchanged would stay). Metadata only, no device sync."""
        return (all(t.is_contiguous() for t in state.__dict__.values())
                and self.pack_fact("contiguous", lambda pk: all(t.is_contiguous() for t in pk.tensors().values())))

    def cached(self, name: str, compute: Callable):
        """``compute(config)`` computed once per context (host values derived from the config, e.g.
        a stage's scalar kernel arguments; the config of a context never changes)."""
        value = self.config_facts.get(name)
        if value is None:
            value = self.config_facts[name] = compute(self.config)
        return value

    def pack_fact(self, name: str, compute: Callable):
        """``compute(pack)`` for the current pack, computed once per pack object (a host read of a
        static pack tensor, e.g. whether any scenario has a traffic signal, off the step's path)."""
        pack, facts = self.pack_facts
        if pack is not self.pack:
            pack, facts = self.pack, {}
            self.pack_facts = (pack, facts)
        if name not in facts:
            facts[name] = compute(pack)
        return facts[name]

    @property
    def sizes(self) -> dict[str, int]:
        """``{"W", "A", "C", "K", "G"}`` sizes of the state tensors (G: candidate goals, at least 1)."""
        cfg = self.config
        return {"W": self.num_worlds, "A": cfg.max_agents, "C": self.num_slots, "K": cfg.k_trials,
                "G": max(1, cfg.goal_candidates)}


@dataclass
class StepVars:
    """Per-step values that are not state (set by the stages, in pipeline order).

    Attributes (W worlds, A agent slots, C policy slots):
        actions: validated actions (discrete [W, C] int64 / continuous [W, C, 2] float32).
        episode_end: Python bool, this step completes the horizon (host clock; no sync).
        in_play: [W, A] bool, the agent acts this step (motion).
        loss_mask: [W, C] bool, ``in_play`` of the slots (motion).
        collided / offroad: [W, A] bool contacts after the motion (contacts).
        hit: [W, A] bool, hit by an in-play collider (collision REMOVE; else all False) (contacts).
        reward: [W, C] float32 reward of the action (rewards).
        goal_now: [W, A] bool, goal reached in this step (rewards).
        truncated: [W] bool, the world was truncated early now (rewards).
        terminal / truncation / trial_ended: [W, C] bool flags of the result (rewards, trial).
        restart: [W] bool, the world starts a new trial (trial mode) or None.
        info: extra result entries (``trial_end`` in trial mode).
        obs: [W, C, D] float32 observation of the new state (observe).
        backend: the ops' backend for this step, ``"torch"`` / ``"triton"`` / ``"c"`` / ``"cupy"``
        (:func:`gpusim.backend.step_backend` of the state's tensors and ``EnvConfig.cpu_kernels``;
        set by :func:`~gpusim.sim.pipeline.run_pipeline` before the first stage). Every stage passes
        it to its ops, whose dispatchers run that backend.
        checked: the C kernels may skip their argument checks (``check=False``): the state is the
        one the previous eager step of the built-in pipeline returned, on the same pack, so the
        tensors the kernels read were checked by an earlier step and every tensor the stages
        produced since comes from the stages themselves (contiguous, declared dtype and shape).
        Set by ``DriveEnv.advance`` (:meth:`SimContext.step_checked`); False by default.

    ``collided_in_play()`` / ``offroad_in_play()``: the contacts of agents in play, computed once.
    """

    actions: torch.Tensor
    episode_end: bool
    in_play: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    collided: torch.Tensor | None = None
    offroad: torch.Tensor | None = None
    hit: torch.Tensor | None = None
    reward: torch.Tensor | None = None
    goal_now: torch.Tensor | None = None
    truncated: torch.Tensor | None = None
    terminal: torch.Tensor | None = None
    truncation: torch.Tensor | None = None
    trial_ended: torch.Tensor | None = None
    restart: torch.Tensor | None = None
    info: dict = field(default_factory=dict)
    obs: torch.Tensor | None = None
    backend: str | None = None
    checked: bool = False
    _in_play_contacts: tuple | None = None

    def collided_in_play(self) -> torch.Tensor:
        """[W, A] bool ``in_play & collided`` (computed once per step: accounting and the result)."""
        return self._contacts_in_play()[0]

    def offroad_in_play(self) -> torch.Tensor:
        """[W, A] bool ``in_play & offroad`` (computed once per step: accounting and the result)."""
        return self._contacts_in_play()[1]

    def set_contacts_in_play(self, collided: torch.Tensor, offroad: torch.Tensor) -> None:
        """Record ``in_play & collided`` and ``in_play & offroad`` ([W, A] bool) when a stage has
        computed them (the C accounting pass), so :meth:`collided_in_play` / :meth:`offroad_in_play`
        return them instead of computing them again."""
        self._in_play_contacts = (collided, offroad)

    def _contacts_in_play(self) -> tuple:
        if self._in_play_contacts is None:
            self._in_play_contacts = (self.in_play & self.collided, self.in_play & self.offroad)
        return self._in_play_contacts
