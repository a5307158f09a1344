"""Stage ``replay``: the episode clock advances and the experts follow their log.

Experts (present, not controlled, not removed) take their logged pose at log index
``init_steps + (step - trial_start)`` (``kernels.replay``); past their valid log they leave the
scene (``present`` False).

The op is :func:`gpusim.kernels.replay.replay_state` on the step's backend (its C kernel derives
the replayed mask and the log index in its pass).
"""

from __future__ import annotations

from gpusim.kernels.replay import replay_state
from gpusim.sim.context import SimContext, StepVars
from gpusim.state import EnvState


def replay(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """Changes ``step`` (+1), ``pos``, ``heading``, ``speed``, ``present`` of the experts."""
    p = ctx.pack
    new_step = state.step + 1
    pos, heading, speed, present = replay_state(
        pos=state.pos, heading=state.heading, speed=state.speed, present=state.present, controlled=state.controlled,
        removed=state.removed, scenario=state.scenario, step=new_step, trial_start=state.trial_start,
        init_steps=ctx.config.init_steps, traj_pos=p.traj_pos, traj_heading=p.traj_heading, traj_vel=p.traj_vel,
        traj_valid=p.traj_valid, backend=step.backend, check=not step.checked)
    return {"step": new_step, "pos": pos, "heading": heading, "speed": speed, "present": present}
