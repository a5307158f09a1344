"""Configuration of the simulator: :class:`DataConfig` and :class:`EnvConfig` (and the enums of
:mod:`gpusim.enums`, re-exported here).

Both configs are frozen dataclasses. Enum fields also accept their lower-case names as strings
(``EnvConfig(goal_behavior="stop")``) so command-line tools can pass them through unchanged.
Invalid values or combinations raise :class:`ValueError` at construction, with a message that says
what to change.

Units: metres, radians, seconds, metres per second.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from gpusim import styles
from gpusim.enums import (  # noqa: F401  (re-exported: existing imports keep working)
    NUM_ROAD_OBS_TYPES,
    ActionSpace,
    ContactBehavior,
    Dynamics,
    GoalBehavior,
    NamedEnum,
    ObjectType,
    RoadType,
)


def check_finite(cfg) -> None:
    """Refuse a non-finite number (NaN, +inf, -inf) in any field of the dataclass ``cfg``, also
    inside tuples and lists (strings are left to the field's own parser). The one finiteness rule
    of every config class (``DataConfig``, ``EnvConfig``, ``train.ppo.PPOConfig``,
    ``policy.PolicyConfig``, ``train.config.TrainConfig``), run first in their validation, which
    command-line flags, config files and checkpoints all pass through. Ranges are checked by each
    class, and only where the physics needs them (time step, radii, lengths).

    Raises:
        ValueError: ``"<Class>.<field> must be a finite number, got nan"`` for the first such field
            (with the entry's index inside a tuple: ``EnvConfig.style[0]``).
    """
    def bad(v, where: str):
        if isinstance(v, float) and not math.isfinite(v):
            return where, v
        if isinstance(v, (tuple, list)):
            return next((b for i, x in enumerate(v) if (b := bad(x, f"{where}[{i}]")) is not None), None)
        return None

    for f in dataclasses.fields(cfg):
        found = bad(getattr(cfg, f.name), f"{type(cfg).__name__}.{f.name}")
        if found is not None:
            raise ValueError(f"{found[0]} must be a finite number, got {found[1]}")


def _check_styles(cfg) -> None:
    """Validate and normalise (to tuples of floats) the driving-style fields of ``cfg``."""
    if not isinstance(cfg.reward_conditioning, bool):
        raise ValueError(f"EnvConfig.reward_conditioning must be True or False, got {cfg.reward_conditioning!r}")
    if cfg.reward_ranges is not None:
        object.__setattr__(cfg, "reward_ranges", styles.check_ranges(cfg.reward_ranges))
    set_ = [n for n in ("reward_ranges", "style", "partner_styles") if getattr(cfg, n) is not None]
    if set_ and not cfg.reward_conditioning:
        raise ValueError(f"EnvConfig.{set_[0]} needs reward_conditioning=True (--env.reward-conditioning)")
    if cfg.style is not None:
        object.__setattr__(cfg, "style", styles.check_style(cfg.style, cfg.style_ranges, "EnvConfig.style"))
    if cfg.partner_styles is not None:
        rows = tuple(styles.check_style(r, cfg.style_ranges, "EnvConfig.partner_styles") for r in cfg.partner_styles)
        if not rows:
            raise ValueError("EnvConfig.partner_styles must have at least one row (or be None)")
        object.__setattr__(cfg, "partner_styles", rows)


#: Simulation time step in seconds (WOMD logs are sampled at 10 Hz).
DT = 0.1
#: Number of logged steps in a WOMD scenario (9.1 s at 10 Hz).
WOMD_STEPS = 91
#: Values of ``EnvConfig.ego_choice`` (gpusim/sim/roles.py).
EGO_CHOICES = ("sdc", "random", "first")
#: Values of ``EnvConfig.partner_task`` (gpusim/sim/partner_task.py).
PARTNER_TASKS = ("none", "crossing")
#: Values of ``DataConfig.control`` (gpusim/data/build.py :func:`select_agents`).
CONTROL_RULES = ("vehicles_with_goal", "all_valid")


@dataclass(frozen=True)
class DataConfig:
    """How WOMD JSON is turned into a :class:`~gpusim.data.ScenarioPack`.

    Attributes:
        max_agents: agent slots per scenario (controlled first, then log-replayed experts).
        max_controlled: at most this many controlled agents per scenario.
        init_steps: log index at which episodes start; controlled agents must be valid there.
        goal_min_distance: a vehicle is controllable only if its goal is farther than this (m)
            from its position at ``init_steps``.
        simplify_area: Visvalingam triangle-area threshold (m^2) for road polyline simplification.
        grid_cell_size: edge of a square cell of the per-scenario nearest-segment grid (m).
        grid_margin: the grid covers the bounding box of all valid agent positions and goals,
            grown by this margin (m); positions outside are clamped to the border cells.
        grid_k: road segments stored per cell (nearest to the cell centre first) = the number of
            road slots in observations.
        grid_edge_k: road-edge segments stored per cell for the offroad test.
        control: which objects are controllable (:mod:`gpusim.data.build`): ``"vehicles_with_goal"``
            (default: vehicles valid at ``init_steps``, not ``mark_as_expert``, goal farther than
            ``goal_min_distance``) or ``"all_valid"`` (every object valid at ``init_steps``, of
            any type, expert-marked or not, goal or not; objects not valid there are left out; the
            evaluator's ``wosac`` mode).
    """

    max_agents: int = 64
    max_controlled: int = 32
    init_steps: int = 0
    goal_min_distance: float = 2.0
    simplify_area: float = 0.1
    grid_cell_size: float = 5.0
    grid_margin: float = 60.0
    grid_k: int = 128
    grid_edge_k: int = 32
    control: str = "vehicles_with_goal"

    def __post_init__(self):
        check_finite(self)
        if self.control not in CONTROL_RULES:
            raise ValueError(f"DataConfig.control must be one of {CONTROL_RULES}, got {self.control!r}")
        if self.max_agents < 1:
            raise ValueError(f"DataConfig.max_agents must be >= 1, got {self.max_agents}")
        if not 1 <= self.max_controlled <= self.max_agents:
            raise ValueError(
                f"DataConfig.max_controlled must be in [1, max_agents={self.max_agents}], "
                f"got {self.max_controlled}"
            )
        if not 0 <= self.init_steps < WOMD_STEPS - 1:
            raise ValueError(f"DataConfig.init_steps must be in [0, {WOMD_STEPS - 2}], got {self.init_steps}")
        if self.grid_cell_size <= 0 or self.grid_k < 1 or self.grid_edge_k < 1:
            raise ValueError("DataConfig: grid_cell_size must be > 0 and grid_k, grid_edge_k >= 1")


@dataclass(frozen=True)
class EnvConfig:
    """Configuration of :class:`gpusim.env.DriveEnv`.

    Attributes:
        max_agents, max_controlled, init_steps: see :class:`DataConfig` (the pack must have been
            built with the same values; :meth:`data_config` gives them).
        scenario_length: steps per episode (per trial in trial mode); ``None`` means
            ``91 - init_steps``.
        dynamics: vehicle model (only ``classic``, the kinematic bicycle).
        action_space: ``discrete`` (joint index over 7 accelerations x 13 steering values) or
            ``continuous`` (two numbers in [-1, 1] scaled to the same ranges).
        goal_behavior: ``respawn`` | ``new_goal`` | ``stop`` | ``trial`` | ``continue`` (the agent
            drives on after its goal; the goal reward is paid once per episode).
        collision_behavior, offroad_behavior: ``ignore`` | ``stop`` | ``remove``.
        goal_radius: a goal is reached within this distance (m).
        reward_goal, reward_collision, reward_offroad: per-event rewards.
        reward_red_light: reward for crossing the stop line of a red signal (metric
            ``red_light_violation``, docs/signals.md); default 0 (no penalty), e.g. -0.5 to penalise.
        stop_truncate_fraction: when at least this fraction of a world's controlled agents are
            stopped by a contact (STOP behaviour), the world's episode ends early.
        collision_box_scale: collision boxes are the logged length/width times this factor
            (0.7 as in GPUDrive and PufferDrive: logged WOMD boxes are generous; on the 72 shared
            scenarios 1.1% of the default-controlled agents' full-size logged boxes overlap another
            object at some valid step, 0.5% at 0.7; docs/design.md section 8).
        offroad_box_scale: the offroad test uses the logged box times this factor (1.0: the real
            outline must cross a road edge).
        k_trials: trials per episode in trial mode.
        log_ema_alpha: smoothing of the per-agent EMA metric slots (docs/design.md section 13).
        num_partners, partner_radius: partner slots in observations and their range (m).
        num_roads, road_radius: road-segment slots in observations (must equal the pack's
            ``grid_k``) and their range (m).
        num_signals: traffic-signal slots in observations: the N nearest stop points within
            ``road_radius`` (docs/signals.md). 16 covers a four-way intersection with four lanes per
            approach; in the shared WOMD scenes 90% of controlled agent-steps have at most 16
            signals within 50 m (median 9, max 19). 0 removes the block.
        cpu_kernels: on the torch backend with CPU tensors the stages' ops run their hand-written
            C kernels (the ``"c"`` backend, ``gpusim.backend.step_backend``: ``gpusim/kernels/*.c``
            and ``observations/cpu.c``, compiled with the system C compiler at first use and
            cached in ``~/.cache/gpusim``; same results as the torch references). False runs the
            torch references. Without a C compiler the references run (one warning).
        check_actions: when action values (range, NaN) are checked: ``"sync"`` (a ValueError at
            the bad step; one host sync per step), ``"async"`` (no sync: recorded on the device,
            raised at the next ``DriveEnv.metrics()`` / ``check_errors()``, the bad slot's action
            applied as a no-op; ``gpusim/sim/actions.py``), ``"auto"`` (default: sync on the CPU,
            async on CUDA).
        ego_slots, ego_fraction: roles of the controlled slots (population play;
            ``gpusim/sim/roles.py``). Ego slots per world: ``ego_slots`` if > 0, else
            ``ceil(ego_fraction * controlled)`` (at least 1) if ``ego_fraction`` > 0, else every
            controlled slot (0 / 0.0, the default: no co-players, today's behaviour bit for bit).
            The other controlled slots are *co-players*, driven by frozen partner policies.
        ego_choice: which controlled slots are egos: ``"sdc"`` (default: the self-driving car when
            it is controllable, the rest drawn at random per episode), ``"random"`` (drawn per
            episode with the env's seeded generator) or ``"first"`` (the lowest slots).
        replay_experts: log-replayed (non-controlled) agents stay in the scene (default); False
            takes them out of the scene at every reset (no contacts, not observed).
        reward_conditioning: driving styles (docs/styles.md, :mod:`gpusim.styles`): every agent
            draws its own reward weights and target speed per episode (``EnvState.style``), is paid
            their weighted terms, and observes them (a block at the end of the observation). Off
            (default): today's reward and observation bit for bit.
        reward_ranges: R ``(low, high)`` pairs of the per-agent draw (uniform; low == high fixes
            the entry); ``None``: ``gpusim.styles.DEFAULT_RANGES``.
        style: R fixed values for the ego slots instead of the draw (evaluation by style);
            ``None``: drawn. Must lie inside the ranges.
        partner_styles: a [P][R] table of co-player styles: one row drawn per world per episode
            for its co-player slots; ``None``: co-players draw like egos.
        goal_candidates: the memory task (docs/trial.md, ``gpusim/sim/candidates.py``): K >= 2
            candidate goals per controlled agent, shown alike in the observation (a block at its
            end), one of them the true goal (drawn per agent per episode); reaching another one
            stops the agent for the rest of the trial. 0 or 1 (default 0): off, bit for bit.
            Not with ``new_goal`` (its new goals would replace the true one).
        random_start_steps: random start, a training randomisation (docs/training.md
            "Generalisation options", ``gpusim/sim/random_start.py``): each world starts its
            episode at log step ``init_steps + u``, ``u`` uniform in ``[0, N]`` drawn per world per
            episode; no world runs past its log: a world's episode ends at the horizon or when its
            log ends (after ``91 - init_steps - u`` steps), whichever comes first, and idles until
            the synchronous reset; in trial mode the trials are shortened instead
            (``scenario_length`` at most ``91 - init_steps - N``, a longer one is shortened to
            it). 0 (default): off, bit for bit.
        goal_resample: goal resampling, a training randomisation (``gpusim/sim/goal_resample.py``):
            at every episode start each controlled agent's goal becomes a lane place drawn
            uniformly from its candidate pool (``gpusim.sim.candidates.candidate_pool``: ahead, at
            a distance like its logged goal's). False (default): the logged goals, bit for bit.
            Not with ``goal_candidates >= 2`` (the memory task draws its own goals).
        candidate_practice: practice episodes of the memory task, a training randomisation
            (docs/trial.md): the fraction (in [0, 1)) of controlled agents per episode, drawn per
            agent from the env's generator, whose K candidates all show the true goal, so the
            agent practises driving to a shown place of the kind the task uses; the other agents
            play the memory task. Needs ``goal_candidates >= 2``; evaluation drops it. 0 (default):
            off, nothing drawn.
        mirror: mirror-image scenes, a training randomisation (``gpusim/data/mirror.py``): the env
            draws from its scenes and their copies reflected across the y axis (``x -> -x``,
            headings ``theta -> pi - theta``; traffic then drives on the left), so each world runs
            a mirrored scene with probability 1/2 per episode. Evaluation drops it; behaviour
            cloning and WOSAC never use it. False (default): the scenes as logged, bit for bit.
        control: which objects the policy controls (:attr:`DataConfig.control`, passed on by
            :meth:`data_config`): ``"vehicles_with_goal"`` (default) or ``"all_valid"`` (every
            object valid at ``init_steps``, up to ``max_controlled``; the rest log-replayed).
        zero_trial_index: the exact memoryless control (docs/trial.md): the ego block's
            ``trial_index`` column is zeroed after the observation kernel, so every trial starts
            with the same observation and a policy whose cache is cleared at every trial start acts
            the same in every trial. Needs trial mode. False (default): the column is
            ``trial_count / k_trials``.
        partner_task: ``"crossing"``: the partner task (docs/trial.md, ``gpusim/sim/partner_task.py``):
            a scripted car crosses the ego's logged path, as a yielder or a non-yielder (hidden,
            drawn per world per episode, kept across trials). Needs ``max_controlled = 1`` (the
            task's ego); not with ``random_start_steps``. ``"none"`` (default): off, nothing drawn.
        partner_type_prob: the probability of the non-yielder type per world and episode (in [0, 1]);
            another value than the default is refused without ``partner_task`` (it would do nothing).
    """

    max_agents: int = 64
    max_controlled: int = 32
    init_steps: int = 0
    scenario_length: int | None = None
    dynamics: Dynamics = Dynamics.CLASSIC
    action_space: ActionSpace = ActionSpace.DISCRETE
    goal_behavior: GoalBehavior = GoalBehavior.STOP
    collision_behavior: ContactBehavior = ContactBehavior.IGNORE
    offroad_behavior: ContactBehavior = ContactBehavior.IGNORE
    goal_radius: float = 2.0
    reward_goal: float = 1.0
    reward_collision: float = -0.5
    reward_offroad: float = -0.5
    reward_red_light: float = 0.0
    stop_truncate_fraction: float = 0.5
    collision_box_scale: float = 0.7
    offroad_box_scale: float = 1.0
    k_trials: int = 2
    log_ema_alpha: float = 0.707
    num_partners: int = 31
    partner_radius: float = 50.0
    num_roads: int = 128
    road_radius: float = 50.0
    num_signals: int = 16
    dt: float = DT
    cpu_kernels: bool = True
    check_actions: str = "auto"
    ego_slots: int = 0
    ego_fraction: float = 0.0
    ego_choice: str = "sdc"
    replay_experts: bool = True
    reward_conditioning: bool = False
    reward_ranges: tuple | None = None
    style: tuple | None = None
    partner_styles: tuple | None = None
    goal_candidates: int = 0
    random_start_steps: int = 0
    goal_resample: bool = False
    candidate_practice: float = 0.0
    mirror: bool = False
    control: str = "vehicles_with_goal"
    zero_trial_index: bool = False
    partner_task: str = "none"
    partner_type_prob: float = 0.5

    def __post_init__(self):
        check_finite(self)
        for name, enum_cls in (
            ("dynamics", Dynamics),
            ("action_space", ActionSpace),
            ("goal_behavior", GoalBehavior),
            ("collision_behavior", ContactBehavior),
            ("offroad_behavior", ContactBehavior),
        ):
            object.__setattr__(self, name, enum_cls.parse(getattr(self, name)))
        self.data_config()  # DataConfig's checks of the shared fields (init_steps first)
        if not isinstance(self.random_start_steps, int) or isinstance(self.random_start_steps, bool) \
                or not 0 <= self.random_start_steps <= WOMD_STEPS - 2 - self.init_steps:
            raise ValueError(f"EnvConfig.random_start_steps must be an integer in "
                             f"[0, {WOMD_STEPS - 2 - self.init_steps}] (0: off), got {self.random_start_steps!r}")
        longest = WOMD_STEPS - self.init_steps - (self.random_start_steps if self.trial_mode else 0)
        if self.scenario_length is None or (self.random_start_steps > 0 and self.scenario_length > longest):
            object.__setattr__(self, "scenario_length", longest)  # random start shortens the trials
        if self.scenario_length < 1:
            raise ValueError(f"EnvConfig.scenario_length must be >= 1, got {self.scenario_length}")
        if self.init_steps + self.scenario_length > WOMD_STEPS:
            raise ValueError(
                f"EnvConfig.scenario_length={self.scenario_length} with init_steps={self.init_steps} runs past the "
                f"{WOMD_STEPS}-step log (the experts would have no log to replay); use at most "
                f"{WOMD_STEPS - self.init_steps}"
            )
        if self.goal_radius <= 0:
            raise ValueError(f"EnvConfig.goal_radius must be > 0, got {self.goal_radius}")
        if not 0.0 < self.stop_truncate_fraction <= 1.0:
            raise ValueError(
                f"EnvConfig.stop_truncate_fraction must be in (0, 1], got {self.stop_truncate_fraction}"
            )
        if not 0.0 < self.collision_box_scale <= 2.0:
            raise ValueError(f"EnvConfig.collision_box_scale must be in (0, 2], got {self.collision_box_scale}")
        if not 0.0 < self.offroad_box_scale <= 2.0:
            raise ValueError(f"EnvConfig.offroad_box_scale must be in (0, 2], got {self.offroad_box_scale}")
        if self.k_trials < 1:
            raise ValueError(f"EnvConfig.k_trials must be >= 1, got {self.k_trials}")
        if not 0.0 <= self.log_ema_alpha < 1.0:
            raise ValueError(f"EnvConfig.log_ema_alpha must be in [0, 1), got {self.log_ema_alpha}")
        if self.num_partners < 1 or self.num_roads < 1:
            raise ValueError("EnvConfig.num_partners and num_roads must be >= 1")
        for name in ("partner_radius", "road_radius"):  # observations divide positions by them
            if getattr(self, name) <= 0:
                raise ValueError(f"EnvConfig.{name} must be > 0 (m), got {getattr(self, name)}")
        if self.num_signals < 0:
            raise ValueError(f"EnvConfig.num_signals must be >= 0 (0: no signal block), got {self.num_signals}")
        if self.num_partners > self.max_agents - 1:
            raise ValueError(
                f"EnvConfig.num_partners={self.num_partners} exceeds max_agents - 1 = {self.max_agents - 1}; "
                "lower num_partners or raise max_agents"
            )
        if self.dt <= 0:
            raise ValueError(f"EnvConfig.dt must be > 0, got {self.dt}")
        if not isinstance(self.cpu_kernels, bool):
            raise ValueError(f"EnvConfig.cpu_kernels must be True or False, got {self.cpu_kernels!r}")
        if self.check_actions not in ("auto", "sync", "async"):
            raise ValueError(f"EnvConfig.check_actions must be 'auto', 'sync' or 'async', got {self.check_actions!r}")
        if self.ego_slots < 0 or not 0.0 <= self.ego_fraction <= 1.0:
            raise ValueError(f"EnvConfig.ego_slots must be >= 0 and ego_fraction in [0, 1], got {self.ego_slots}, "
                             f"{self.ego_fraction}")
        if self.ego_choice not in EGO_CHOICES:
            raise ValueError(f"EnvConfig.ego_choice must be one of {', '.join(EGO_CHOICES)}, got {self.ego_choice!r}")
        if not isinstance(self.replay_experts, bool):
            raise ValueError(f"EnvConfig.replay_experts must be True or False, got {self.replay_experts!r}")
        _check_styles(self)
        if not isinstance(self.goal_candidates, int) or self.goal_candidates < 0:
            raise ValueError(f"EnvConfig.goal_candidates must be an integer >= 0 (0 or 1: off), got "
                             f"{self.goal_candidates!r}")
        if self.goal_candidates >= 2 and self.goal_behavior == GoalBehavior.NEW_GOAL:
            raise ValueError("EnvConfig.goal_candidates >= 2 does not work with goal_behavior new_goal "
                             "(a new goal would replace the true candidate); use trial or stop")
        if not isinstance(self.goal_resample, bool):
            raise ValueError(f"EnvConfig.goal_resample must be True or False, got {self.goal_resample!r}")
        if self.goal_resample and self.goal_candidates >= 2:
            raise ValueError("EnvConfig.goal_resample does not work with goal_candidates >= 2 (the memory task "
                             "draws its own goals); drop --env.goal-resample or --env.goal-candidates")
        if not 0.0 <= self.candidate_practice < 1.0:
            raise ValueError(f"EnvConfig.candidate_practice must be in [0, 1), got {self.candidate_practice!r}")
        if self.candidate_practice > 0 and self.goal_candidates < 2:
            raise ValueError("EnvConfig.candidate_practice needs the memory task (--env.goal-candidates 2 or "
                             "more); drop --env.candidate-practice or set --env.goal-candidates")
        if not isinstance(self.mirror, bool):
            raise ValueError(f"EnvConfig.mirror must be True or False, got {self.mirror!r}")
        if not isinstance(self.zero_trial_index, bool):
            raise ValueError(f"EnvConfig.zero_trial_index must be True or False, got {self.zero_trial_index!r}")
        if self.zero_trial_index and not self.trial_mode:
            raise ValueError("EnvConfig.zero_trial_index needs trial mode (--env.goal-behavior trial); drop "
                             "--env.zero-trial-index")
        if self.partner_task not in PARTNER_TASKS:
            raise ValueError(f"EnvConfig.partner_task must be one of {', '.join(PARTNER_TASKS)}, got "
                             f"{self.partner_task!r}")
        if not 0.0 <= self.partner_type_prob <= 1.0:
            raise ValueError(f"EnvConfig.partner_type_prob must be in [0, 1], got {self.partner_type_prob!r}")
        if self.partner_task == "none" and self.partner_type_prob != EnvConfig.partner_type_prob:
            raise ValueError(f"EnvConfig.partner_type_prob {self.partner_type_prob} does nothing without the partner "
                             f"task; add --env.partner-task crossing or drop --env.partner-type-prob")
        if self.partner_task != "none" and (self.max_controlled != 1 or self.max_agents < 2):
            raise ValueError(f"EnvConfig.partner_task {self.partner_task} needs one controlled agent per world "
                             f"(--env.max-controlled 1, got {self.max_controlled}) and max_agents >= 2")
        if self.partner_task != "none" and self.random_start_steps > 0:
            raise ValueError("EnvConfig.partner_task does not work with random_start_steps (the crossing is placed "
                             "on the log's clock from init_steps); drop --env.random-start-steps")

    @property
    def style_ranges(self) -> tuple:
        """The R (low, high) ranges of the style draw (``reward_ranges`` or the defaults)."""
        return self.reward_ranges if self.reward_ranges is not None else styles.DEFAULT_RANGES

    @property
    def has_coplayers(self) -> bool:
        """True when some controlled slots may be co-players (``ego_slots`` or ``ego_fraction`` set)."""
        return self.ego_slots > 0 or self.ego_fraction > 0.0

    @property
    def trial_mode(self) -> bool:
        """True when ``goal_behavior == TRIAL``."""
        return self.goal_behavior == GoalBehavior.TRIAL

    @property
    def horizon(self) -> int:
        """Steps per episode: ``k_trials * scenario_length`` in trial mode, else ``scenario_length``."""
        return self.k_trials * self.scenario_length if self.trial_mode else self.scenario_length

    def data_config(self, **overrides) -> DataConfig:
        """The :class:`DataConfig` whose shared fields match this env config.

        ``overrides`` set the data-only fields (grid size, simplification, ...) and may replace
        the shared ones (e.g. ``control``).
        """
        shared = dict(max_agents=self.max_agents, max_controlled=self.max_controlled, init_steps=self.init_steps,
                      grid_k=self.num_roads, control=self.control)
        return DataConfig(**{**shared, **overrides})

    def replace(self, **changes) -> "EnvConfig":
        """A copy with ``changes`` applied (validated again). A ``scenario_length`` equal to its
        derived default (``91 - init_steps``, minus ``random_start_steps`` in trial mode) is
        derived again unless ``changes`` sets it, so it follows a change of ``init_steps``,
        ``random_start_steps`` or the goal behaviour."""
        shortened = self.random_start_steps if self.trial_mode else 0
        if "scenario_length" not in changes and self.scenario_length == WOMD_STEPS - self.init_steps - shortened:
            changes = {**changes, "scenario_length": None}
        return dataclasses.replace(self, **changes)
