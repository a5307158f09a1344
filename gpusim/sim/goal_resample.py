"""Goal resampling (``EnvConfig.goal_resample``): a new goal place for every agent at every episode start.

A training randomisation (docs/training.md "Generalisation options"), in the spirit of the
"doughnut" goals of PufferDrive (a goal between a minimum and a maximum distance, ahead of the
agent): at every episode start each controlled agent's goal becomes one lane place drawn uniformly
from its places in the memory task's pool (:func:`gpusim.sim.candidates.candidate_pool` asked for
one place), so there is one procedure for "a goal place": lane places ahead of the agent's start,
at a driving-like distance (its logged one, clamped to 15-60 m), a few metres apart, at most 16
per agent (the rules are that function's). The pool is computed once per pack on the host (from
the start at log step ``init_steps``; with random start the agent may have moved a few metres
since); the draw is one ``[W, C]`` uniform from the env's generator, on the device (no
host read). A trial restart restores the episode's start state, so every trial of an episode has
the same goal. Off (default) nothing is drawn: the env is bit for bit the env without it.
"""

from __future__ import annotations

import warnings

import torch

from gpusim.sim.candidates import candidate_pool
from gpusim.sim.context import SimContext
from gpusim.state import EnvState


def goal_pool(pack, config) -> tuple[torch.Tensor, torch.Tensor]:
    """The goal places of every controlled agent of ``pack``: ``candidate_pool`` asked for one
    place per agent. An agent without any lane place ahead of it (no lane point at a driving-like
    distance, e.g. one agent of scenario 69f302124faf77b6 of the pool's train split) gets count 0
    and keeps its logged goal in every episode; a warning gives how many agents and the first scenario.

    Returns:
        ``(places [S, C, M, 2] float32 (m, scenario frame), count [S, C] int64)`` on the pack's device.
    """
    places, count = candidate_pool(pack, config.replace(goal_candidates=1), strict=False)
    C = count.shape[1]
    controlled = torch.arange(C, device=count.device)[None, :] < pack.num_controlled.to(count.device)[:, None]
    none = controlled & (count == 0)
    if bool(none.any()):
        first = pack.scenario_ids[int(none.any(1).nonzero()[0, 0])]
        warnings.warn(f"EnvConfig.goal_resample: {int(none.sum())} of {int(controlled.sum())} controlled agents have "
                      f"no lane place to resample (first in scenario {first}); they keep their logged goals",
                      stacklevel=2)
    return places, count


def resample_goals(ctx: SimContext, state: EnvState) -> EnvState:
    """``state`` (a new episode's start) with a drawn goal place in ``goal`` for every controlled
    slot (module docstring); unchanged, and nothing drawn, when the option is off.

    Draws one ``[W, C]`` uniform from ``ctx.generator``; the place is ``floor(u * n)`` of the
    agent's ``n`` places.
    """
    if not ctx.config.goal_resample:
        return state
    places, count = ctx.pack_fact("goal_pool", lambda pk: goal_pool(pk, ctx.config))
    W, C = state.num_worlds, state.num_slots
    s = state.scenario
    n = count[s]  # [W, C]
    u = torch.rand((W, C), generator=ctx.generator, device=ctx.device)
    pick = (u * n).to(torch.int64).clamp(min=0)
    pick = torch.minimum(pick, (n - 1).clamp(min=0))
    new = places[s].gather(2, pick[..., None, None].expand(W, C, 1, 2))[:, :, 0]
    use = state.slot_active & (n > 0)
    goal = state.goal.clone()
    goal[:, :C] = torch.where(use[..., None], new, state.goal[:, :C])
    return state.replace(goal=goal)
