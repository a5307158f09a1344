"""A policy ensemble: K trained policies of one kind acting as one, their action distributions mixed.

Each member keeps its own KV cache over the same slots and sees the same observations. At every
step the ensemble's action distribution is the equal-weight mixture of the members' softmax
distributions, p(a) = (1/K) * sum_k softmax(logits_k)(a), returned as log-probabilities, so every
decoding of :meth:`policy.ActorCritic.sample` applies to the mixture unchanged: ``"mean"`` takes the
expected grid index under the mixture (the average of the members' expected indices), argmax its
most likely cell, sampling draws a member's distribution with probability 1/K. The value is the
members' mean. Averaging the distributions of independently trained networks (not their weights:
members trained from different initialisations do not share a basin) is the classic way to cut the
variance a single seed carries (Lakshminarayanan et al. 2017, "Simple and scalable predictive
uncertainty estimation using deep ensembles", arXiv 1612.01474).

With ``draw="agent"`` the members are not mixed step by step: every agent slot draws one member
(uniformly) when its memory starts (an episode start or a reset) and acts as that member until the
next one: a population of drivers rather than one averaged driver. A member drawn afresh at every
step (the mixture, sampled) switches behaviour from step to step; one drawn per agent keeps each
agent's own kinematics.

It is an acting policy only (evaluation, rendering): it has no training forward.
"""

from __future__ import annotations

import math

import torch

from policy.actor_critic import ActorCritic


class EnsembleCache:
    """The members' :class:`policy.transformer.KVCache`, one per member, over the same N slots.

    Attributes:
        caches: tuple of K caches. position: [N] int64, the first member's (all advance together).
        member: [N] int64, the member each slot acts as (``draw="agent"``), else None.
    """

    def __init__(self, caches: tuple, member: torch.Tensor | None = None):
        self.caches = tuple(caches)
        self.member = member

    @property
    def position(self) -> torch.Tensor:
        """[N] int64 tokens written since each slot's last reset."""
        return self.caches[0].position


class PolicyEnsemble(torch.nn.Module):
    """K discrete-action :class:`policy.ActorCritic` members acting as one policy (module docstring).

    It offers what :class:`policy.actor.Actor` uses: :meth:`init_cache`, :meth:`reset_cache`,
    :meth:`forward_eval`, :meth:`sample`, ``continuous`` and ``config`` (the first member's, for
    its memory rule).

    Args:
        members: two or more policies with the same observation layout, action count and memory
            rule (``PolicyConfig.memory``). A policy given twice counts twice (a weight).
        draw: ``"step"`` (default): the mixture at every step; ``"agent"``: one member per agent
            slot, drawn uniformly from torch's global generator when the slot's memory starts.

    Raises:
        ValueError: fewer than two members; a continuous-action member (a mixture of Gaussians has
            no single mean to decode); members that read different observations, have different
            action counts or memory rules (each named with the first member's); an unknown ``draw``.
    """

    DRAWS = ("step", "agent")

    def __init__(self, members, draw: str = "step"):
        super().__init__()
        if draw not in self.DRAWS:
            raise ValueError(f"PolicyEnsemble: draw must be one of {', '.join(self.DRAWS)}, got {draw!r}")
        self.draw = draw
        members = list(members)
        if len(members) < 2:
            raise ValueError(f"PolicyEnsemble: needs at least 2 members, got {len(members)}")
        first = members[0]
        for i, m in enumerate(members):
            if m.continuous:
                raise ValueError(f"PolicyEnsemble: member {i} has continuous actions; only discrete "
                                 "policies can be mixed")
            for what, mine, theirs in (("observations", m.dims.describe(), first.dims.describe()),
                                       ("action count", m.num_actions, first.num_actions),
                                       ("memory rule", m.config.memory, first.config.memory)):
                if mine != theirs:
                    raise ValueError(f"PolicyEnsemble: member {i} has {what} {mine}, member 0 has {theirs}")
        self.members = torch.nn.ModuleList(members)

    @property
    def continuous(self) -> bool:
        """Always False (members are discrete)."""
        return False

    @property
    def config(self):
        """The first member's :class:`policy.PolicyConfig`."""
        return self.members[0].config

    @property
    def dims(self):
        """The members' :class:`policy.encoders.ObsDims`."""
        return self.members[0].dims

    @property
    def num_actions(self) -> int:
        """The members' action count."""
        return self.members[0].num_actions

    def init_cache(self, num_slots: int, horizon: int, device=None) -> EnsembleCache:
        """Empty memory for every member: ``num_slots`` slots, episodes of up to ``horizon`` steps
        (with ``draw="agent"``, each slot's member drawn)."""
        caches = tuple(m.init_cache(num_slots, horizon, device) for m in self.members)
        member = None
        if self.draw == "agent":
            member = torch.randint(len(self.members), (int(num_slots),), device=caches[0].position.device)
        return EnsembleCache(caches, member)

    def reset_cache(self, cache: EnsembleCache, terminal: torch.Tensor | None = None) -> EnsembleCache:
        """Clear every member's memory where ``terminal`` [N] bool is set (all if ``None``) and,
        with ``draw="agent"``, draw those slots' members again. In place; returns ``cache``."""
        for c in cache.caches:
            ActorCritic.reset_cache(c, terminal)
        if cache.member is not None:
            fresh = torch.randint_like(cache.member, len(self.members))
            cache.member.copy_(fresh if terminal is None else torch.where(terminal, fresh, cache.member))
        return cache

    def forward_eval(self, obs_t: torch.Tensor, cache: EnsembleCache, removed_t: torch.Tensor | None = None):
        """One step for N slots: every member's :meth:`policy.ActorCritic.forward_eval` on ``obs_t``
        [N, D] float32 with its own cache.

        Returns:
            ``(logits, value, cache)``: logits [N, num_actions] float32, the log of the mixture
            distribution (log-probabilities: softmax of them is the mixture itself; with
            ``draw="agent"``, each slot's own member's); value [N] float32, the members' mean (the
            slot's member's); the cache (updated in place).
        """
        logps, values = [], []
        for m, c in zip(self.members, cache.caches):
            logits, value, _ = m.forward_eval(obs_t, c, removed_t)
            logps.append(torch.log_softmax(logits.float(), dim=-1))
            values.append(value)
        logps, values = torch.stack(logps), torch.stack(values)  # [K, N, A], [K, N]
        if cache.member is not None:
            rows = torch.arange(logps.shape[1], device=logps.device)
            return logps[cache.member, rows], values[cache.member, rows], cache
        return torch.logsumexp(logps, dim=0) - math.log(logps.shape[0]), values.mean(0), cache

    def sample(self, logits: torch.Tensor, deterministic: bool | str = False, temperature: float = 1.0) -> torch.Tensor:
        """:meth:`policy.ActorCritic.sample` applied to the mixture's log-probabilities."""
        return self.members[0].sample(logits, deterministic, temperature)
