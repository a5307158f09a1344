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

The red-light test runs on the step's backend (``kernels.signals.red_light_state``, bound once per
pack: on the C backend it returns all False at once when no scenario of the pack has a signal).
"""

from __future__ import annotations

import torch

from gpusim.kernels.clocks import log_index
from gpusim.kernels.signals import bind_red_light_state
from gpusim.sim.context import SimContext, StepVars, bound_op, slots
from gpusim.sim.random_start import log_origin
from gpusim.state import EnvState


def signal_log_index(ctx: SimContext, state: EnvState) -> torch.Tensor:
    """[W] int32 log index of each world's signals: ``init_steps + (step - trial_start)`` (plus
    ``start_offset`` with random start, :func:`gpusim.sim.random_start.log_origin`)."""
    return log_index(ctx.config.init_steps, state.step, log_origin(ctx, state))


def no_signal_pack(pack) -> bool:
    """True when no scenario of ``pack`` has a traffic signal (a host read: call it once per pack,
    through ``SimContext.pack_fact``)."""
    return int(pack.num_signals.max()) == 0


def signals_before(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """Changes ``pos_before`` (the slots' centres before this step's motion)."""
    return {"pos_before": slots(state.pos, ctx.num_slots)}


def signals(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """Changes ``red_light_now`` [W, C] (in-play slots that crossed a red stop line this step)."""
    p = ctx.pack
    now = bound_op(ctx, step, "red_light", lambda backend, check: bind_red_light_state(
        backend, check, ctx.config.init_steps, p.signal_pos, p.signal_dir, p.signal_state, p.signal_valid,
        p.num_signals))(state.pos_before, state.pos, state.heading, step.loss_mask, state.scenario, state.step,
                        log_origin(ctx, state))
    return {"red_light_now": now}
