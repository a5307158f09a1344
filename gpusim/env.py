"""`DriveEnv`: the vectorised multi-agent driving environment (DESIGN.md section 4).

Each of W worlds runs one scenario of a :class:`~gpusim.data.ScenarioPack`; world ``w`` has
C = ``config.max_controlled`` policy slots (slot ``c`` = agent slot ``c``). All state is an
:class:`~gpusim.state.EnvState` of device tensors; a step runs, in order:

1. action check (shape/dtype on the host; range and NaN with one cheap device reduction);
2. kinematic bicycle for controlled agents in play (``dynamics.bicycle_step``);
3. log replay of the experts at log index ``init_steps + (step - trial_start)`` (``replay``);
4. contacts: OBB collisions among present agents with ``config.collision_box_scale``, offroad of
   present controlled agents with ``config.offroad_box_scale``;
5. goals, rewards, contact behaviours, STOP invalid steps, early truncation and terminal flags
   (``events``), then RESPAWN / NEW_GOAL and the per-slot episode accumulators;
6. after step H = ``config.horizon``: metrics of every finished agent-episode, then every world is
   reset with a new scenario (drawn uniformly with the env's seeded generator);
7. observations of the new state (``observations``).

Time alignment is that of docs/contracts.md: ``reward``, ``terminal``, ``truncation`` and
``loss_mask`` of a :class:`StepResult` are about the actions just taken; ``obs``, ``removed``,
``stopped`` and ``slot_active`` describe the state after the step (after an auto-reset, the new
episode's first state).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gpusim.backend import backend_for
from gpusim.config import ActionSpace, ContactBehavior, Dynamics, EnvConfig, GoalBehavior, RoadType
from gpusim.data.pack import ScenarioPack
from gpusim.kernels import dynamics
from gpusim.kernels.collision import collisions
from gpusim.kernels.events import events, hit_by
from gpusim.kernels.new_goal import new_goal
from gpusim.kernels.observations import obs_layout, observations, observations_compiled
from gpusim.kernels.offroad import offroad
from gpusim.kernels.replay import replay
from gpusim.kernels.reset import reset_agents
from gpusim.kernels.trial import trial_step
from gpusim.metrics import METRIC_NAMES, EpisodeMetrics, episode_values, trial_metric_names
from gpusim.state import EnvState

#: Box scale of the offroad test: the full logged box. An agent is offroad when its real outline
#: crosses a road edge, and DESIGN.md's measured log rate (35% of controlled agents, 14% of valid
#: steps) is for full boxes, so expert-replay rates stay comparable with it.
OFFROAD_BOX_SCALE = 1.0  # default of EnvConfig.offroad_box_scale (kept for callers)
#: NEW_GOAL: a new goal is the midpoint of a lane segment whose midpoint lies between these
#: distances ahead of the agent (m; projection on the heading >= min, Euclidean distance <= max).
NEW_GOAL_MIN_AHEAD = 10.0
NEW_GOAL_MAX_DIST = 40.0
#: NEW_GOAL fallback when no lane candidate qualifies: this far straight ahead (m).
NEW_GOAL_FALLBACK = 20.0
#: Trial mode: EnvState fields that a new trial keeps (episode clock and accumulators); every other
#: field is restored from ``DriveEnv._initial_state`` (the reset code path), including
#: ``last_reward`` (0) and the per-trial flags.
TRIAL_KEEP = ("scenario", "step", "trial_count", "trial_start", "slot_done", "ep_return", "ep_length",
              "goal_reached", "ever_collided", "ever_offroad", "trial_score")


@dataclass
class StepResult:
    """Result of :meth:`DriveEnv.step` (W worlds, C slots, D observation features).

    Attributes:
        obs: [W, C, D] float32 observation of the state after the step.
        reward: [W, C] float32 reward of the action just taken (0 on invalid steps).
        terminal: [W, C] bool, the slot's episode ended with this step (once per active slot).
        truncation: [W, C] bool, trial boundary (trial mode; always False otherwise).
        loss_mask: [W, C] bool, the slot's agent was in play when it acted (train on this step).
        slot_active: [W, C] bool, a controlled agent occupies the slot (after the step).
        removed: [W, C] bool, the slot's agent is removed (after the step).
        stopped: [W, C] bool, the slot's agent is stopped (after the step).
        trial_ended: [W, C] bool, a trial ended (trial mode; always False otherwise).
        info: device tensors: ``goal_reached`` / ``collided`` / ``offroad`` [W, C] bool (events of
            this step, valid steps only), ``truncated`` [W] bool (world truncated early now),
            ``episode_end`` [] bool (this step completed the horizon and reset all worlds).
    """

    obs: torch.Tensor
    reward: torch.Tensor
    terminal: torch.Tensor
    truncation: torch.Tensor
    loss_mask: torch.Tensor
    slot_active: torch.Tensor
    removed: torch.Tensor
    stopped: torch.Tensor
    trial_ended: torch.Tensor
    info: dict = field(default_factory=dict)


class DriveEnv:
    """W synchronous worlds running scenarios of ``pack`` (DESIGN.md section 4, docs/contracts.md).

    Args:
        pack: scenarios (moved to ``device``); its ``config`` must match ``config.data_config()``
            in ``max_agents``, ``max_controlled``, ``init_steps`` and ``grid_k == num_roads``.
        num_worlds: W >= 1.
        config: :class:`~gpusim.config.EnvConfig`.
        device: torch device of all state.
        seed: seed of the env's generator (scenario draws, NEW_GOAL sampling).

    Attributes: ``num_worlds``, ``num_slots`` (C), ``obs_dim`` (D), ``obs_layout``, ``horizon``,
    ``num_actions`` (91 discrete; 2 = action dimension when continuous), ``config``, ``device``,
    ``pack``, ``state``.

    Raises:
        ValueError: pack/config mismatch (the message says what to change), ``num_worlds < 1``,
            an empty pack.

    Trial mode (``goal_behavior = trial``, DESIGN.md section 5, docs/trial.md): an episode is
    ``k_trials`` trials of ``scenario_length`` steps at most; the per-step state machine is
    ``gpusim.kernels.trial.trial_step``; a new trial restores the world from the state saved at the
    episode's reset (:meth:`_initial_state`).
    """

    def __init__(self, pack: ScenarioPack, num_worlds: int, config: EnvConfig = EnvConfig(), device="cpu",
                 seed: int = 0):
        if config.dynamics != Dynamics.CLASSIC:
            raise ValueError(f"unsupported dynamics {config.dynamics}")
        if int(num_worlds) < 1:
            raise ValueError(f"num_worlds must be >= 1, got {num_worlds}")
        if pack.num_scenarios < 1:
            raise ValueError("the scenario pack is empty")
        pc = pack.config
        for name, env_val, pack_val in (
            ("max_agents", config.max_agents, pc.max_agents),
            ("max_controlled", config.max_controlled, pc.max_controlled),
            ("init_steps", config.init_steps, pc.init_steps),
            ("num_roads", config.num_roads, pc.grid_k),
        ):
            if env_val != pack_val:
                pack_name = "grid_k" if name == "num_roads" else name
                raise ValueError(
                    f"EnvConfig.{name}={env_val} but the pack was built with DataConfig.{pack_name}={pack_val}; "
                    f"set EnvConfig({name}={pack_val}) or rebuild the pack with config.data_config()"
                )
        if pack.max_agents != config.max_agents:
            raise ValueError(f"pack tensors have {pack.max_agents} agent slots, EnvConfig.max_agents={config.max_agents}")
        if pack.num_steps <= config.init_steps:
            raise ValueError(f"pack has {pack.num_steps} logged steps, init_steps={config.init_steps}")
        self.config = config
        self.device = torch.device(device)
        self.pack = pack.to(self.device)
        self.num_worlds = int(num_worlds)
        self.num_slots = config.max_controlled
        self.horizon = config.horizon
        self.num_actions = dynamics.NUM_ACTIONS if config.action_space == ActionSpace.DISCRETE else 2
        self.obs_layout = obs_layout(config.num_partners, config.num_roads)
        self.obs_dim = self.obs_layout.obs_dim
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed))
        names = METRIC_NAMES + (trial_metric_names(config.k_trials) if config.trial_mode else ())
        self._metrics = EpisodeMetrics(self.num_worlds, self.num_slots, alpha=config.log_ema_alpha, device=self.device,
                                       names=names)
        self._t = 0  # steps taken in the current (synchronous) episode, host-side
        self.state = self._initial_state(self._draw_scenarios())
        self._obs = None
        # Reused observation buffer [W, C, D] (docs/performance.md): StepResult.obs / reset() return
        # it, so an observation is valid until the next step() or reset() (clone it to keep it). On
        # the torch (CPU) backend only in-play slots are recomputed; slots that left play are zeroed
        # once (_obs_written [W*C] bool marks the slots that may hold non-zero values).
        self._obs_buf = torch.zeros(self.num_worlds, self.num_slots, self.obs_dim, device=self.device)
        self._obs_written = torch.zeros(self.num_worlds * self.num_slots, dtype=torch.bool, device=self.device)

    # ------------------------------------------------------------------ construction helpers
    def _draw_scenarios(self) -> torch.Tensor:
        return torch.randint(self.pack.num_scenarios, (self.num_worlds,), generator=self.generator,
                             device=self.device)

    def _initial_state(self, scenario: torch.Tensor) -> EnvState:
        """The state of every world at the start of an episode of ``scenario`` [W] (int64).

        Deterministic function of ``scenario`` and the pack, so trial mode can restore a world
        exactly as at reset with ``state.where_(mask, self._initial_state(state.scenario))``.
        Poses and presence at log index ``init_steps`` come from ``kernels.reset.reset_agents``.
        """
        p, cfg = self.pack, self.config
        W, A, C, i0 = scenario.shape[0], cfg.max_agents, cfg.max_controlled, cfg.init_steps
        dev = self.device
        s = scenario.to(torch.int64).contiguous()
        pos, heading, speed, present = reset_agents(
            None, s, i0, p.traj_pos, p.traj_heading, p.traj_vel, p.traj_valid, p.agent_exists,
            None, None, None, None)
        controlled = torch.arange(A, device=dev)[None, :] < p.num_controlled[s][:, None]
        zw = lambda dt: torch.zeros(W, dtype=dt, device=dev)  # noqa: E731
        za = lambda: torch.zeros(W, A, dtype=torch.bool, device=dev)  # noqa: E731
        return EnvState(
            scenario=scenario.to(torch.int64).clone(),
            step=zw(torch.int32), trial_count=zw(torch.int32), trial_start=zw(torch.int32),
            world_done=zw(torch.bool),
            pos=pos, heading=heading, speed=speed,
            length=p.agent_length[s].contiguous(), width=p.agent_width[s].contiguous(),
            goal=p.agent_goal[s].contiguous(), agent_type=p.agent_type[s].contiguous(), controlled=controlled, present=present,
            stopped=za(), contact_stopped=za(), removed=za(), goal_reached=za(), ever_collided=za(),
            ever_offroad=za(), collided_now=za(), offroad_now=za(),
            slot_active=controlled[:, :C].contiguous(), slot_done=torch.zeros(W, C, dtype=torch.bool, device=dev),
            ep_return=torch.zeros(W, C, dtype=torch.float32, device=dev),
            ep_length=torch.zeros(W, C, dtype=torch.int32, device=dev),
            last_reward=torch.zeros(W, C, dtype=torch.float32, device=dev),
            trial_goal=torch.zeros(W, C, dtype=torch.bool, device=dev),
            trial_collided=torch.zeros(W, C, dtype=torch.bool, device=dev),
            trial_offroad=torch.zeros(W, C, dtype=torch.bool, device=dev),
            trial_score=torch.zeros(W, C, cfg.k_trials, dtype=torch.bool, device=dev),
        )

    # ------------------------------------------------------------------ public API
    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Start a new episode in every world (new scenarios); returns obs [W, C, D] float32.

        ``seed`` re-seeds the env's generator first (same seed => same scenarios and tensors).
        Episodes in progress are discarded (not counted in :meth:`metrics`).
        """
        if seed is not None:
            self.generator.manual_seed(int(seed))
        self.state = self._initial_state(self._draw_scenarios())
        self._t = 0
        self._obs = self._observe(self.state)
        return self._obs

    def step(self, actions: torch.Tensor) -> StepResult:
        """Advance every world by one step of ``config.dt`` seconds.

        Args:
            actions: discrete: [W, C] integer joint indices in ``[0, 91)``; continuous: [W, C, 2]
                float in ``[-1, 1]`` (acceleration, steering). Every slot must hold a valid action
                (actions of inactive or out-of-play slots are ignored).

        Returns:
            :class:`StepResult` (time alignment in the module docstring).

        Raises:
            ValueError: wrong shape, dtype or device, NaN or out-of-range action (the state is left
                unchanged).
        """
        cfg = self.config
        actions = self._check_actions(actions)
        st = self.state
        W, C = self.num_worlds, cfg.max_controlled

        # 1. who acts
        in_play = st.controlled & st.present & ~st.stopped & ~st.removed & ~st.world_done[:, None]
        play_c = in_play[:, :C].contiguous()
        loss_mask = play_c

        # 2. controlled agents: kinematic bicycle
        accel, steer = dynamics.decode_actions(actions, int(cfg.action_space))
        cpos, chead, cspeed = dynamics.bicycle_step(
            st.pos[:, :C].contiguous(), st.heading[:, :C].contiguous(), st.speed[:, :C].contiguous(),
            st.length[:, :C].contiguous(), accel.contiguous(), steer.contiguous(), play_c, cfg.dt)
        pos = torch.cat([cpos, st.pos[:, C:]], dim=1)
        heading = torch.cat([chead, st.heading[:, C:]], dim=1)
        speed = torch.cat([cspeed, st.speed[:, C:]], dim=1)

        # 3. experts: log replay
        step = st.step + 1
        log_index = cfg.init_steps + (step - st.trial_start)
        replayed = ~st.controlled & ~st.removed
        pos, heading, speed, present = replay(
            pos, heading, speed, st.present, replayed, st.scenario, log_index,
            self.pack.traj_pos, self.pack.traj_heading, self.pack.traj_vel, self.pack.traj_valid)

        # 4. contacts
        collided, offroad = self._contacts(pos, heading, st.length, st.width, present, st.controlled, st.scenario)
        if cfg.collision_behavior == ContactBehavior.REMOVE:
            hit = hit_by(pos, heading, st.length, st.width, present, in_play & collided, cfg.collision_box_scale)
        else:
            hit = torch.zeros_like(collided)

        # 5. events
        self._t += 1
        episode_end = self._t >= self.horizon
        end_w = torch.full((W,), episode_end, dtype=torch.bool, device=self.device)
        ev = events(
            pos.contiguous(), st.goal, speed.contiguous(), st.controlled, in_play, present, collided, offroad, hit,
            st.stopped, st.contact_stopped, st.removed, st.world_done, end_w, st.slot_active, st.slot_done,
            cfg.goal_radius, cfg.reward_goal, cfg.reward_collision, cfg.reward_offroad,
            int(cfg.goal_behavior), int(cfg.collision_behavior), int(cfg.offroad_behavior),
            cfg.stop_truncate_fraction)
        speed = ev.speed
        goal = st.goal
        if cfg.goal_behavior in (GoalBehavior.RESPAWN, GoalBehavior.NEW_GOAL):
            again = ev.goal_now & ~ev.stopped & ~ev.removed
            if cfg.goal_behavior == GoalBehavior.RESPAWN:
                pos, heading, speed = self._respawn(again, st.scenario, pos, heading, speed)
            else:
                goal = self._new_goals(again, st.scenario, pos, heading, goal)

        goal_c = ev.goal_now[:, :C]
        col_c = (in_play & collided)[:, :C]
        off_c = (in_play & offroad)[:, :C]
        ep_return = st.ep_return + ev.reward
        ep_length = st.ep_length + loss_mask.to(torch.int32)
        goal_reached = st.goal_reached | ev.goal_now
        ever_col = st.ever_collided | (in_play & collided)
        ever_off = st.ever_offroad | (in_play & offroad)

        # 6. trial mode (gpusim/kernels/trial.py): goal removal, trial end, terminal / truncation
        zeros_c = torch.zeros(W, C, dtype=torch.bool, device=self.device)
        terminal, truncation, trial_ended = ev.terminal, zeros_c, zeros_c.clone()
        world_done, slot_done, present, removed = ev.world_done, ev.slot_done, ev.present, ev.removed
        trial_count, trial_start = st.trial_count, st.trial_start
        t_goal, t_col, t_off, t_score = st.trial_goal, st.trial_collided, st.trial_offroad, st.trial_score
        info_trial = {}
        if cfg.trial_mode:
            tr = trial_step(
                ev.goal_now, col_c.contiguous(), off_c.contiguous(), ev.removed, ev.present, st.controlled,
                st.slot_active, st.slot_done, st.world_done, ev.truncated, end_w, step, st.trial_start,
                st.trial_count, st.trial_goal, st.trial_collided, st.trial_offroad, st.trial_score,
                cfg.scenario_length, cfg.k_trials)
            terminal, truncation, trial_ended = tr.terminal, tr.truncation, tr.trial_ended
            world_done, slot_done, present, removed = tr.world_done, tr.slot_done, tr.present, tr.removed
            trial_count, trial_start = tr.trial_count, tr.trial_start
            t_goal, t_col, t_off, t_score = tr.trial_goal, tr.trial_collided, tr.trial_offroad, tr.trial_score
            info_trial = {"trial_end": tr.trial_end}

        # 7. finished agent-episodes
        self._metrics.add(
            episode_values(ep_return, ep_length, goal_reached[:, :C], ever_col[:, :C], ever_off[:, :C],
                           extra=t_score.float() if cfg.trial_mode else None), terminal)

        new_state = EnvState(
            scenario=st.scenario, step=step, trial_count=trial_count, trial_start=trial_start,
            world_done=world_done, pos=pos.contiguous(), heading=heading.contiguous(), speed=speed.contiguous(),
            length=st.length, width=st.width, goal=goal.contiguous(), agent_type=st.agent_type, controlled=st.controlled, present=present,
            stopped=ev.stopped, contact_stopped=ev.contact_stopped, removed=removed, goal_reached=goal_reached,
            ever_collided=ever_col, ever_offroad=ever_off, collided_now=collided, offroad_now=offroad,
            slot_active=st.slot_active, slot_done=slot_done, ep_return=ep_return, ep_length=ep_length,
            last_reward=ev.reward, trial_goal=t_goal, trial_collided=t_col, trial_offroad=t_off, trial_score=t_score,
        )
        if episode_end:
            new_state = self._initial_state(self._draw_scenarios())
            self._t = 0
        elif cfg.trial_mode:
            # a new trial: every entity of the world back exactly as at reset (same code path)
            new_state = new_state.where(tr.restart, self._initial_state(st.scenario), keep=TRIAL_KEEP)
        self.state = new_state
        self._obs = self._observe(new_state)
        return StepResult(
            obs=self._obs, reward=ev.reward, terminal=terminal, truncation=truncation, loss_mask=loss_mask,
            slot_active=new_state.slot_active, removed=new_state.removed[:, :C], stopped=new_state.stopped[:, :C],
            trial_ended=trial_ended,
            info={"goal_reached": goal_c, "collided": col_c, "offroad": off_c, "truncated": ev.truncated,
                  "episode_end": torch.tensor(episode_end, device=self.device), **info_trial},
        )

    def expert_actions(self) -> torch.Tensor:
        """Actions that make every controlled agent follow its logged trajectory.

        Inverse dynamics (``dynamics.inverse_bicycle``, a closed-loop tracker) from the current
        simulated state toward the agent's logged pose at the next log index, encoded for the
        action space (``dynamics.encode_actions``). Where the next logged pose is invalid the
        action is zero acceleration and zero steering.

        Returns:
            discrete: [W, C] int64; continuous: [W, C, 2] float32.
        """
        st, cfg, p = self.state, self.config, self.pack
        C = cfg.max_controlled
        T = p.num_steps
        nxt = (cfg.init_steps + (st.step - st.trial_start) + 1).to(torch.int64)
        in_range = nxt < T
        i = nxt.clamp(max=T - 1)
        s = st.scenario
        w = s[:, None]
        c = torch.arange(C, device=self.device)[None, :]
        ii = i[:, None]
        tpos, thead, tvel = p.traj_pos[w, c, ii], p.traj_heading[w, c, ii], p.traj_vel[w, c, ii]
        tvalid = p.traj_valid[w, c, ii] & in_range[:, None]
        accel, steer = dynamics.inverse_bicycle(
            st.pos[:, :C].contiguous(), st.heading[:, :C].contiguous(), st.speed[:, :C].contiguous(),
            st.length[:, :C].contiguous(), tpos.contiguous(), thead.contiguous(),
            torch.linalg.vector_norm(tvel, dim=-1).contiguous(), tvalid.contiguous(), cfg.dt)
        return dynamics.encode_actions(accel, steer, int(cfg.action_space))

    def metrics(self, kind: str = "ema") -> dict[str, float]:
        """Metrics of finished agent-episodes (``episode_return``, ``episode_length``,
        ``goal_reached``, ``collided``, ``offroad``, ``score``; see ``gpusim/metrics.py``).

        ``kind="ema"`` (default, DESIGN.md section 8): each of the W x C slots keeps an EMA
        (``config.log_ema_alpha``) of the episodes that finished in it; returns the mean over the
        slots with data plus ``n`` = their number, never resets, ``{}`` while no slot has data.
        ``kind="mean"``: plain mean over the agent-episodes finished since the last ``"mean"``
        call plus ``n`` = their number (resets; for evaluations). The only host read of the env.

        Raises:
            ValueError: unknown ``kind``.
        """
        return self._metrics.report(kind)

    # ------------------------------------------------------------------ step helpers
    def _check_actions(self, actions) -> torch.Tensor:
        W, C = self.num_worlds, self.num_slots
        if not isinstance(actions, torch.Tensor):
            raise ValueError(f"actions must be a torch.Tensor, got {type(actions).__name__}")
        if actions.device != self.device:
            raise ValueError(f"actions are on {actions.device}, the env on {self.device}")
        if self.config.action_space == ActionSpace.DISCRETE:
            if tuple(actions.shape) != (W, C):
                raise ValueError(f"discrete actions must have shape [W, C] = {(W, C)}, got {tuple(actions.shape)}")
            if actions.is_floating_point() or actions.is_complex() or actions.dtype == torch.bool:
                raise ValueError(f"discrete actions must be an integer tensor, got {actions.dtype}")
            bad = ((actions < 0) | (actions >= dynamics.NUM_ACTIONS)).any()
            if bool(bad):
                lo, hi = int(actions.min()), int(actions.max())
                raise ValueError(f"discrete actions must be in [0, {dynamics.NUM_ACTIONS}), got values in [{lo}, {hi}]")
            return actions.to(torch.int64)
        if tuple(actions.shape) != (W, C, 2):
            raise ValueError(f"continuous actions must have shape [W, C, 2] = {(W, C, 2)}, got {tuple(actions.shape)}")
        if not actions.is_floating_point():
            raise ValueError(f"continuous actions must be a float tensor, got {actions.dtype}")
        a = actions.to(torch.float32)
        nan = torch.isnan(a).any()
        out = (a.abs() > 1.0).any()  # +-inf counted here
        flags = torch.stack([nan, out]).tolist()
        if flags[0]:
            raise ValueError("continuous actions contain NaN")
        if flags[1]:
            raise ValueError("continuous actions must be in [-1, 1]")
        return a

    def _contacts(self, pos, heading, length, width, present, controlled, scenario):
        """(collided, offroad) [W, A] bool of the post-motion state.

        Collisions are tested for the present controlled agents against every present agent
        (``query = present & controlled``): overlaps among experts alone have no effect and are not
        computed, so an expert is flagged only when it overlaps a controlled agent. Offroad is
        tested for the C controlled slots only (experts are never offroad).
        """
        p, C = self.pack, self.num_slots
        collided = collisions(pos, heading, length, width, present, self.config.collision_box_scale,
                              query=present & controlled)
        off_c = offroad(pos[:, :C].contiguous(), heading[:, :C].contiguous(), length[:, :C].contiguous(),
                        width[:, :C].contiguous(), (present & controlled)[:, :C].contiguous(), scenario,
                        p.road_seg, p.grid_edge, p.grid_origin, p.grid_dims, p.cell_size, self.config.offroad_box_scale)
        off = torch.zeros_like(collided)
        off[:, :C] = off_c
        return collided & present, off

    def _respawn(self, mask, scenario, pos, heading, speed):
        """Agents in ``mask`` [W, A] go back to their initial pose (log index ``init_steps``, logged
        speed) with ``kernels.reset.reset_agents``; presence is not changed by a respawn."""
        p = self.pack
        pos, heading, speed, _ = reset_agents(
            mask.contiguous(), scenario, self.config.init_steps, p.traj_pos, p.traj_heading, p.traj_vel,
            p.traj_valid, p.agent_exists, pos.contiguous(), heading.contiguous(), speed.contiguous(), None,
            set_present=False)
        return pos, heading, speed

    def _new_goals(self, mask, scenario, pos, heading, goal):
        """New goals for agents in ``mask`` [W, A] (``kernels.new_goal.new_goal``): the midpoint of
        a lane segment among the agent cell's ``grid_road`` candidates, at least
        ``NEW_GOAL_MIN_AHEAD`` m ahead along the heading and at most ``NEW_GOAL_MAX_DIST`` m away,
        the ``floor(u * n)``-th of the ``n`` qualifying candidates in candidate order with ``u``
        uniform; when none qualifies, ``NEW_GOAL_FALLBACK`` m straight ahead. Every call draws one
        [W, A] uniform ``u`` from the env generator (whether or not an agent reached its goal), so
        the stream is the same on every backend and nothing is read back to the host."""
        p = self.pack
        rand = torch.rand(mask.shape, generator=self.generator, device=self.device)
        return new_goal(
            mask.contiguous(), rand, scenario, pos.contiguous(), heading.contiguous(), goal.contiguous(),
            p.grid_road, p.grid_origin, p.grid_dims, p.cell_size, p.road_seg, p.road_type,
            NEW_GOAL_MIN_AHEAD, NEW_GOAL_MAX_DIST, NEW_GOAL_FALLBACK, lane_type=int(RoadType.LANE))

    def _trial_features(self, st: EnvState):
        """Trial ego features [W, C] float32 each: trial index ``trial_count / k_trials`` and time in
        trial ``(step - trial_start) / scenario_length`` (both in [0, 1]; 0 outside trial mode)."""
        zeros = torch.zeros_like(st.last_reward)
        if not self.config.trial_mode:
            return zeros, zeros
        cfg = self.config
        t_index = (st.trial_count.to(torch.float32) / cfg.k_trials)[:, None] + zeros
        t_time = ((st.step - st.trial_start).to(torch.float32) / cfg.scenario_length)[:, None] + zeros
        return t_index, t_time

    def _observe(self, st: EnvState) -> torch.Tensor:
        """Observations [W, C, D] of ``st``; ego extras in the order of ``observations.EGO_EXTRA``."""
        C = self.num_slots
        t_index, t_time = self._trial_features(st)
        ego_extra = torch.stack([st.collided_now[:, :C].float(), st.offroad_now[:, :C].float(), t_index, t_time,
                                 st.last_reward], dim=-1)
        cfg, p = self.config, self.pack
        active = (st.slot_active & st.present[:, :C]).contiguous()
        buf, rows, obs_fn = self._obs_buf, None, observations
        if backend_for(st.pos) == "torch":
            if cfg.compile:  # opt-in torch.compile'd CPU path (EnvConfig.compile, docs/performance.md)
                obs_fn = observations_compiled
            # compaction (no device sync on CPU): compute only the in-play slots, zero the slots
            # that were written before and are out of play now, leave the other zeros alone
            flat = active.view(-1)
            rows = flat.nonzero().squeeze(1)
            stale = (self._obs_written & ~flat).nonzero().squeeze(1)
            buf.view(-1, self.obs_dim).index_fill_(0, stale, 0.0)
        obs_fn(
            st.pos, st.heading, st.speed, st.length, st.width, st.agent_type, st.present,
            st.goal[:, :C].contiguous(), ego_extra, active, st.scenario,
            p.road_seg, p.road_type, p.grid_road, p.grid_origin, p.grid_dims, p.cell_size,
            cfg.num_partners, cfg.partner_radius, cfg.road_radius, out=buf, rows=rows)
        self._obs_written = active.view(-1).clone()  # inactive slots are all zero now
        return buf
