"""The actor: a policy acting step by step with its KV cache (the one "act with the policy and its
memory" of the project).

One :class:`Actor` drives N agent slots (rows ``w * C + c`` of an env's W x C slots, or any subset
of them): :meth:`Actor.act` runs the policy's one-step ``forward_eval`` on the slots'
observations with the memory of the episode so far and draws an action (sampled, or argmax /
mean when ``deterministic``); :meth:`Actor.observe` takes the step's result: the slots' removed
flags for the next step, and the memory cleared where a slot's episode ended (``terminal``) and,
for a co-player (``reset_at_trial=True``), also where a trial ended (``truncation``: a co-player
is the same stationary "person" in every trial, docs/trial.md). :meth:`Actor.begin` clears every
slot's memory at an episode start.

Its users: the training rollout (train/rollout.py) and its CUDA-graph version
(train/graphed_rollout.py, which captures ``act`` and ``observe``: both update the actor's
tensors in place), evaluation (train/eval/sweep.py ``PolicyDriver``), co-players
(train/coplayer.py, one actor per partner) and rendering (train/render.py). Loading a policy from
a checkpoint is :func:`train.checkpoint.load_policy`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


def resets_at_trial(policy) -> bool:
    """True when ``policy`` (or the module a DDP wrapper holds) clears its memory at a trial end
    too: ``PolicyConfig.memory == "trial"``, the memoryless control (docs/trial.md)."""
    return getattr(getattr(getattr(policy, "module", policy), "config", None), "memory", "episode") == "trial"


def memory_reset(terminal: torch.Tensor, truncation: torch.Tensor | None, at_trial: bool) -> torch.Tensor:
    """The steps after which a slot's memory is cleared, bool like ``terminal``: its episode ended
    (``terminal``) or, with ``at_trial`` (:func:`resets_at_trial`), its trial ended
    (``truncation``; None: no trial ends known)."""
    return terminal | truncation if at_trial and truncation is not None else terminal


class Act(NamedTuple):
    """One :meth:`Actor.act`: ``action`` [N] int64 (discrete) or [N, A] float32 (continuous,
    unbounded Gaussian draw), ``logits`` [N, num_actions] float32 (the Gaussian mean when
    continuous), ``value`` [N] float32."""

    action: torch.Tensor
    logits: torch.Tensor
    value: torch.Tensor


class Actor:
    """A policy with its KV cache over N slots (module docstring).

    Args:
        policy: a :class:`policy.ActorCritic` (used as given: train / eval mode is the caller's).
        num_slots: N (ignored when ``cache`` is given). horizon: the cache's capacity in steps
            (an episode's length, ``env.horizon``).
        device: where the cache and the removed flags live (default: the policy's parameters').
        deterministic: ``True`` / ``"argmax"``: argmax (discrete) / mean (continuous) actions
            instead of sampling (sampling draws from torch's global generator); ``"mean"``: the
            rounded expected value per action dimension (discrete; ``ActorCritic.sample``).
        temperature: sampling temperature (``ActorCritic.sample``; 1 = the policy's distribution).
        reset_at_trial: clear a slot's memory at a trial end too (co-players; the memoryless
            control). ``None`` (default): the policy's ``config.memory == "trial"``
            (:class:`policy.PolicyConfig`), else False.
        cache: an existing :class:`policy.KVCache` of N slots to use (e.g. the trainer's).

    Attributes:
        policy, cache, deterministic, reset_at_trial; removed: [N] bool, the slot's agent was out
        of play when the next observation was taken (updated in place by :meth:`observe`).

    Raises:
        ValueError: ``num_slots < 0`` without a ``cache``.
    """

    def __init__(self, policy, num_slots: int = 0, horizon: int = 1, device=None, deterministic: bool | str = False,
                 reset_at_trial: bool | None = None, cache=None, temperature: float = 1.0):
        if device is None:
            device = next(iter(policy.parameters())).device
        if cache is None:
            if int(num_slots) < 0:
                raise ValueError(f"Actor: num_slots must be >= 0, got {num_slots}")
            cache = policy.init_cache(int(num_slots), int(horizon), device)
        self.policy = policy
        self.cache = cache
        self.deterministic = deterministic if deterministic in ("argmax", "mean") else bool(deterministic)
        self.temperature = float(temperature)
        if reset_at_trial is None:
            reset_at_trial = resets_at_trial(policy)
        self.reset_at_trial = bool(reset_at_trial)
        self.removed = torch.zeros(cache.position.shape[0], dtype=torch.bool, device=device)

    @property
    def num_slots(self) -> int:
        """N."""
        return int(self.removed.shape[0])

    @property
    def continuous(self) -> bool:
        """The policy has a Gaussian (continuous) head."""
        return bool(self.policy.continuous)

    def begin(self) -> None:
        """An episode starts in every slot: memory cleared, no slot removed."""
        self.policy.reset_cache(self.cache)
        self.removed.zero_()

    def act(self, obs: torch.Tensor, removed: torch.Tensor | None = None) -> Act:
        """One step: ``obs`` [N, D] float32 (rows of removed slots are ignored). Appends the step to
        the memory (in place) and returns :class:`Act`. No host read (capturable). ``removed`` [N]
        bool, when given, is used (and kept) instead of the flags :meth:`observe` recorded: for a
        caller that reads them from the env instead (rendering)."""
        if removed is not None:
            self.removed.copy_(removed)
        logits, value, self.cache = self.policy.forward_eval(obs, self.cache, self.removed)
        return Act(self.policy.sample(logits, self.deterministic, self.temperature), logits, value)

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        """The action the env takes: a continuous one clamped to [-1, 1] (the Gaussian is unbounded);
        a discrete one unchanged."""
        return action.clamp(-1.0, 1.0) if self.continuous else action

    def observe(self, terminal: torch.Tensor, removed: torch.Tensor, truncation: torch.Tensor | None = None) -> None:
        """The result of the step just acted: ``terminal``, ``removed`` and optional ``truncation``,
        [N] bool each. ``removed`` is copied into :attr:`removed` (in place); the memory of the
        slots where ``terminal`` (or, with ``reset_at_trial``, ``truncation``) is set is cleared."""
        self.removed.copy_(removed)
        self.policy.reset_cache(self.cache, memory_reset(terminal, truncation, self.reset_at_trial))
