"""`DriveEnv`: the vectorised multi-agent driving environment (docs/design.md sections 6 to 8).

Each of W worlds runs one scenario of a :class:`~gpusim.data.ScenarioPack`; world ``w`` has
C = ``config.max_controlled`` policy slots (slot ``c`` = agent slot ``c``). All state is an
:class:`~gpusim.state.EnvState` of device tensors. A step validates the actions
(:mod:`gpusim.sim.actions`), then runs the stages of :data:`gpusim.sim.pipeline.PIPELINE` in order
(the order is written there only; one module each in ``gpusim/sim/``, diagram in
docs/architecture.md, checked against it by ``tests/test_architecture_doc.py``), then builds the
:class:`StepResult`.

Time alignment is that of docs/contracts.md: ``reward``, ``terminal``, ``truncation`` and
``loss_mask`` of a :class:`StepResult` are about the actions just taken; ``obs``, ``removed``,
``stopped`` and ``slot_active`` describe the state after the step (after an auto-reset, the new
episode's first state).
"""

from __future__ import annotations

import torch

from gpusim.backend import normalize_device, step_backend
from gpusim.config import ActionSpace, EnvConfig
from gpusim.data.mirror import training_pack
from gpusim.data.pack import ScenarioPack
from gpusim.kernels import dynamics
from gpusim.metrics import EpisodeMetrics, metric_columns
from gpusim.sim.actions import ActionCheck
from gpusim.sim.context import SimContext, StepVars
from gpusim.sim.episode import begin_episode, draw_scenarios
from gpusim.sim.motion import expert_actions, model_for
from gpusim.sim.observe import config_obs_layout, observe_state
from gpusim.sim.pipeline import PIPELINE, run_pipeline
from gpusim.sim.result import StepResult, check_pack, step_result
from gpusim.state import EnvState

__all__ = ["DriveEnv", "StepResult"]


class DriveEnv:
    """W synchronous worlds running scenarios of ``pack`` (docs/design.md section 7, docs/contracts.md).

    Args:
        pack: scenarios (moved to ``device``), or a :class:`~gpusim.data.pool.ScenarioPool`
            (streaming: worlds draw from its resident pool, which the env swaps every
            ``resample_every`` episodes at an episode boundary); its ``config`` must match ``config.data_config()``
            in ``max_agents``, ``max_controlled``, ``init_steps`` and ``grid_k == num_roads``.
        num_worlds: W >= 1.
        config: :class:`~gpusim.config.EnvConfig`.
        device: torch device of all state (normalised once: ``"cpu:0"`` is ``cpu``, ``"cuda"`` is
            ``cuda:<current index>``).
        seed: seed of the env's generator (scenario draws, NEW_GOAL sampling).

    Attributes: ``num_worlds``, ``num_slots`` (C), ``obs_dim`` (D), ``obs_layout``, ``horizon``,
    ``num_actions`` (91 discrete; 2 = action dimension when continuous), ``config``, ``device``,
    ``pack``, ``state``, ``generator``, ``episode_metrics``, ``episode_step`` (host clock of the synchronous episode),
    ``pipeline`` (the stages a step runs, default :data:`gpusim.sim.pipeline.PIPELINE`), ``stage_hook``
    (None, or ``hook(stage_name, call) -> changes`` wrapping every stage call; see
    :mod:`gpusim.sim.pipeline`).

    Raises:
        ValueError: pack/config mismatch (the message says what to change), ``num_worlds < 1``,
            an empty pack, no registered dynamics model.
    """

    def __init__(self, pack: ScenarioPack, num_worlds: int, config: EnvConfig = EnvConfig(), device="cpu",
                 seed: int = 0):
        pool = None
        if not isinstance(pack, ScenarioPack) and hasattr(pack, "episode_done"):  # a ScenarioPool
            pool, pack = pack, pack.current
        check_pack(pack, int(num_worlds), config)
        self.config = config
        self.device = normalize_device(device)
        if pool is not None and normalize_device(pool.device) != self.device:
            raise ValueError(f"DriveEnv: the scenario pool lives on {pool.device}, the env on {self.device}: "
                             f"build ScenarioPool(..., device={str(self.device)!r})")
        pack = training_pack(pack.to(self.device), config)  # EnvConfig.mirror: mirrored copies too
        self.num_worlds = int(num_worlds)
        self.num_slots = config.max_controlled
        self.horizon = config.horizon
        self.num_actions = dynamics.NUM_ACTIONS if config.action_space == ActionSpace.DISCRETE else 2
        self.obs_layout = config_obs_layout(config)
        self.obs_dim = self.obs_layout.obs_dim
        generator = torch.Generator(device=self.device)
        generator.manual_seed(int(seed))
        names = metric_columns(config.k_trials if config.trial_mode else None)  # the registry, gpusim/metrics.py
        metrics = EpisodeMetrics(self.num_worlds, self.num_slots, alpha=config.log_ema_alpha, device=self.device,
                                 names=names)
        self.sim = SimContext(config=config, pack=pack, device=self.device, generator=generator,
                              num_worlds=self.num_worlds, num_slots=self.num_slots, metrics=metrics, pool=pool)
        if config.has_coplayers:  # population play: co-player episodes are logged apart (gpusim/sim/roles.py)
            self.sim.coplayer_metrics = EpisodeMetrics(self.num_worlds, self.num_slots, alpha=config.log_ema_alpha,
                                                       device=self.device, names=names)
        model_for(self.sim)  # fail early on an unregistered dynamics model
        self._check = ActionCheck(config.check_actions, config.action_space, self.num_worlds, self.num_slots,
                                  self.device)
        self.stage_hook = None
        self.pipeline = PIPELINE
        self.state = begin_episode(self.sim, draw_scenarios(self.sim))
        # Reused observation buffer [W, C, D] (docs/performance.md): valid until the next step() /
        # reset(); obs_written [W*C] bool marks the slots that may hold non-zero values.
        self.sim.obs_buf = torch.zeros(self.num_worlds, self.num_slots, self.obs_dim, device=self.device)
        self.sim.obs_written = torch.zeros(self.num_worlds * self.num_slots, dtype=torch.bool, device=self.device)

    @property
    def pack(self) -> ScenarioPack:
        """The scenarios worlds draw from: the pack, or the current pool when streaming (it changes
        every ``resample_every`` episodes, at an episode boundary)."""
        return self.sim.pack

    def use_pack(self, pack: ScenarioPack) -> None:
        """Run the scenarios of ``pack`` from the next :meth:`reset` on (streaming evaluation swaps
        packs between sweeps of a large dataset; the episode in progress must not continue).

        Raises:
            ValueError: as the constructor, for a pack that does not fit this env's config.
        """
        check_pack(pack, self.num_worlds, self.config)
        self.sim.pack = training_pack(pack.to(self.device), self.config)

    @property
    def pool(self):
        """The :class:`~gpusim.data.pool.ScenarioPool` when streaming, else None."""
        return self.sim.pool

    @property
    def generator(self) -> torch.Generator:
        """The env's seeded generator (scenario draws, NEW_GOAL samples)."""
        return self.sim.generator

    @property
    def episode_step(self) -> int:
        """Steps taken in the current synchronous episode (host int; 0 right after a reset)."""
        return self.sim.t

    @property
    def episode_metrics(self) -> EpisodeMetrics:
        """The device-side log of finished agent-episodes (:class:`~gpusim.metrics.EpisodeMetrics`)."""
        return self.sim.metrics

    @property
    def check_actions(self) -> str:
        """The resolved action-check mode: ``"sync"`` or ``"async"`` (:mod:`gpusim.sim.actions`)."""
        return self._check.mode

    @property
    def step_backend(self) -> str:
        """The backend the next step hands its ops (``"c"``, ``"torch"``, ``"triton"`` or
        ``"cupy"``): :func:`gpusim.backend.step_backend` of the state's tensors and
        ``EnvConfig.cpu_kernels``, the one rule the step itself resolves it by.

        Raises:
            RuntimeError: a forced backend the state's device cannot run (``gpusim.backend``).
        """
        return step_backend(self.state.pos, self.config.cpu_kernels)

    # ------------------------------------------------------------------ public API
    def reset(self, seed: int | None = None, scenarios: torch.Tensor | None = None) -> torch.Tensor:
        """Start a new episode in every world; returns obs [W, C, D] float32.

        Args:
            seed: re-seeds the env's generator first (same seed => same scenarios and tensors).
            scenarios: optional [W] integer scenario indices to run (default: drawn uniformly).

        Episodes in progress are discarded (not counted in :meth:`metrics`).

        Raises:
            ValueError: ``scenarios`` of the wrong shape or out of range.
        """
        if seed is not None:
            self.sim.generator.manual_seed(int(seed))
        if scenarios is None:
            scenarios = draw_scenarios(self.sim)
        else:
            scenarios = torch.as_tensor(scenarios, device=self.device).to(torch.int64)
            n = self.pack.num_scenarios
            if tuple(scenarios.shape) != (self.num_worlds,) or bool(((scenarios < 0) | (scenarios >= n)).any()):
                raise ValueError(f"reset: scenarios must be [{self.num_worlds}] indices in [0, {n})")
        self.state = begin_episode(self.sim, scenarios)
        return self.observe()

    def observe(self) -> torch.Tensor:
        """Recompute the observation [W, C, D] of the current state (into the reused buffer)."""
        return observe_state(self.sim, self.state)

    def step(self, actions: torch.Tensor) -> StepResult:
        """Advance every world by one step of ``config.dt`` seconds.

        Args:
            actions: discrete: [W, C] integer joint indices in ``[0, 91)``; continuous: [W, C, 2]
                float in ``[-1, 1]`` (acceleration, steering). Every slot must hold a valid action
                (actions of inactive or out-of-play slots are ignored).

        Returns:
            :class:`StepResult` (time alignment in the module docstring).

        Raises:
            ValueError: wrong shape, dtype or device; with ``check_actions="sync"`` also a NaN or
                out-of-range action (the state is left unchanged). With ``"async"`` a bad value is
                raised at the next :meth:`metrics` / :meth:`check_errors` (:mod:`gpusim.sim.actions`).
        """
        actions = self._check(actions)
        self.sim.t += 1
        self.state, result = self.advance(self.state, actions, episode_end=self.sim.t >= self.horizon)
        return result

    def validate_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """The checks of :meth:`step` (``EnvConfig.check_actions``) without stepping: the validated
        actions (discrete int64 [W, C], continuous float32 [W, C, 2]; async mode: bad slots replaced
        by the no-op and recorded). Raises ``ValueError`` as :meth:`step`."""
        return self._check(actions)

    def advance(self, state: EnvState, actions: torch.Tensor, episode_end: bool) -> tuple[EnvState, StepResult]:
        """The device part of :meth:`step`: run the pipeline on ``state`` with validated ``actions``
        (:meth:`validate_actions`); returns ``(new_state, result)``. It neither sets ``self.state``
        nor advances the host clock ``episode_step``: the caller does (``step`` does both; the
        CUDA-graph rollout, ``train/graphed_rollout.py``, captures this call with
        ``episode_end=False`` and copies ``new_state`` into its static state buffers).

        Args:
            state: the state to advance (not modified: stages return new tensors).
            actions: validated actions. episode_end: this step completes the horizon (auto-reset).
        """
        sim = self.sim
        step = StepVars(actions=actions, episode_end=bool(episode_end))
        if self.pipeline is PIPELINE:  # the C kernels skip their checks on a state they checked before
            pack, step.checked = sim.pack, sim.step_checked(state)
            establishes = step.checked or sim.checkable(state)
            state = run_pipeline(sim, state, step, hook=self.stage_hook)
            sim.last_checked = (state, pack) if establishes else (None, None)
        else:
            state = run_pipeline(sim, state, step, hook=self.stage_hook, stages=self.pipeline)
        return state, step_result(sim, state, step)

    def expert_actions(self) -> torch.Tensor:
        """Actions that make every controlled agent follow its logged trajectory.

        Inverse dynamics of the registered model (``dynamics.inverse_bicycle`` for the classic
        bicycle, a closed-loop tracker) from the current simulated state toward the agent's
        logged pose at the next log index, encoded for the action space
        (``dynamics.encode_actions``). Where the next logged pose is invalid the action is zero
        acceleration and zero steering.

        Returns:
            discrete: [W, C] int64; continuous: [W, C, 2] float32.
        """
        if self.stage_hook is None:
            return expert_actions(self.sim, self.state)
        return self.stage_hook("expert_actions", lambda: expert_actions(self.sim, self.state))

    def check_errors(self) -> None:
        """Raise a bad action recorded by the asynchronous check (one small host read; no-op in
        sync mode).

        Raises:
            ValueError: naming the env step, world and slot of the first bad action since the
                last check (that slot's action was applied as a no-op).
        """
        if self._check.mode == "async":
            self._check.raise_if_error()

    def metrics(self, kind: str = "ema", role: str = "ego") -> dict[str, float]:
        """Metrics of finished agent-episodes (``episode_return``, ``episode_length``,
        ``goal_reached``, ``collided``, ``offroad``, ``score``; see ``gpusim/metrics.py``).

        ``kind="ema"`` (default, docs/design.md section 13): each of the W x C slots keeps an EMA
        (``config.log_ema_alpha``) of the episodes that finished in it; returns the mean over the
        slots with data plus ``n`` = their number, never resets, ``{}`` while no slot has data.
        ``kind="mean"``: plain mean over the agent-episodes finished since the last ``"mean"``
        call plus ``n`` = their number (resets; for evaluations). The env's host read: it first
        raises any asynchronously recorded bad action (:meth:`check_errors`).

        ``role``: ``"ego"`` (default) reports the ego slots' episodes (every controlled slot when
        the env has no co-players); ``"coplayer"`` the co-player slots' (``{}`` without co-players;
        ``EnvState.ego``, gpusim/sim/roles.py).

        Raises:
            ValueError: unknown ``kind`` or ``role``; a recorded bad action.
        """
        self.check_errors()
        if role == "coplayer":
            log = self.sim.coplayer_metrics
            return {} if log is None else log.report(kind)
        if role != "ego":
            raise ValueError(f"DriveEnv.metrics: role must be 'ego' or 'coplayer', got {role!r}")
        return self.sim.metrics.report(kind)

    def commit(self, state: EnvState) -> None:
        """The host side of a step that ran through :meth:`advance` (``episode_end=False``) outside
        :meth:`step`, e.g. replayed from a CUDA graph (gpusim/cuda_graph.py): ``state`` becomes the
        current state and the clock :attr:`episode_step` advances by one."""
        self.sim.t += 1
        self.state = state
