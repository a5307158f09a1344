"""Roles of the controlled slots (population play): *ego* or *co-player*.

An ego slot is driven by the learning (or evaluated) policy; a co-player slot by a frozen partner
policy (``train/coplayer.py``). The role is the state field ``EnvState.ego`` [W, C] bool, set once
per episode by :func:`assign_roles` (called by ``gpusim.sim.episode.begin_episode``: reset and the
auto-reset after step H) and kept across the trials of an episode (``trial="keep"``). Empty slots
are neither (``ego`` False).

Rules (``EnvConfig.ego_slots`` / ``ego_fraction`` / ``ego_choice`` / ``replay_experts``):

* no co-players (``ego_slots == 0`` and ``ego_fraction == 0``, the default): ``ego =
  slot_active``, and nothing is drawn from the generator, so the env's random stream, state and
  results are bit for bit those of an env without roles;
* else world ``w`` with ``n`` controlled slots has ``e = min(n, ego_slots)`` egos, or with
  ``ego_fraction`` ``e = min(n, max(1, ceil(ego_fraction * n)))``; which ones: ``"first"`` the
  lowest slots; ``"random"`` ``e`` slots uniformly at random (one ``[W, C]`` uniform draw from the
  env's seeded generator per episode; the ranks of the draws pick them); ``"sdc"`` like random but
  the self-driving car (``pack.sdc_index``) comes first when it is controllable;
* ``replay_experts=False``: every non-controlled agent is out of the scene from the reset
  (``present`` False, ``removed`` True), so the controlled agents are alone.

No host synchronisation: fixed shapes, ``torch.where`` / ``scatter`` only.
"""

from __future__ import annotations

import math

import torch

from gpusim.state import EnvState


def num_egos(config, num_controlled: torch.Tensor) -> torch.Tensor:
    """Ego slots per world: [W] int64 from ``num_controlled`` [W] (controlled slots of each world).

    Equals ``num_controlled`` when the config has no co-players (module docstring).
    """
    n = num_controlled.to(torch.int64)
    if config.ego_slots > 0:
        return n.clamp(max=int(config.ego_slots))
    if config.ego_fraction > 0.0:
        e = torch.ceil(n.to(torch.float64) * float(config.ego_fraction)).to(torch.int64).clamp(min=1)
        return torch.minimum(e, n)
    return n


def ego_mask(config, slot_active: torch.Tensor, sdc_slot: torch.Tensor, generator) -> torch.Tensor:
    """[W, C] bool ego slots of a new episode (rules in the module docstring).

    Args:
        config: :class:`~gpusim.config.EnvConfig`.
        slot_active: [W, C] bool controlled slots.
        sdc_slot: [W] int64 slot of the self-driving car, -1 (or >= C) when not packed.
        generator: the env's seeded generator (one [W, C] uniform draw when the choice is random).
    """
    if not config.has_coplayers:
        return slot_active.clone()
    W, C = slot_active.shape
    dev = slot_active.device
    e = num_egos(config, slot_active.sum(dim=1))
    col = torch.arange(C, device=dev)[None, :].expand(W, C)
    if config.ego_choice == "first":
        key = col.to(torch.float32)
    else:
        key = torch.rand((W, C), generator=generator, device=dev)
        if config.ego_choice == "sdc":
            key = torch.where(col == sdc_slot.to(torch.int64)[:, None], torch.full_like(key, -1.0), key)
    key = torch.where(slot_active, key, torch.full_like(key, math.inf))  # empty slots rank last
    order = key.argsort(dim=1, stable=True)
    rank = torch.empty_like(order).scatter_(1, order, col.contiguous())
    return slot_active & (rank < e[:, None])


def assign_roles(ctx, state: EnvState) -> EnvState:
    """``state`` (a new episode's initial state) with ``ego`` set and, with
    ``replay_experts=False``, the experts taken out of the scene. Draws from ``ctx.generator`` only
    when the config has co-players with a random choice."""
    cfg = ctx.config
    sdc = ctx.pack.sdc_index.to(torch.int64)[state.scenario]
    changes = {"ego": ego_mask(cfg, state.slot_active, sdc, ctx.generator)}
    if not cfg.replay_experts:
        expert = ~state.controlled & (state.agent_type >= 0)
        changes["present"] = state.present & ~expert
        changes["removed"] = state.removed | expert
    return state.replace(**changes)
