"""Stage ``replay``: the episode clock advances and the experts follow their log.

Experts (present, not controlled, not removed) take their logged pose at log index
``init_steps + (step - trial_start)`` (``kernels.replay``); past their valid log they leave the
scene (``present`` False).

CPU kernel: on the torch backend with ``EnvConfig.cpu_kernels`` (default) and without ``compile``
(where this stage is traced by ``torch.compile``) it runs the C kernel
``kernels.step_cpu.replay_state_cpu`` (``replay_cpu`` with the replayed mask and the log index
derived in the same pass; bit-identical to the reference; the reference where no C compiler is
available).
"""

from __future__ import annotations

from gpusim.kernels.replay import replay as replay_kernel
from gpusim.kernels.step_cpu import replay_state_cpu
from gpusim.sim.context import SimContext, StepVars, use_step_c
from gpusim.state import EnvState


def replay(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """Changes ``step`` (+1), ``pos``, ``heading``, ``speed``, ``present`` of the experts."""
    p = ctx.pack
    new_step = state.step + 1
    if use_step_c(ctx, state, step):  # replayed and the log index derived in the C pass
        pos, heading, speed, present = replay_state_cpu(
            pos=state.pos, heading=state.heading, speed=state.speed, present=state.present,
            controlled=state.controlled, removed=state.removed, scenario=state.scenario, step=new_step,
            trial_start=state.trial_start, init_steps=ctx.config.init_steps, traj_pos=p.traj_pos,
            traj_heading=p.traj_heading, traj_vel=p.traj_vel, traj_valid=p.traj_valid, check=not step.checked)
        return {"step": new_step, "pos": pos, "heading": heading, "speed": speed, "present": present}
    pos, heading, speed, present = replay_kernel(
        pos=state.pos,
        heading=state.heading,
        speed=state.speed,
        present=state.present,
        replayed=~state.controlled & ~state.removed,
        scenario=state.scenario,
        log_index=ctx.config.init_steps + (new_step - state.trial_start),
        traj_pos=p.traj_pos,
        traj_heading=p.traj_heading,
        traj_vel=p.traj_vel,
        traj_valid=p.traj_valid,
    )
    return {"step": new_step, "pos": pos, "heading": heading, "speed": speed, "present": present}
