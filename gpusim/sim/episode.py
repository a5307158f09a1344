"""Initial state and scenario draw; stage ``restart`` (episode end and trial restarts).

:func:`initial_state` is the one code path that puts worlds at the start of an episode: reset,
the auto-reset after step H, and the restore of a new trial all use it. It is a deterministic
function of the scenarios and the pack, so the env keeps the state of the current episode's
reset (``ctx.start``) and a new trial restores from it (fields of ``TRIAL_KEEP`` excepted).
"""

from __future__ import annotations

import torch

from gpusim.data.mirror import training_pack
from gpusim.kernels.reset import reset_agents
from gpusim.sim.candidates import draw_candidates
from gpusim.sim.context import SimContext, StepVars
from gpusim.sim.goal_resample import resample_goals
from gpusim.sim.partner_task import begin_partner
from gpusim.sim.random_start import start_state
from gpusim.sim.roles import assign_roles
from gpusim.sim.styles import draw_styles
from gpusim.state import TRIAL_KEEP, EnvState


def draw_scenarios(ctx: SimContext) -> torch.Tensor:
    """[W] int64 scenario indices drawn uniformly with the env's generator."""
    return torch.randint(ctx.pack.num_scenarios, (ctx.num_worlds,), generator=ctx.generator, device=ctx.device)


def initial_state(ctx: SimContext, scenario: torch.Tensor, backend: str | None = None) -> EnvState:
    """The state of every world at the start of an episode of ``scenario`` [W] (int64).

    Poses and presence at log index ``init_steps`` come from ``kernels.reset.reset_agents`` (on
    ``backend``: the step's; None outside a step, resolved from the pack's tensors); sizes, goals
    and types from the pack; every other field is zero (its declaration in ``EnvState``).
    """
    p, cfg = ctx.pack, ctx.config
    s = scenario.to(torch.int64).contiguous()
    pos, heading, speed, present = reset_agents(
        mask=None,
        scenario=s,
        log_index=cfg.init_steps,
        traj_pos=p.traj_pos,
        traj_heading=p.traj_heading,
        traj_vel=p.traj_vel,
        traj_valid=p.traj_valid,
        agent_exists=p.agent_exists,
        pos=None,
        heading=None,
        speed=None,
        present=None,
        backend=backend,
    )
    agent_index = torch.arange(cfg.max_agents, device=ctx.device)[None, :]
    return EnvState.build(
        {**ctx.sizes, "W": s.shape[0]},
        ctx.device,
        scenario=s.clone(),
        pos=pos,
        heading=heading,
        speed=speed,
        present=present,
        length=p.agent_length[s].contiguous(),
        width=p.agent_width[s].contiguous(),
        goal=p.agent_goal[s].contiguous(),
        agent_type=p.agent_type[s].contiguous(),
        controlled=agent_index < p.num_controlled[s][:, None],
    )


def begin_episode(ctx: SimContext, scenario: torch.Tensor, backend: str | None = None) -> EnvState:
    """Start a new episode of ``scenario`` [W]: resets the host clock, draws the slots' roles
    (``gpusim.sim.roles.assign_roles``) and, with reward conditioning, the agents' styles
    (``gpusim.sim.styles.draw_styles``) and, in the memory task, the candidate goals
    (``gpusim.sim.candidates.draw_candidates``), remembers the start state (``ctx.start``, for trial
    restarts) and returns a copy of it to run. With the training randomisations on, each world
    first moves to its random start step (``gpusim.sim.random_start.start_state``) and the goals
    are redrawn (``gpusim.sim.goal_resample.resample_goals``); off, neither draws. The partner task
    draws its partner types last (``gpusim.sim.partner_task.begin_partner``). ``backend``: the
    step's (:func:`initial_state`)."""
    ctx.t = 0
    state = assign_roles(ctx, start_state(ctx, initial_state(ctx, scenario, backend)))
    ctx.start = begin_partner(ctx, resample_goals(ctx, draw_candidates(ctx, draw_styles(ctx, state))))
    return ctx.start.clone()


def restart(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """After step H every world starts a new episode (new scenarios); in trial mode, worlds whose
    trial ended (``step.restart``) go back exactly to the episode's start, except ``TRIAL_KEEP``."""
    if step.episode_end:
        if ctx.pool is not None:  # streaming: every K episodes the next pool replaces the pack
            new = ctx.pool.episode_done()
            if new is not None:
                ctx.pack = training_pack(new, ctx.config)  # EnvConfig.mirror (gpusim/data/mirror.py)
        return begin_episode(ctx, draw_scenarios(ctx), step.backend).tensors()
    if step.restart is not None:
        return state.where(step.restart, ctx.start, keep=TRIAL_KEEP).tensors()
    return {}
