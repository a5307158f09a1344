"""The deterministic evaluation sweep: every scenario the same number of times, in a fixed order.

* :func:`sweep_plan` lays out ``S x N`` world-episodes (scenario ``s``, repetition ``r``) in the
  order ``r = 0: s = 0 .. S-1, r = 1: ...`` and cuts them into batches of ``W`` worlds; the last
  batch is padded with scenarios from the start of the plan whose results are dropped
  (``real = False``). No draws with replacement: each scenario runs exactly ``N`` times.
* each batch starts with ``DriveEnv.reset(scenarios=...)`` ([W] pack indices: world ``w`` runs
  ``scenarios[w]``); the env's own auto-reset at the end of an episode is overridden that way.
* Drivers produce actions: :class:`CallableDriver` wraps an ``act(env) -> actions`` baseline,
  :class:`PolicyDriver` a trained :class:`policy.ActorCritic` (KV-cache memory, argmax by default).
* :func:`run_sweep` runs every batch for one full episode (``env.horizon`` steps) and returns one
  record per ego agent-episode (:data:`AGENT_COLUMNS`) and one per world-episode
  (:data:`WORLD_COLUMNS`), read to the host once per batch. The metrics of the registry
  (``gpusim.metrics.METRICS``) are the rows the env publishes for each finished agent-episode
  (``EpisodeMetrics.last``), not accumulated again here; the evaluator accumulates only its own
  columns (trial goal steps, decoys, the trial log per world-episode, style probes) from the
  :class:`~gpusim.env.StepResult` s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from train.eval.styles import StyleProbe

#: Per agent-episode placement columns of :func:`run_sweep`; the metric columns follow them: those of
#: the registry (``gpusim.metrics.METRICS``, read from the env's published rows), then the
#: evaluator's own (trial goal steps, decoys, style probes).
AGENT_COLUMNS = ("scenario", "world", "slot", "repetition")
#: Per world-episode columns of :func:`run_sweep` (trial mode only; else empty).
WORLD_COLUMNS = ("scenario", "repetition", "trials", "trials_ended_early", "trial_steps")


@dataclass(frozen=True)
class SweepPlan:
    """Batches of world-episodes: ``scenarios[b]`` / ``repetition[b]`` [W] int64, ``real[b]`` [W]
    bool (False = padding world whose results are dropped). ``num_scenarios`` S, ``episodes`` N."""

    scenarios: tuple
    repetition: tuple
    real: tuple
    num_scenarios: int
    episodes: int

    @property
    def num_worlds(self) -> int:
        return int(self.scenarios[0].numel())


def default_num_worlds(total: int, max_worlds: int = 32) -> int:
    """Worlds per batch for ``total`` world-episodes: at most ``max_worlds``, spread evenly over
    ``ceil(total / max_worlds)`` batches so the last batch wastes the fewest padding worlds."""
    if total < 1 or max_worlds < 1:
        raise ValueError(f"default_num_worlds: total and max_worlds must be >= 1, got {total}, {max_worlds}")
    batches = math.ceil(total / max_worlds)
    return math.ceil(total / batches)


def sweep_plan(num_scenarios: int, episodes: int, num_worlds: int) -> SweepPlan:
    """The deterministic sweep (module docstring): ``num_scenarios x episodes`` world-episodes in
    batches of ``num_worlds``.

    Raises:
        ValueError: a size below 1.
    """
    S, N, W = int(num_scenarios), int(episodes), int(num_worlds)
    if S < 1 or N < 1 or W < 1:
        raise ValueError(f"sweep_plan: scenarios, episodes and worlds must be >= 1, got {S}, {N}, {W}")
    flat_s = torch.arange(S).repeat(N)
    flat_r = torch.arange(N).repeat_interleave(S)
    total = S * N
    batches = math.ceil(total / W)
    pad = batches * W - total
    idx = torch.cat([torch.arange(total), torch.arange(pad) % total])
    real = torch.arange(batches * W) < total
    return SweepPlan(
        scenarios=tuple(flat_s[idx].view(batches, W).unbind(0)),
        repetition=tuple(flat_r[idx].view(batches, W).unbind(0)),
        real=tuple(real.view(batches, W).unbind(0)),
        num_scenarios=S, episodes=N)


# ----------------------------------------------------------------------------- env
def make_sweep_env(pack, num_worlds: int, config, device, seed: int):
    """The :class:`gpusim.env.DriveEnv` of a sweep (its ``reset(scenarios=...)`` sets each world's
    scenario).

    Raises:
        ValueError: what ``DriveEnv`` raises (pack/config mismatch, ...).
    """
    from gpusim.env import DriveEnv

    return DriveEnv(pack, num_worlds, config=config, device=device, seed=seed)


# ----------------------------------------------------------------------------- drivers
class Driver(Protocol):
    """Produces the actions of every slot, one env step at a time."""

    def begin(self, env, obs: torch.Tensor) -> None:
        """A new episode starts in every world (``obs`` [W, C, D] its first observation)."""

    def act(self, env, obs: torch.Tensor) -> torch.Tensor:
        """Actions for ``env.step``: [W, C] int64 or [W, C, 2] float32."""

    def observe(self, env, result) -> None:
        """The :class:`~gpusim.env.StepResult` of the actions just returned."""


class CoplayerDriver:
    """An ego :class:`Driver` plus a :class:`train.coplayer.CoplayerPool` driving the co-player slots
    (``EnvState.ego`` False): the pool draws a partner per world at every :meth:`begin` and its
    actions replace the ego driver's in the co-player slots."""

    def __init__(self, ego, pool):
        self.ego, self.pool = ego, pool

    def begin(self, env, obs):
        self.ego.begin(env, obs)
        self.pool.begin(env)

    def act(self, env, obs):
        a = self.ego.act(env, obs)
        W, C = env.num_worlds, env.num_slots
        merged = self.pool.act(obs.reshape(W * C, -1), a.reshape(W * C, *a.shape[2:]))
        return merged.reshape(a.shape)

    def observe(self, env, result):
        self.ego.observe(env, result)
        self.pool.observe(result)


class CallableDriver:
    """A stateless ``act(env) -> actions`` callable (e.g. a baseline of ``train/baselines.py``)."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def begin(self, env, obs):
        pass

    def act(self, env, obs):
        return self.fn(env)

    def observe(self, env, result):
        pass


class PolicyDriver:
    """A trained :class:`policy.ActorCritic` acting through a :class:`policy.actor.Actor` (KV-cache
    memory), as in ``train/rollout.py``.

    Memory is cleared for every slot at :meth:`begin` and per slot after a terminal; a trial
    boundary (truncation) keeps it, unless ``memory="trial"`` (the memoryless control: cleared at
    every trial start too). Steps where the agent was removed are passed as removed.

    Args:
        policy: the model (put in eval mode). deterministic: ``True`` / ``"argmax"``: argmax
            (discrete) / mean (continuous) actions; ``"mean"``: the rounded expected value per
            action dimension (``ActorCritic.sample``); ``False``: sampled with torch's global generator. memory: ``"episode"`` or
            ``"trial"``; ``None`` (default): the policy's own ``config.memory``. temperature: of the
            sampled actions (``ActorCritic.sample``; 1 = the policy's own distribution).
    """

    def __init__(self, policy, deterministic: bool | str = True, memory: str | None = None, temperature: float = 1.0):
        self.policy = policy.eval()
        self.deterministic = deterministic
        self.temperature = float(temperature)
        self.memory = memory
        self.actor = None  # built at the first begin (W * C slots of the env, env.horizon steps)

    def begin(self, env, obs):
        from policy.actor import Actor

        R = env.num_worlds * env.num_slots
        if self.actor is None or self.actor.num_slots != R:
            self.actor = Actor(self.policy, R, env.horizon, obs.device, self.deterministic,
                               reset_at_trial=None if self.memory is None else self.memory == "trial",
                               temperature=self.temperature)
        self.actor.begin()

    def act(self, env, obs):
        W, C = env.num_worlds, env.num_slots
        action = self.actor.act(obs.reshape(W * C, -1)).action
        return self.actor.env_action(action.reshape(W, C, *action.shape[1:]))

    def observe(self, env, result):
        R = env.num_worlds * env.num_slots
        self.actor.observe(result.terminal.reshape(R), result.removed.reshape(R), result.truncation.reshape(R))


# ----------------------------------------------------------------------------- the sweep
def _self_play_egos(env) -> torch.Tensor:
    return env.state.slot_active.clone()


@torch.no_grad()
def run_episode(env, driver: Driver, scenarios: torch.Tensor, egos: Callable = _self_play_egos) -> dict:
    """One synchronous episode (``env.horizon`` steps) of every world, world ``w`` on ``scenarios[w]``.

    Args:
        env: an env from :func:`make_sweep_env`. driver: :class:`Driver`.
        scenarios: [W] int64 pack indices.
        egos: ``egos(env) -> [W, C] bool`` slots whose agent-episodes are recorded (called right
            after the reset; default: every active slot). On the memory task the agents it leaves
            out (too few candidate places, :func:`gpusim.sim.candidates.task_slots`) are never
            recorded, as egos or co-players.

    Returns:
        Device tensors: ``ego`` [W, C] bool; ``coplayer`` [W, C] bool (active slots that are not
        egos: co-players, recorded with their role); ``metrics``: ``{name: [W, C] float32}``, every
        column of the registry (``gpusim.metrics.METRICS``) as the env published it for the
        agent-episode that finished in the slot (``EpisodeMetrics.last``, ego or co-player log by
        the env's roles; NaN for a slot where none finished); in trial mode also ``trial_goal``
        [W, C, K] bool (``trial_k_score`` of ``metrics``)
        (on the memory task also ``trial_decoy`` [W, C, K] bool: reached a wrong candidate in trial k),
        ``trials``, ``trials_ended_early``, ``trial_steps`` [W] int64, ``trial_goal_step`` [W, C, K]
        int64 (step within trial k, 1-based, at which the goal was reached; -1 = not reached);
        with reward conditioning also ``mean_speed``, ``min_gap`` [W, C] float32
        (:class:`train.eval.styles.StyleProbe`).
    """
    from gpusim.sim.candidates import task_slots
    from train.rollout import TrialLog, trial_clock

    cfg = env.config
    logs = (env.episode_metrics, env.sim.coplayer_metrics)
    for log in logs:
        if log is not None:
            log.clear_last()
    obs = env.reset(scenarios=scenarios.to(env.device))
    ego = egos(env).to(torch.bool)
    coplayer = env.state.slot_active & ~ego
    if int(cfg.goal_candidates) >= 2:  # the memory task leaves out agents with too few candidate places
        task = task_slots(env.sim, env.state)
        ego, coplayer = ego & task, coplayer & task
    env_ego = env.state.ego.clone()  # the log each slot's episode goes to (the env's roles)
    driver.begin(env, obs)
    W, C, dev = env.num_worlds, env.num_slots, env.device
    trial = bool(cfg.trial_mode)
    K = int(cfg.k_trials) if trial else 1
    td = torch.zeros(W, C, K, dtype=torch.bool, device=dev)
    decoys = trial and int(cfg.goal_candidates) >= 2  # the memory task: per-trial decoy flags
    log = TrialLog(W, cfg.scenario_length, dev)  # the trial ends per world, counted as the trainer counts them
    gstep = torch.full((W, C, K), -1, dtype=torch.int64, device=dev)
    probe = StyleProbe(env) if cfg.reward_conditioning else None  # mean_speed, min_gap (driving styles)
    for _ in range(env.horizon):
        before = env.state  # the env's trial clock is read from the state a step starts from
        res = env.step(driver.act(env, obs))
        if trial:
            g = res.info["goal_reached"]
            cur = torch.nn.functional.one_hot(log.trials.clamp_max(K - 1), K).to(torch.bool)[:, None, :]
            if decoys:
                td |= res.info["decoy_reached"][..., None] & cur
            clock = trial_clock(before)  # steps of the current trial, this one included
            gstep = torch.where(g[..., None] & cur & (gstep < 0), clock[:, None, None], gstep)
            log.step(before, res.info["trial_end"])
        if probe is not None:
            probe.step(env, res)
        driver.observe(env, res)
        obs = res.obs
    # the rows the env published for the episodes that finished in each slot (gpusim/metrics.py)
    last = logs[0].last if logs[1] is None else torch.where(env_ego[..., None], logs[0].last, logs[1].last)
    metrics = {name: last[..., i] for i, name in enumerate(logs[0].names)}
    out = {"ego": ego, "coplayer": coplayer, "metrics": metrics}
    if probe is not None:
        out.update(probe.columns())
    if trial:
        out.update(trial_goal=torch.stack([metrics[f"trial_{k}_score"] > 0 for k in range(K)], dim=-1),
                   trials=log.trials, trials_ended_early=log.ended_early, trial_steps=log.steps, trial_goal_step=gstep)
        if decoys:
            out["trial_decoy"] = td
    return out


def episode_records(ep: dict, scenarios: torch.Tensor, repetition: torch.Tensor,
                    real: torch.Tensor) -> tuple[dict, dict]:
    """Host records of one :func:`run_episode` result (the batch's one host read).

    Returns:
        ``(agents, worlds)``: dicts of 1-D CPU tensors, one entry per recorded agent-episode, egos
        and co-players (:data:`AGENT_COLUMNS` + the registry's metrics + ``ego`` (1 ego, 0
        co-player) + ``trial_k_score`` /
        ``trial_k_clean_score`` / ``trial_k_goal_step`` (/ ``trial_k_decoy`` on the memory task); the
        score columns are float 0/1) and per
        real world-episode (:data:`WORLD_COLUMNS`, trial mode only). Summaries use the ego rows
        only (:func:`ego_rows`).
    """
    ego = ep["ego"]
    W, C = ego.shape
    dev = ego.device
    keep = (ego | ep.get("coplayer", torch.zeros_like(ego))) & real.to(dev)[:, None]
    wi = torch.arange(W, device=dev)[:, None].expand(W, C)
    ci = torch.arange(C, device=dev)[None, :].expand(W, C)
    cols = {
        "scenario": scenarios.to(dev)[:, None].expand(W, C), "world": wi, "slot": ci,
        "repetition": repetition.to(dev)[:, None].expand(W, C),
        **{k: v for k, v in ep["metrics"].items() if not k.startswith("trial_")}, "ego": ego,
    }
    for name in ("mean_speed", "min_gap", "time_to_goal"):  # driving styles (train/eval/styles.py)
        if name in ep:
            cols[name] = ep[name]
    if "trial_goal" in ep:
        for k in range(ep["trial_goal"].shape[-1]):
            cols.update({n: v for n, v in ep["metrics"].items() if n.startswith(f"trial_{k}_")})
            cols[f"trial_{k}_goal_step"] = ep["trial_goal_step"][..., k]
            if "trial_decoy" in ep:
                cols[f"trial_{k}_decoy"] = ep["trial_decoy"][..., k]
    agents = {k: v[keep].cpu() for k, v in cols.items()}
    for k, v in agents.items():
        if v.dtype == torch.bool:
            agents[k] = v.to(torch.float32)
    worlds = {}
    if "trials" in ep:
        r = real.to(dev)
        worlds = {"scenario": scenarios.to(dev)[r].cpu(), "repetition": repetition.to(dev)[r].cpu(),
                  **{k: ep[k][r].cpu() for k in ("trials", "trials_ended_early", "trial_steps")}}
    return agents, worlds


def ego_rows(agents: dict) -> dict:
    """The ego agent-episodes of :func:`episode_records` / :func:`run_sweep` columns."""
    if not agents or "ego" not in agents:
        return agents
    m = agents["ego"] > 0
    return {k: v[m] for k, v in agents.items()}


def run_sweep(env, driver: Driver, plan: SweepPlan, egos: Callable = _self_play_egos,
              on_batch: Callable | None = None) -> tuple[dict, dict]:
    """Run every batch of ``plan`` (:func:`run_episode`) and concatenate :func:`episode_records`.

    Args:
        env: from :func:`make_sweep_env` with ``plan.num_worlds`` worlds. driver: :class:`Driver`.
        plan: :func:`sweep_plan`. egos: see :func:`run_episode`.
        on_batch: called with the number of real world-episodes after each batch (progress).

    Returns:
        ``(agents, worlds)`` dicts of concatenated 1-D CPU tensors (see :func:`episode_records`).

    Raises:
        ValueError: the env's world count differs from the plan's.
    """
    if env.num_worlds != plan.num_worlds:
        raise ValueError(f"run_sweep: env has {env.num_worlds} worlds, the plan {plan.num_worlds}")
    agents, worlds = [], []
    for scen, rep, real in zip(plan.scenarios, plan.repetition, plan.real):
        a, w = episode_records(run_episode(env, driver, scen, egos), scen, rep, real)
        agents.append(a)
        worlds.append(w)
        if on_batch is not None:
            on_batch(int(real.sum()))
    return _cat(agents), _cat(worlds)


def _cat(parts: list[dict]) -> dict:
    """Column-wise concatenation of record dicts (``{}`` when there are none)."""
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]} if parts and parts[0] else {}
