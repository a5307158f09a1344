"""The built-in pipeline's C path as one straight-line function (issue 20: the CPU step's fixed cost).

On the CPU, a small env's step is mostly Python: eleven stage calls, their C wrappers' argument
handling, a state dict per stage. :func:`fused_step` runs the same C kernels
(``kernels.step_cpu``, ``kernels.observations.cpu``) and the same few torch ops, in the pipeline's
order, on the same inputs, from one function. Its results are the pipeline's bit for bit, and
``tests/test_fused_cpu.py`` checks every state field, result tensor and metric against the
pipeline over several episodes. The pipeline (``gpusim.sim.pipeline``) stays the definition of the
step: this function is an optimisation of one of its paths, as ``gpusim.sim.compiled`` is of
another.

It runs only where every stage would take its plain C path and the state's layout was already
checked (:func:`applies`); otherwise, and whenever a stage hook is set (e.g. the profilers'), the
env runs the pipeline. The conditions:

- ``PIPELINE`` holds exactly the stages of :data:`STAGES`;
- ``StepVars.checked`` and the C kernels (``use_step_c``);
- not the episode-end step: the auto-reset runs in stage ``restart``;
- discrete actions, the kinematic bicycle as the registered model (``motion.DYNAMICS``), and the
  motion tables (``discrete_motion_tables``);
- no trial mode, and a goal behaviour other than RESPAWN / NEW_GOAL (stages ``trial``, ``goals``);
- a pack without traffic signals, so no red-light test and no signal block to fill.

What it writes is what the stages write: the same state fields (one new ``EnvState``), the same
``StepVars`` entries, ``ctx.obs_written`` and the observation buffer; finished agent-episodes go
to the metrics through ``accounting.record_finished``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from gpusim.config import ActionSpace, ContactBehavior, GoalBehavior
from gpusim.kernels import dynamics
from gpusim.kernels.collision import CIRCLE_MARGIN
from gpusim.kernels.grid import grid_table_rows
from gpusim.kernels.observations.cpu import load_library as observation_library
from gpusim.kernels.offroad import PRECHECK_MARGIN
from gpusim.kernels.step_cpu import discrete_motion_tables, events_scalar_args, step_library
from gpusim.kernels.trimath import PI, TWO_PI
from gpusim.kernels.signals import SIGNAL_DIM
from gpusim.sim.accounting import record_finished
from gpusim.sim.context import SimContext, StepVars, use_step_c
from gpusim.sim.motion import model_for
from gpusim.sim.observe import cpu_static
from gpusim.sim.pipeline import PIPELINE
from gpusim.sim.rewards import event_scalars
from gpusim.sim.signals import no_signal_pack
from gpusim.state import EnvState


#: The stages :func:`fused_step` reproduces, in the pipeline's order. Where ``PIPELINE`` holds
#: other stages (one added, removed or reordered) the fused step does not run until it is updated
#: (``tests/test_fused_cpu.py`` fails then, naming this file).
STAGES = ("signals_before", "motion", "replay", "signals", "contacts", "rewards", "goals", "trial", "accounting",
          "restart", "observe")
_PIPELINE_MATCHES = tuple(stage.name for stage in PIPELINE) == STAGES


class Plan(NamedTuple):
    """Per-pack constants of :func:`fused_step`: pointers into the pack's tensors (kept alive by
    ``keep``) and the scalar arguments of the kernels, in their C argument order."""

    traj: tuple
    offroad: tuple
    events: tuple
    T: int
    keep: tuple


def applies(ctx: SimContext, state: EnvState, step: StepVars) -> bool:
    """True when :func:`fused_step` may run this step (module docstring for the conditions).
    Host values only: no tensor is read."""
    cfg = ctx.config
    return (_PIPELINE_MATCHES and step.checked and not step.episode_end and use_step_c(ctx, state, step)
            and cfg.action_space == ActionSpace.DISCRETE and model_for(ctx).forward is dynamics.bicycle_step
            and not cfg.trial_mode and cfg.goal_behavior not in (GoalBehavior.RESPAWN, GoalBehavior.NEW_GOAL)
            and ctx.pack_fact("no_signals", no_signal_pack) and ctx.pack.traj_valid.shape[-1] > 0
            and discrete_motion_tables() is not None and observation_library() is not None)


def _plan(ctx: SimContext, pack) -> Plan:
    edge2, start = grid_table_rows(pack.grid_edge, pack.grid_start, "offroad: grid_edge")
    edge2, start = edge2.contiguous(), start.contiguous()
    offroad = (pack.road_seg.data_ptr(), edge2.data_ptr(), int(edge2.dtype == torch.int16), start.data_ptr(),
               pack.grid_origin.data_ptr(), pack.grid_dims.data_ptr())
    events = events_scalar_args(**ctx.cached("event_scalars", event_scalars))
    traj = (pack.traj_pos.data_ptr(), pack.traj_heading.data_ptr(), pack.traj_vel.data_ptr(),
            pack.traj_valid.data_ptr())
    return Plan(traj, offroad, events, pack.traj_valid.shape[-1], (edge2, start))


def fused_step(ctx: SimContext, state: EnvState, step: StepVars) -> EnvState:
    """The pipeline's step on ``state`` where :func:`applies` holds: returns the new state and sets
    ``step`` as the stages do (``state`` itself is not modified).

    Raises:
        RuntimeError: the observation kernel reports an error (as the observe stage would).
    """
    cfg, C = ctx.config, ctx.num_slots
    lib, olib = step_library(), observation_library()
    plan = ctx.pack_fact("fused_cpu_plan", lambda pk: _plan(ctx, pk))
    tables = discrete_motion_tables()
    W, A = state.present.shape
    nt = torch.get_num_threads()
    e, b = torch.empty, torch.bool
    s = state
    ptr = torch.Tensor.data_ptr

    # signals_before: the slots' centres before the motion
    pos_before = s.pos[:, :C].contiguous()
    # motion: in-play flags, decoding, theta; torch's cos/sin; the bicycle (kernels.step_cpu.motion_discrete_cpu)
    play, mask, theta = e(W, A, dtype=b), e(W, C, dtype=b), e(W, C)
    lib.gpusim_motion_prepare(ptr(s.controlled), ptr(s.present), ptr(s.stopped), ptr(s.removed), ptr(s.world_done),
                              ptr(s.heading), ptr(step.actions), ptr(tables["beta_of"]), ptr(play), ptr(mask),
                              ptr(theta), W, A, C, dynamics.NUM_ACTIONS, nt)
    cos_t, sin_t = torch.cos(theta), torch.sin(theta)
    pos1, heading1, speed1 = e(W, A, 2), e(W, A), e(W, A)
    lib.gpusim_motion_discrete(ptr(s.pos), ptr(s.heading), ptr(s.speed), ptr(s.length), ptr(step.actions),
                               ptr(tables["accel_of"]), ptr(tables["tan_of"]), ptr(tables["cos_b_of"]), ptr(cos_t),
                               ptr(sin_t), ptr(mask), ptr(pos1), ptr(heading1), ptr(speed1), W, A, C,
                               dynamics.NUM_ACTIONS, cfg.dt, dynamics.MAX_ACCEL, dynamics.MIN_SPEED,
                               dynamics.MAX_SPEED, dynamics.MIN_LENGTH, PI, TWO_PI, nt)
    # replay: clock + 1, experts follow the log (kernels.step_cpu.replay_state_cpu)
    new_step = s.step + 1
    pos, heading, speed2, present2 = e(W, A, 2), e(W, A), e(W, A), e(W, A, dtype=b)
    lib.gpusim_replay_state(ptr(pos1), ptr(heading1), ptr(speed1), ptr(s.present), ptr(s.controlled), ptr(s.removed),
                            ptr(s.scenario), ptr(new_step), ptr(s.trial_start), int(cfg.init_steps), *plan.traj,
                            ptr(pos), ptr(heading), ptr(speed2), ptr(present2), W, A, plan.T, nt)
    # free what is dead as soon as it is (as the pipeline frees a stage's replaced fields): at large
    # sizes the allocations that follow then reuse warm memory instead of fresh pages
    del pos1, heading1, speed1, theta, cos_t, sin_t
    # signals: a pack without signals has no stop line to cross
    red = torch.zeros(W, C, dtype=b)
    # contacts: collisions, offroad of the slots, hit-by (collision REMOVE)
    live = present2 & s.controlled
    cos_h, sin_h = torch.cos(heading), torch.sin(heading)
    collided, offroad = e(W, A, dtype=b), e(W, A, dtype=b)
    lib.gpusim_collisions(ptr(pos), ptr(cos_h), ptr(sin_h), ptr(s.length), ptr(s.width), ptr(present2), ptr(live),
                          ptr(collided), W, A, 0.5 * cfg.collision_box_scale, 0.5 * CIRCLE_MARGIN, nt)
    p = ctx.pack
    lib.gpusim_offroad(ptr(pos), ptr(cos_h), ptr(sin_h), ptr(s.length), ptr(s.width), ptr(live), ptr(s.scenario),
                       *plan.offroad, ptr(offroad), W, A, C,
                       p.road_seg.shape[1], p.grid_edge.shape[-1], float(p.cell_size), 0.5 * cfg.offroad_box_scale,
                       PRECHECK_MARGIN, nt)
    if cfg.collision_behavior == ContactBehavior.REMOVE:
        hit, source = e(W, A, dtype=b), play & collided
        lib.gpusim_hit_by(ptr(pos), ptr(cos_h), ptr(sin_h), ptr(s.length), ptr(s.width), ptr(present2), ptr(source),
                          ptr(hit), W, A, A, 0.5 * cfg.collision_box_scale, nt)
    else:
        hit = torch.zeros_like(collided)
    # rewards: the events kernel (kernels.step_cpu.events_cpu)
    ev = (e(W, C), e(W, A, dtype=b), e(W, A), e(W, A, dtype=b), e(W, A, dtype=b), e(W, A, dtype=b),
          e(W, A, dtype=b), e(W, dtype=b), e(W, dtype=b), e(W, C, dtype=b), e(W, C, dtype=b))
    reward, goal_now, speed, present, stopped, cstopped, removed, world_done, truncated, terminal, slot_done = ev
    lib.gpusim_events(ptr(pos), ptr(s.goal), ptr(speed2), ptr(s.controlled), ptr(play), ptr(present2),
                      ptr(collided), ptr(offroad), ptr(hit), ptr(s.stopped), ptr(s.contact_stopped), ptr(s.removed),
                      ptr(s.world_done), ptr(ctx.end_flags[0]), ptr(s.controlled), ptr(s.slot_done),
                      *[ptr(t) for t in ev], W, A, C, *plan.events, A, nt)
    del speed2, present2, live
    if cfg.reward_red_light != 0.0:
        reward = reward + cfg.reward_red_light * red.to(reward.dtype)
    # trial (not trial mode): no truncation, no trial end
    truncation = torch.zeros(W, C, dtype=b)
    # accounting: accumulators, contacts of agents in play, terminal count (kernels.step_cpu.accounting_cpu)
    acc = (e(W, C), e(W, C, dtype=torch.int32), e(W, A, dtype=b), e(W, A, dtype=b), e(W, A, dtype=b),
           e(W, A, dtype=b), e(W, A, dtype=b), e(W, C, dtype=b))
    terminals = lib.gpusim_accounting(ptr(s.ep_return), ptr(reward), ptr(s.ep_length), ptr(mask), ptr(s.goal_reached),
                                      ptr(goal_now), ptr(play), ptr(collided), ptr(offroad), ptr(s.ever_collided),
                                      ptr(s.ever_offroad), ptr(s.ever_red_light), ptr(red), ptr(terminal),
                                      *[ptr(t) for t in acc], W, A, C, nt)
    ep_return, ep_length, goal_reached, col_ip, off_ip, ever_collided, ever_offroad, ever_red_light = acc
    step.in_play, step.loss_mask, step.collided, step.offroad, step.hit = play, mask, collided, offroad, hit
    step.reward, step.goal_now, step.truncated, step.terminal = reward, goal_now, truncated, terminal
    step.truncation, step.trial_ended = truncation, truncation.clone()
    step.set_contacts_in_play(collided=col_ip, offroad=off_ip)
    changes = {"ep_return": ep_return, "ep_length": ep_length, "goal_reached": goal_reached,
               "ever_collided": ever_collided, "ever_offroad": ever_offroad, "ever_red_light": ever_red_light}
    if terminals:
        record_finished(ctx, s, step, changes)
    new = s.replace(pos_before=pos_before, pos=pos, heading=heading, speed=speed, step=new_step, present=present,
                    red_light_now=red, collided_now=collided, offroad_now=offroad, stopped=stopped,
                    contact_stopped=cstopped, removed=removed, last_reward=reward, world_done=world_done,
                    slot_done=slot_done, **changes)
    # observe: the observation of the new state (sim/observe.py's C path), headings' cos/sin reused
    full = ctx.obs_buf
    d0 = full.shape[-1] - cfg.num_signals * SIGNAL_DIM
    written = e(W * C, dtype=b)
    o = cpu_static(ctx)
    rc = olib.gpusim_observations_state(
        ptr(pos), ptr(cos_h), ptr(sin_h), ptr(speed), ptr(s.length), ptr(s.width), ptr(s.agent_type), ptr(present),
        ptr(s.goal), ptr(collided), ptr(offroad), None, None, ptr(reward), ptr(s.controlled), ptr(ctx.obs_written),
        ptr(written), ptr(s.scenario), *o.pack_args, W, ptr(full), full.stride(1), full.shape[-1] - d0,
        *o.constants, nt)
    if rc != 0:
        raise RuntimeError(f"observations_cpu_state: the C kernel returned {rc} (A={A}, K={o.K})")
    ctx.obs_written = written
    step.obs = full
    step.trig = (heading, heading._version, cos_h, sin_h)
    return new
