"""Stage ``goals``: what happens after a goal is reached, per ``EnvConfig.goal_behavior``.

* RESPAWN: the agent goes back to its initial pose (log index ``init_steps``, logged speed) with
  ``kernels.reset.reset_agents``; presence is unchanged.
* NEW_GOAL: a new goal on a lane ahead (``kernels.new_goal``; rule below).
* STOP: handled where the goal is detected (stage ``rewards``: the agent is stopped).
* TRIAL: handled by the trial clock (stage ``trial``: the agent is removed until the next trial).
* CONTINUE: nothing; the agent drives on (stage ``rewards`` pays the goal once per episode).

Agents that reached the goal but were stopped or removed in the same step are left alone.
"""

from __future__ import annotations

import torch

from gpusim.config import GoalBehavior, RoadType
from gpusim.kernels.new_goal import new_goal
from gpusim.kernels.reset import reset_agents
from gpusim.sim.context import SimContext, StepVars
from gpusim.sim.random_start import respawn_pose
from gpusim.state import EnvState

#: NEW_GOAL: a new goal is the midpoint of a lane segment whose midpoint lies between these
#: distances ahead of the agent (m; projection on the heading >= min, Euclidean distance <= max).
NEW_GOAL_MIN_AHEAD = 10.0
NEW_GOAL_MAX_DIST = 40.0
#: NEW_GOAL fallback when no lane candidate qualifies: this far straight ahead (m).
NEW_GOAL_FALLBACK = 20.0


def goals(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """RESPAWN changes ``pos``, ``heading``, ``speed``; NEW_GOAL changes ``goal``; else nothing."""
    behavior = ctx.config.goal_behavior
    if behavior not in (GoalBehavior.RESPAWN, GoalBehavior.NEW_GOAL):
        return {}
    again = (step.goal_now & ~state.stopped & ~state.removed).contiguous()
    if behavior == GoalBehavior.RESPAWN:
        return respawn(ctx, state, again, step.backend)
    return {"goal": sample_new_goals(ctx, state, again, step.backend)}


def respawn(ctx: SimContext, state: EnvState, mask: torch.Tensor, backend: str | None = None) -> dict:
    """Agents in ``mask`` [W, A] take their pose at log index ``init_steps`` (with random start:
    their pose at the episode's start, :func:`gpusim.sim.random_start.respawn_pose`). ``backend``:
    the step's (``StepVars.backend``)."""
    if ctx.config.random_start_steps > 0:
        return respawn_pose(ctx, state, mask)
    p = ctx.pack
    pos, heading, speed, _ = reset_agents(
        mask=mask,
        scenario=state.scenario,
        log_index=ctx.config.init_steps,
        traj_pos=p.traj_pos,
        traj_heading=p.traj_heading,
        traj_vel=p.traj_vel,
        traj_valid=p.traj_valid,
        agent_exists=p.agent_exists,
        pos=state.pos.contiguous(),
        heading=state.heading.contiguous(),
        speed=state.speed.contiguous(),
        present=None,
        set_present=False,
        backend=backend,
    )
    return {"pos": pos, "heading": heading, "speed": speed}


def sample_new_goals(ctx: SimContext, state: EnvState, mask: torch.Tensor, backend: str | None = None
                     ) -> torch.Tensor:
    """New goals [W, A, 2] for agents in ``mask`` [W, A] (others keep theirs), computed on
    ``backend`` (the step's, ``StepVars.backend``).

    The midpoint of a lane segment among the agent cell's ``grid_road`` candidates, at least
    ``NEW_GOAL_MIN_AHEAD`` m ahead along the heading and at most ``NEW_GOAL_MAX_DIST`` m away, the
    ``floor(u * n)``-th of the ``n`` qualifying candidates in candidate order with ``u`` uniform;
    when none qualifies, ``NEW_GOAL_FALLBACK`` m straight ahead. Every call draws one [W, A]
    uniform ``u`` from the env generator (whether or not an agent reached its goal), so the stream
    is the same on every backend and nothing is read back to the host.
    """
    p = ctx.pack
    rand = torch.rand(mask.shape, generator=ctx.generator, device=ctx.device)
    return new_goal(
        mask=mask,
        rand=rand,
        scenario=state.scenario,
        pos=state.pos.contiguous(),
        heading=state.heading.contiguous(),
        goal=state.goal.contiguous(),
        grid_road=p.grid_road,
        grid_start=p.grid_start,
        grid_origin=p.grid_origin,
        grid_dims=p.grid_dims,
        cell_size=p.cell_size,
        road_seg=p.road_seg,
        road_type=p.road_type,
        min_ahead=NEW_GOAL_MIN_AHEAD,
        max_dist=NEW_GOAL_MAX_DIST,
        fallback=NEW_GOAL_FALLBACK,
        lane_type=int(RoadType.LANE),
        backend=backend,
    )
