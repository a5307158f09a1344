"""Rollout collection into device buffers shaped [rows, horizon] (DESIGN.md section 7).

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

Nothing here reads device tensors to the host.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

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
        nxt = torch.ones_like(self.loss_mask)
        nxt[:, :-1] = ~self.loss_mask[:, 1:]
        nxt[:, -1] = True
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


@torch.no_grad()
def collect_rollout(env, policy, obs: torch.Tensor, buffer: RolloutBatch, cache, deterministic: bool = False):
    """Run one episode (``env.horizon`` steps) of every world and fill ``buffer``.

    Args:
        env: a :class:`gpusim.env.DriveEnv` (or an object with the same API) whose current
            episode has just started (``obs`` is its first observation).
        policy: :class:`policy.ActorCritic`.
        obs: [W, C, D] first observation of the episode.
        buffer: :class:`RolloutBatch` with ``rows = W * C`` and ``horizon = env.horizon``; filled
            in place.
        cache: the policy's KV cache for W * C slots (cleared here at the row start).
        deterministic: take argmax / mean actions instead of sampling.

    Returns:
        ``(next_obs [W, C, D], buffer)``: the first observation of the next episode.
    """
    W, C = env.num_worlds, env.num_slots
    R = W * C
    H = buffer.horizon
    policy.reset_cache(cache)
    state = getattr(env, "state", None)
    if state is not None and getattr(state, "scenario", None) is not None:
        scen = state.scenario
        buffer.scenario.copy_(scen.repeat_interleave(C))
        pack = getattr(env, "pack", None)
        if pack is not None:
            buffer.agent_type.copy_(pack.agent_type[scen, :C].to(torch.int64).reshape(R))
        buffer.slot_active.copy_(state.slot_active.reshape(R))
    removed = torch.zeros(R, dtype=torch.bool, device=obs.device)
    for t in range(H):
        o = obs.reshape(R, -1)
        logits, value, cache = policy.forward_eval(o, cache, removed)
        action = policy.sample(logits, deterministic)
        buffer.obs[:, t] = o
        buffer.removed[:, t] = removed
        buffer.values[:, t] = value
        buffer.actions[:, t] = action
        buffer.logprobs[:, t] = policy.log_prob(logits, action)
        env_action = action.reshape(W, C, *action.shape[1:])
        if policy.continuous:  # the Gaussian is unbounded; the env takes [-1, 1]
            env_action = env_action.clamp(-1.0, 1.0)
        res = env.step(env_action)
        buffer.rewards[:, t] = res.reward.reshape(R)
        buffer.terminal[:, t] = res.terminal.reshape(R)
        buffer.truncation[:, t] = res.truncation.reshape(R)
        buffer.loss_mask[:, t] = res.loss_mask.reshape(R)
        goal = res.info.get("goal_reached") if isinstance(getattr(res, "info", None), dict) else None
        if goal is not None:
            buffer.goal_reached[:, t] = goal.reshape(R)
        removed = res.removed.reshape(R)
        policy.reset_cache(cache, res.terminal.reshape(R))
        obs = res.obs
    return obs, buffer
