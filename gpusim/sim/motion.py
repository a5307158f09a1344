"""Stage ``motion``: who acts, action decoding, and the dynamics model of the controlled agents.

The dynamics model is looked up in :data:`DYNAMICS` by ``EnvConfig.dynamics``. A model is a
``(forward, inverse)`` pair of kernel dispatchers, called by keyword:

* ``forward(pos, heading, speed, length, accel, steer, moving, dt) -> (pos, heading, speed)``:
  [W, C, 2] / [W, C] float32 inputs, ``moving`` [W, C] bool (where False the pose is returned
  unchanged), ``dt`` in seconds;
* ``inverse(pos, heading, speed, length, target_pos, target_heading, target_speed, target_valid,
  dt) -> (accel, steer)``: the controls that best reach the target pose in one step (used by
  :func:`expert_actions`).

Adding a model = one kernel module (gpusim/kernels/) and one entry here (docs/architecture.md).

The stage runs :func:`gpusim.kernels.motion.move_slots` (in-play flags, action decoding, the
model's ``forward`` on the in-play slots) on the step's backend, bound once per pack
(:func:`~gpusim.sim.context.bound_op`); on the CPU its C kernels run the
kinematic bicycle (``kernels/motion.c``), any other model runs through its own dispatcher.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from gpusim.config import Dynamics
from gpusim.kernels import dynamics
from gpusim.kernels.clocks import log_index
from gpusim.kernels.motion import bind_move_slots
from gpusim.sim.context import SimContext, StepVars, bound_op, slots
from gpusim.sim.random_start import log_origin
from gpusim.state import EnvState


class DynamicsModel(NamedTuple):
    """A dynamics model: ``forward`` (one step) and ``inverse`` (controls toward a target pose).

    Both are dispatchers of a kernel module: they take the tensors as keywords
    (``gpusim.kernels.dynamics.bicycle_step`` / ``inverse_bicycle`` have the shapes) and
    ``backend`` (the step's backend, ``gpusim.backend.op_backend``; None: resolved from the
    tensors)."""

    forward: Callable
    inverse: Callable


#: Dynamics models by ``EnvConfig.dynamics``.
DYNAMICS: dict = {
    Dynamics.CLASSIC: DynamicsModel(forward=dynamics.bicycle_step, inverse=dynamics.inverse_bicycle),
}


def model_for(ctx: SimContext) -> DynamicsModel:
    """The registered model of ``ctx.config.dynamics``.

    Raises:
        ValueError: no model registered under that value.
    """
    model = DYNAMICS.get(ctx.config.dynamics)
    if model is None:
        raise ValueError(f"unsupported dynamics {ctx.config.dynamics}; registered: {sorted(map(str, DYNAMICS))}")
    return model


def motion(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """Decode the actions and move the controlled agents that are in play.

    Sets ``step.in_play`` [W, A] and ``step.loss_mask`` [W, C]; changes ``pos``, ``heading``,
    ``speed`` (experts' columns unchanged here; the ``replay`` stage moves them).
    """
    cfg = ctx.config
    step.in_play, step.loss_mask, pos, heading, speed = bound_op(ctx, step, "move_slots", lambda backend, check: (
        bind_move_slots(backend, check, int(cfg.action_space), cfg.dt, model_for(ctx).forward)))(
        state.controlled, state.present, state.stopped, state.removed, state.world_done, state.pos, state.heading,
        state.speed, state.length, step.actions)
    return {"pos": pos, "heading": heading, "speed": speed}


def expert_targets(ctx: SimContext, state: EnvState) -> dict:
    """The logged pose each controlled slot should reach with its next action: the log at index
    ``init_steps + (episode step - log origin) + 1`` (the rule of :func:`expert_actions`).

    Returns:
        ``pos`` [W, C, 2] float32 (m), ``heading`` [W, C] float32 (rad), ``speed`` [W, C] float32
        (m/s, the logged velocity's norm), ``valid`` [W, C] bool (logged there and inside the log).
    """
    p, C = ctx.pack, ctx.num_slots
    T = p.num_steps
    nxt = (log_index(ctx.config.init_steps, state.step, log_origin(ctx, state)) + 1).to(torch.int64)
    i = nxt.clamp(max=T - 1)[:, None]
    w = state.scenario[:, None]
    c = torch.arange(C, device=ctx.device)[None, :]
    return {"pos": p.traj_pos[w, c, i].contiguous(), "heading": p.traj_heading[w, c, i].contiguous(),
            "speed": torch.linalg.vector_norm(p.traj_vel[w, c, i], dim=-1).contiguous(),
            "valid": (p.traj_valid[w, c, i] & (nxt < T)[:, None]).contiguous()}


def expert_actions(ctx: SimContext, state: EnvState) -> torch.Tensor:
    """Actions that make every controlled agent follow its logged trajectory (inverse dynamics
    toward the logged pose at the next log index, :func:`expert_targets`; zero controls where
    that pose is invalid).

    Returns:
        discrete: [W, C] int64; continuous: [W, C, 2] float32.
    """
    cfg, C = ctx.config, ctx.num_slots
    target = expert_targets(ctx, state)
    accel, steer = model_for(ctx).inverse(
        pos=slots(state.pos, C),
        heading=slots(state.heading, C),
        speed=slots(state.speed, C),
        length=slots(state.length, C),
        target_pos=target["pos"],
        target_heading=target["heading"],
        target_speed=target["speed"],
        target_valid=target["valid"],
        dt=cfg.dt,
    )
    return dynamics.encode_actions(accel, steer, int(cfg.action_space))
