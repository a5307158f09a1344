"""Random start (``EnvConfig.random_start_steps = N > 0``): episodes begin at a random log step.

A training randomisation (docs/training.md "Generalisation options"): at every episode start each
world draws its own offset ``u`` uniform in ``{0, ..., N}`` (one ``[W]`` integer draw from the
env's generator, on the device, in :func:`start_state`), stored in ``EnvState.start_offset``; the
world's agents take their logged pose, speed and presence at log step ``init_steps + u``. From
then on the world's log clock is ``init_steps + start_offset + (step - trial_start)``: the stages
that read the log (experts' replay, traffic signals, the expert actions, goal RESPAWN) pass
:func:`log_origin` (``trial_start - start_offset``) where the kernels take ``trial_start``, so the
kernels themselves are unchanged. A trial restart restores the episode's start state, offset
included, so every trial of an episode starts at the same log step.

Horizon: no world runs past its log. Outside trial mode a world's episode ends at the horizon
(``scenario_length``, default ``91 - init_steps`` as without random start) or when its log ends,
after ``91 - init_steps - u`` steps, whichever comes first (:func:`log_ended`, stage ``rewards``:
``terminal`` for its active slots, then ``world_done``: it idles until the synchronous reset,
like a world truncated early), so every world sees its log to the end and its logged goals keep
the time the log took to reach them. In trial mode a trial cannot end per world at the log's end
(the trial clock times trials out at ``scenario_length``), so there the trials are shortened: the
config caps ``scenario_length`` at ``91 - init_steps - N``.

Controlled agents not valid at their start step are out of play for the episode: their slot is
not controlled (``controlled`` False: no action, no loss, no agent-episode in the metrics), and
they join the scene as log-replayed experts when their log becomes valid. Agents keep the goal of
their log (its endpoint) unless goal resampling is on.

Off (N = 0) nothing is drawn and no stage changes: the env is bit for bit the env without it.
"""

from __future__ import annotations

import torch

from gpusim.config import WOMD_STEPS
from gpusim.sim.context import SimContext
from gpusim.state import EnvState


def draw_offsets(ctx: SimContext, num_worlds: int) -> torch.Tensor:
    """[W] int32 start offsets ``u`` uniform in ``[0, random_start_steps]`` (one draw from the env's
    generator on its device)."""
    n = int(ctx.config.random_start_steps)
    return torch.randint(n + 1, (num_worlds,), generator=ctx.generator, device=ctx.device, dtype=torch.int32)


def logged_pose(ctx: SimContext, scenario: torch.Tensor, log_index: torch.Tensor) -> tuple:
    """The logged pose of every agent of every world at its world's own log step.

    Args:
        scenario: [W] int64 scenario indices. log_index: [W] int64 log steps (in ``[0, T)``).

    Returns:
        ``(pos [W, A, 2] f32 (m), heading [W, A] f32 (rad), speed [W, A] f32 (m/s, norm of the
        logged velocity), present [W, A] bool (logged valid and the slot holds an object))``, as
        ``kernels.reset.reset_agents`` gives for one shared index.
    """
    p = ctx.pack
    s, i = scenario[:, None], log_index[:, None]
    a = torch.arange(p.traj_pos.shape[1], device=ctx.device)[None, :]
    pos = p.traj_pos[s, a, i].contiguous()
    heading = p.traj_heading[s, a, i].contiguous()
    speed = torch.linalg.vector_norm(p.traj_vel[s, a, i], dim=-1).contiguous()
    present = (p.traj_valid[s, a, i] & p.agent_exists[scenario]).contiguous()
    return pos, heading, speed, present


def start_state(ctx: SimContext, state: EnvState) -> EnvState:
    """``state`` (a new episode's initial state at log step ``init_steps``) moved to each world's
    random start (module docstring); unchanged, and nothing drawn, when the option is off."""
    if ctx.config.random_start_steps <= 0:
        return state
    offset = draw_offsets(ctx, state.num_worlds)
    index = (ctx.config.init_steps + offset).to(torch.int64)
    pos, heading, speed, present = logged_pose(ctx, state.scenario, index)
    controlled = state.controlled & present  # not valid at its start step: out of play this episode
    return state.replace(pos=pos, heading=heading, speed=speed, present=present, controlled=controlled,
                         start_offset=offset)


def log_origin(ctx: SimContext, state: EnvState) -> torch.Tensor:
    """[W] int32 what the log-reading kernels take as ``trial_start``: ``trial_start -
    start_offset`` with random start (so their ``init_steps + (step - trial_start)`` is the
    world's log step), else ``trial_start`` itself (no op)."""
    if ctx.config.random_start_steps <= 0:
        return state.trial_start
    return (state.trial_start - state.start_offset).contiguous()


def log_ended(ctx: SimContext, state: EnvState) -> torch.Tensor | None:
    """[W] bool: the world's log has no step after the one just taken (``init_steps + start_offset
    + step >= 91``, ``state`` after the replay stage), so its episode ends now; None when random
    start is off or in trial mode (there every trial is shortened instead: module docstring)."""
    cfg = ctx.config
    if cfg.random_start_steps <= 0 or cfg.trial_mode:
        return None
    return (cfg.init_steps + state.start_offset + state.step) >= WOMD_STEPS


def respawn_pose(ctx: SimContext, state: EnvState, mask: torch.Tensor) -> dict:
    """Goal RESPAWN with random start: agents in ``mask`` [W, A] bool take the pose of the
    episode's start state (their world's start step), the others keep theirs. Returns
    ``{"pos", "heading", "speed"}`` (new tensors)."""
    start = ctx.start
    return {"pos": torch.where(mask[..., None], start.pos, state.pos).contiguous(),
            "heading": torch.where(mask, start.heading, state.heading).contiguous(),
            "speed": torch.where(mask, start.speed, state.speed).contiguous()}
