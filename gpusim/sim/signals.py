"""Stages ``signals_before`` and ``signals``: traffic signals replayed on the log clock, and the
red-light test (``kernels.signals``; docs/signals.md).

Signal states are not copied into the state: every reader (this stage, the observation block, the
renderer) looks them up in the pack at the world's log index ``init_steps + (step - trial_start)``,
the clock of the expert replay, so they restart with each trial in trial mode. Past the end of the
log (or at a step the log has no state for a lane) a signal reads as ``UNKNOWN``: the simulator
does not invent states. :func:`signal_log_index` is that clock.

* ``signals_before`` (first stage of the step) keeps the slots' centres before the motion in
  ``pos_before``.
* ``signals`` (after ``replay``, so the clock has advanced) flags the in-play slots whose centre
  crossed a red signal's stop line during the step (``red_light_now``; the geometry is in
  ``gpusim/kernels/signals.py``). The ``rewards`` stage adds ``reward_red_light`` for it and
  ``accounting`` ORs it into ``ever_red_light`` (metric ``red_light_violation``).

CPU kernel: on the torch backend with ``EnvConfig.cpu_kernels`` (default) and without ``compile``
the red-light test runs the C kernel ``kernels.step_cpu.red_light_cpu`` (same booleans; the
reference where no C compiler is available), and when no scenario of the pack has a signal it
returns all False without a kernel (what every kernel returns then).
"""

from __future__ import annotations

from functools import partial

import torch

from gpusim.kernels.signals import red_light_violation
from gpusim.kernels.step_cpu import red_light_cpu
from gpusim.sim.context import SimContext, StepVars, slots, use_step_c
from gpusim.state import EnvState


def signal_log_index(ctx: SimContext, state: EnvState) -> torch.Tensor:
    """[W] int32 log index of each world's signals: ``init_steps + (step - trial_start)``."""
    return ctx.config.init_steps + (state.step - state.trial_start)


def no_signal_pack(pack) -> bool:
    """True when no scenario of ``pack`` has a traffic signal (a host read: call it once per pack,
    through ``SimContext.pack_fact``)."""
    return int(pack.num_signals.max()) == 0


def signals_before(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """Changes ``pos_before`` (the slots' centres before this step's motion)."""
    return {"pos_before": slots(state.pos, ctx.num_slots)}


def signals(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """Changes ``red_light_now`` [W, C] (in-play slots that crossed a red stop line this step)."""
    p, C = ctx.pack, ctx.num_slots
    use_c = use_step_c(ctx, state, step)
    if use_c and ctx.pack_fact("no_signals", no_signal_pack):  # no stop line to cross: all False
        return {"red_light_now": torch.zeros(state.pos_before.shape[:2], dtype=torch.bool)}
    now = (partial(red_light_cpu, check=not step.checked) if use_c else red_light_violation)(
        pos_before=state.pos_before,
        pos=slots(state.pos, C),
        heading=slots(state.heading, C),
        moving=step.loss_mask.contiguous(),
        scenario=state.scenario,
        log_index=signal_log_index(ctx, state),
        signal_pos=p.signal_pos,
        signal_dir=p.signal_dir,
        signal_state=p.signal_state,
        signal_valid=p.signal_valid,
        num_signals=p.num_signals,
    )
    return {"red_light_now": now}
