"""Rollout collection into device buffers shaped [rows, horizon] (docs/design.md section 12).

One row is one episode of one agent slot: ``rows = W * C`` (row ``w * C + c`` is slot ``c`` of world
``w``) and ``horizon = env.horizon``. The env's episodes are synchronous and last exactly
``horizon`` steps, the step that completes an episode auto-resets every world, so collecting
``horizon`` steps from the first observation of an episode fills exactly one episode per row, and
the observation returned by the last step is the first one of the next rollout.

Time alignment (docs/contracts.md, binding): column ``t`` holds ``obs[t]`` (the input of action
``a_t``), ``removed[t]`` (the agent was out of play when ``obs[t]`` was taken: the previous step's
``removed``, ``False`` at the row start), and the result of ``env.step(a_t)``: ``reward[t]``,
``terminal[t]``, ``truncation[t]``, ``loss_mask[t]``. Then

    bootstrap_stop[t] = terminal[t] | truncation[t] | removed[t] | ~loss_mask[t + 1]   (last column: True)

The policy's memory (KV cache) is cleared for every slot at the row start and per slot after a
terminal step; a truncation (trial boundary) keeps it.

Roles (population play; ``EnvState.ego``): the rows of co-player slots are driven by
frozen partners (``coplayers``, a :class:`train.coplayer.CoplayerPool`) whose actions replace the
ego policy's in the executed action tensor; those rows get ``loss_mask = 0`` and
``slot_active = False``, so they never enter the loss, the advantage normalisation, the
optimizer-step count or the step count. Without co-players every active slot is an ego and nothing
changes. :class:`TrialLog` counts trial ends per world for the trial logs of a report.

Nothing here reads device tensors to the host.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from gpusim.kernels.clocks import trial_time

#: Per-step fields of :class:`RolloutBatch` ([rows, horizon, ...]).
STEP_FIELDS = (
    "obs", "actions", "logprobs", "values", "rewards", "terminal", "truncation", "loss_mask", "removed",
    "goal_reached",
)
#: Per-row fields of :class:`RolloutBatch` ([rows]).
ROW_FIELDS = ("scenario", "agent_type", "slot_active")


@dataclass
class RolloutBatch:
    """Experience of one rollout, all on the env's device.

    Attributes (R = rows = W * C, H = horizon):
        obs: [R, H, D] float32 observations (inputs of the actions).
        actions: [R, H] int64 (discrete) or [R, H, 2] float32 (continuous).
        logprobs: [R, H] float32 behaviour-policy log-probabilities of ``actions``.
        values: [R, H] float32 value estimates at collection time.
        rewards: [R, H] float32 reward of the action at column t.
        terminal, truncation: [R, H] bool, episode end / trial boundary after the action at t.
        loss_mask: [R, H] bool, column t may train the policy.
        removed: [R, H] bool, agent was out of play when ``obs[t]`` was taken.
        goal_reached: [R, H] bool, the agent reached its goal with the action at column t
            (``StepResult.info["goal_reached"]``; all False if the env does not report it).
        scenario: [R] int64 pack index of the row's scenario.
        agent_type: [R] int64 ``ObjectType`` code of the row's agent (-1 for an empty slot).
        slot_active: [R] bool, a controlled agent occupies the slot in this episode.
    """

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor
    rewards: torch.Tensor
    terminal: torch.Tensor
    truncation: torch.Tensor
    loss_mask: torch.Tensor
    removed: torch.Tensor
    goal_reached: torch.Tensor
    scenario: torch.Tensor
    agent_type: torch.Tensor
    slot_active: torch.Tensor

    @property
    def rows(self) -> int:
        """R."""
        return self.rewards.shape[0]

    @property
    def horizon(self) -> int:
        """H."""
        return self.rewards.shape[1]

    @property
    def device(self) -> torch.device:
        return self.rewards.device

    def replace(self, **changes) -> "RolloutBatch":
        """A shallow copy with some fields replaced."""
        return dataclasses.replace(self, **changes)

    def bootstrap_stop(self) -> torch.Tensor:
        """[R, H] bool: ``terminal | truncation | removed | ~loss_mask[t + 1]`` (last column True),
        as docs/contracts.md defines it."""
        nxt = torch.ones_like(self.loss_mask)  # the last column stays True
        nxt[:, :-1] = ~self.loss_mask[:, 1:]
        return self.terminal | self.truncation | self.removed | nxt

    @classmethod
    def empty(cls, rows: int, horizon: int, obs_dim: int, continuous: bool, action_dim: int, device) -> "RolloutBatch":
        """Allocate buffers (zeros / False)."""
        z = lambda *s, dt=torch.float32: torch.zeros(*s, dtype=dt, device=device)  # noqa: E731
        actions = z(rows, horizon, action_dim) if continuous else z(rows, horizon, dt=torch.int64)
        return cls(
            obs=z(rows, horizon, obs_dim), actions=actions, logprobs=z(rows, horizon), values=z(rows, horizon),
            rewards=z(rows, horizon), terminal=z(rows, horizon, dt=torch.bool),
            truncation=z(rows, horizon, dt=torch.bool), loss_mask=z(rows, horizon, dt=torch.bool),
            removed=z(rows, horizon, dt=torch.bool), goal_reached=z(rows, horizon, dt=torch.bool),
            scenario=z(rows, dt=torch.int64), agent_type=z(rows, dt=torch.int64), slot_active=z(rows, dt=torch.bool),
        )

    @classmethod
    def for_env(cls, env, continuous: bool, device=None) -> "RolloutBatch":
        """:meth:`empty` buffers for one rollout of ``env``: ``rows = W * C``, ``horizon =
        env.horizon``, ``env.obs_dim``; actions [R, H, ``env.num_actions``] float32 if
        ``continuous`` else [R, H] int64. ``device`` defaults to ``env.device``.

        The size is worked out first (the same buffers on the ``meta`` device, which allocates
        nothing) and compared with the memory free on ``device``.

        Raises:
            UserError: the buffers need more memory than is free (names the size, its factors and
                the flags that set them) instead of the allocator's raw error.
        """
        rows = env.num_worlds * env.num_slots
        action_dim = env.num_actions if continuous else 1
        device = torch.device(env.device if device is None else device)
        need = cls.empty(rows, env.horizon, env.obs_dim, continuous, action_dim, "meta").nbytes()
        free = free_memory(device)
        if free is not None and need > free:
            from train.config import UserError

            cfg = env.config
            trials = f" = {cfg.k_trials} trials x {cfg.scenario_length} steps" if cfg.trial_mode else ""
            raise UserError(f"the rollout needs {need / 2**30:.1f} GiB ({env.num_worlds} worlds x {env.num_slots} slots x "
                            f"horizon {env.horizon}{trials} x {env.obs_dim} observation floats, plus actions and "
                            f"flags), more than the {free / 2**30:.1f} GiB free on {device}: lower --env.k-trials, "
                            "--env.scenario-length, --num-worlds or --env.max-controlled")
        return cls.empty(rows, env.horizon, env.obs_dim, continuous, action_dim, device)

    def nbytes(self) -> int:
        """Bytes of all the buffers (their shapes and dtypes; also for ``meta`` tensors)."""
        return sum(t.numel() * t.element_size() for t in dataclasses.astuple(self) if isinstance(t, torch.Tensor))


def free_memory(device) -> int | None:
    """Bytes free for new tensors on ``device``: ``torch.cuda.mem_get_info`` on CUDA, the OS's
    ``MemAvailable`` (``/proc/meminfo``) on the CPU; None where it cannot be known."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def trial_clock(state) -> torch.Tensor:
    """[W] int64: each world's step count in its current trial once the step about to be taken from
    ``state`` (an :class:`~gpusim.state.EnvState` before the step) is counted, ``step + 1 -
    trial_start``: the env's own trial clock (gpusim/kernels/trial.py times a trial out when it
    reaches ``scenario_length``), read, not kept a second time. Only meaningful for a world whose
    episode is still running (``world_done`` False in ``state``)."""
    return trial_time(state.step, state.trial_start).to(torch.int64) + 1


class TrialLog:
    """Per-world device counters of the trials that ended (trial mode): the trainer's trial log
    (read at report time, :meth:`report`) and the evaluator's per world-episode trial columns
    (``train/eval/sweep.py``: :attr:`trials`, :attr:`ended_early`, :attr:`steps`), one count.

    At each world trial end (``StepResult.info["trial_end"]``) the trial counts as *ended early*
    when it ended before the per-trial timeout (every active controlled agent removed, by goal or
    REMOVE, or a STOP truncation) and else as *timeout*; its length (:func:`trial_clock`) is added.

    Args:
        num_worlds: W. timeout: the per-trial timeout (``EnvConfig.scenario_length``). device.
    """

    def __init__(self, num_worlds: int, timeout: int, device):
        self.timeout = int(timeout)
        # [3, W] int64: trials ended, ended early, steps of the ended trials, per world
        self.counts = torch.zeros(3, int(num_worlds), dtype=torch.int64, device=device)

    @property
    def trials(self) -> torch.Tensor:
        """[W] int64 trials ended per world since the last :meth:`report` (a view)."""
        return self.counts[0]

    @property
    def ended_early(self) -> torch.Tensor:
        """[W] int64 of those, the trials that ended before the timeout (a view)."""
        return self.counts[1]

    @property
    def steps(self) -> torch.Tensor:
        """[W] int64 steps of the ended trials, summed (a view)."""
        return self.counts[2]

    def step(self, state_before, trial_end: torch.Tensor) -> None:
        """After one env step: ``state_before``, the :class:`~gpusim.state.EnvState` the step started
        from (the env's clock is read from it); ``trial_end`` [W] bool."""
        length = trial_clock(state_before)
        early = trial_end & (length < self.timeout)
        self.counts += torch.stack([trial_end.to(torch.int64), early.to(torch.int64), torch.where(trial_end, length, 0)])

    def report(self) -> dict[str, float]:
        """``trial_log/completed``, ``/ended_early``, ``/ended_by_timeout`` (trials since the last
        report) and ``/mean_length`` (steps); resets the counters; ``{}`` when no trial ended."""
        n, early, steps = self.counts.sum(dim=1).tolist()
        self.counts.zero_()
        if n == 0:
            return {}
        return {"trial_log/completed": float(n), "trial_log/ended_early": float(early),
                "trial_log/ended_by_timeout": float(n - early), "trial_log/mean_length": steps / n}


@torch.no_grad()
def collect_rollout(env, policy, obs: torch.Tensor, buffer: RolloutBatch, cache, deterministic: bool = False,
                    coplayers=None, trial_log: TrialLog | None = None):
    """Run one episode (``env.horizon`` steps) of every world and fill ``buffer``.

    Args:
        env: a :class:`gpusim.env.DriveEnv` (or an object with the same API) whose current
            episode has just started (``obs`` is its first observation).
        policy: :class:`policy.ActorCritic` (acting through a :class:`policy.actor.Actor` on ``cache``).
        obs: [W, C, D] first observation of the episode.
        buffer: :class:`RolloutBatch` with ``rows = W * C`` and ``horizon = env.horizon``; filled
            in place.
        cache: the policy's KV cache for W * C slots (cleared here at the row start).
        deterministic: take argmax / mean actions instead of sampling.
        coplayers: optional :class:`train.coplayer.CoplayerPool` driving the co-player slots
            (``env.state.ego`` False); its rows are masked out of training (module docstring).
        trial_log: optional :class:`TrialLog` fed with the trial ends (trial mode).

    Returns:
        ``(next_obs [W, C, D], buffer)``: the first observation of the next episode.

    The CUDA-graph variant (same results, steady-state steps replayed from a graph) is
    :class:`train.graphed_rollout.GraphedRollout`.
    """
    from policy.actor import Actor

    actor = Actor(policy, device=obs.device, deterministic=deterministic, cache=cache)
    ego = begin_rollout(env, actor, buffer, coplayers)
    for t in range(buffer.horizon):
        obs = rollout_step(env, actor, t, obs, buffer, ego, coplayers, trial_log)
    return obs, buffer


def begin_rollout(env, actor, buffer: RolloutBatch, coplayers=None):
    """The start of :func:`collect_rollout`: a new episode for the ``actor``
    (:class:`policy.actor.Actor`: memory cleared, nothing removed), the per-row fields of
    ``buffer`` (scenario, agent type, active slots), the co-players started.

    Returns:
        ``ego`` [R] bool, the roles of this episode's slots (a copy), or None (every slot an ego).
    """
    W, C = env.num_worlds, env.num_slots
    R = W * C
    actor.begin()
    state = getattr(env, "state", None)
    ego = None  # [R] bool roles of this episode (None: every slot is an ego)
    if state is not None and getattr(state, "scenario", None) is not None:
        scen = state.scenario
        buffer.scenario.copy_(scen.repeat_interleave(C))
        pack = getattr(env, "pack", None)
        if pack is not None:
            buffer.agent_type.copy_(pack.agent_type[scen, :C].to(torch.int64).reshape(R))
        if getattr(state, "ego", None) is not None:
            ego = state.ego.reshape(R).clone()
        active = state.slot_active.reshape(R)
        buffer.slot_active.copy_(active if ego is None else active & ego)
    if coplayers is not None:
        coplayers.begin(env)
    return ego


def rollout_step(env, actor, t: int, obs: torch.Tensor, buffer: RolloutBatch, ego: torch.Tensor | None,
                 coplayers=None, trial_log: TrialLog | None = None) -> torch.Tensor:
    """One eager step of :func:`collect_rollout` at column ``t``: the ``actor``
    (:class:`policy.actor.Actor` over the R = W * C slots) acts on ``obs`` [W, C, D], the env
    steps, column ``t`` of ``buffer`` is written and the actor observes the result (removed
    flags, memory cleared at terminals). Returns the next observation [W, C, D]."""
    W, C = env.num_worlds, env.num_slots
    o = obs.reshape(W * C, -1)
    act = actor.act(o)
    action = act.action
    if coplayers is not None:
        action = coplayers.act(o, action)

    def put(name: str, value: torch.Tensor) -> None:
        getattr(buffer, name)[:, t] = value
    record_action(put, actor, o, act, action)
    before = env.state  # (stages return new tensors: this state stays as it was)
    res = env.step(actor.env_action(action.reshape(W, C, *action.shape[1:])))
    record_result(put, actor, res, ego)
    if coplayers is not None:
        coplayers.observe(res)
    if trial_log is not None and "trial_end" in res.info:
        trial_log.step(before, res.info["trial_end"])
    return res.obs


def record_action(put, actor, o: torch.Tensor, act, action: torch.Tensor) -> None:
    """The acting half of a rollout step's column (the eager step and the captured graph's step
    both write through this): ``put(field, [R, ...] value)`` of the observation ``o`` [R, D], the
    removed flags the actor acted with, the value, the action taken and its log-probability."""
    put("obs", o)
    put("removed", actor.removed)  # the flags this step acted with (observe updates them)
    put("values", act.value)
    put("actions", action)
    put("logprobs", actor.policy.log_prob(act.logits, action))


def record_result(put, actor, res, ego: torch.Tensor | None) -> None:
    """The result half of a rollout step's column: reward, terminal and truncation flags, the loss
    mask (``& ego`` [R] bool when only ego slots learn), the goal flags when the env reports them,
    then the actor observes the result (removed flags; memory cleared by ``memory_reset``)."""
    R = res.reward.numel()
    put("rewards", res.reward.reshape(R))
    put("terminal", res.terminal.reshape(R))
    put("truncation", res.truncation.reshape(R))
    loss_mask = res.loss_mask.reshape(R)
    put("loss_mask", loss_mask if ego is None else loss_mask & ego)
    goal = res.info.get("goal_reached") if isinstance(getattr(res, "info", None), dict) else None
    if goal is not None:
        put("goal_reached", goal.reshape(R))
    actor.observe(res.terminal.reshape(R), res.removed.reshape(R), res.truncation.reshape(R))
