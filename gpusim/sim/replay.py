"""Stage ``replay``: the episode clock advances and the experts follow their log.

Experts (present, not controlled, not removed) take their logged pose at log index
``init_steps + (step - trial_start)`` (``kernels.replay``; plus the world's ``start_offset`` with
random start, :func:`gpusim.sim.random_start.log_origin`); past their valid log they leave the
scene (``present`` False).

The op is :func:`gpusim.kernels.replay.replay_state` on the step's backend, bound once per pack
(its C kernel derives the replayed mask and the log index in its pass).
"""

from __future__ import annotations

from gpusim.kernels.replay import bind_replay_state
from gpusim.sim.context import SimContext, StepVars, bound_op
from gpusim.sim.random_start import log_origin
from gpusim.state import EnvState


def replay(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """Changes ``step`` (+1), ``pos``, ``heading``, ``speed``, ``present`` of the experts."""
    p = ctx.pack
    new_step = state.step + 1
    pos, heading, speed, present = bound_op(ctx, step, "replay", lambda backend, check: bind_replay_state(
        backend, check, ctx.config.init_steps, p.traj_pos, p.traj_heading, p.traj_vel, p.traj_valid))(
        state.pos, state.heading, state.speed, state.present, state.controlled, state.removed, state.scenario,
        new_step, log_origin(ctx, state))
    return {"step": new_step, "pos": pos, "heading": heading, "speed": speed, "present": present}
