"""Events of one step: goals, rewards, contact behaviours, STOP invalid steps, early truncation and
terminal flags, as one computation (docs/design.md sections 7 and 8).

Inputs describe the state after the step's motion and contact tests; ``in_play[w, a]`` says that
controlled agent ``a`` acted in this step (active slot, not stopped, not removed, world not done).
Rules, per world ``w`` and agent ``a``:

* Goal: ``goal_now = in_play & |pos - goal| <= goal_radius``.
* Reward (only in play; every other step is an invalid step with reward 0):
  ``reward_goal * goal_now + reward_collision * collided + reward_offroad * offroad``.
  IGNORE behaviours therefore pay the penalty at every step in contact.
* REMOVE: an in-play agent in collision (collision REMOVE) or offroad (offroad REMOVE) is removed;
  with collision REMOVE every present agent in ``hit`` (touched by such an agent) is removed too.
  Removed agents leave the scene (``present = False``).
* STOP: an in-play agent in contact with a STOP behaviour, not removed, becomes ``stopped`` and
  ``contact_stopped``; with goal STOP an in-play agent that reaches its goal becomes ``stopped``
  (not ``contact_stopped``). Newly stopped agents get speed 0. A contact and a goal in the same
  step both pay their rewards; removal takes precedence over stopping.
* Early truncation: a world not yet done whose ``contact_stopped`` controlled agents number at
  least ``stop_truncate_fraction`` times its controlled agents is truncated now (goal stops and
  removals do not count, so a world in which every agent reached its goal runs to the horizon).
* Terminal: ``terminal = (truncated now | episode_end) & slot_active & ~slot_done``, so each active
  slot gets exactly one terminal per episode; ``slot_done`` records it.

GOAL behaviours RESPAWN and NEW_GOAL need the initial pose / a sampled goal: the env applies
them where ``goal_now`` holds and the agent is still in play. TRIAL is handled by the env.

Backends (``backend=`` of :func:`events`): the torch reference, the Triton kernel (one program per
world) and the C kernel of ``events.c`` (one pass per world instead of ~50 torch ops; scalars
enter as float32, as in torch's tensor-scalar ops, so every output is the reference's bit for bit).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from gpusim.backend import WITH_C, op_backend
from gpusim.enums import ContactBehavior, GoalBehavior
from gpusim.kernels.cbuild import STEP_LABEL, CLibrary, CStruct, c_tensor, declare_struct_entry
from gpusim.kernels.checks import check_tensors


class EventsOut(NamedTuple):
    """Outputs of :func:`events` (W worlds, A agent slots, C policy slots)."""

    reward: torch.Tensor  # [W, C] float32
    goal_now: torch.Tensor  # [W, A] bool
    speed: torch.Tensor  # [W, A] float32
    present: torch.Tensor  # [W, A] bool
    stopped: torch.Tensor  # [W, A] bool
    contact_stopped: torch.Tensor  # [W, A] bool
    removed: torch.Tensor  # [W, A] bool
    world_done: torch.Tensor  # [W] bool
    truncated: torch.Tensor  # [W] bool, truncated early in this step
    terminal: torch.Tensor  # [W, C] bool
    slot_done: torch.Tensor  # [W, C] bool


def events_reference(
    pos, goal, speed, controlled, in_play, present, collided, offroad, hit,
    stopped, contact_stopped, removed, world_done, episode_end, slot_active, slot_done,
    goal_radius: float, reward_goal: float, reward_collision: float, reward_offroad: float,
    goal_behavior: int, collision_behavior: int, offroad_behavior: int, stop_truncate_fraction: float,
) -> EventsOut:
    """Goals, rewards, contact behaviours, early truncation and terminal flags of one step.

    Args:
        pos, goal: [W, A, 2] float32 positions and goals (m).
        speed: [W, A] float32 speeds (m/s).
        controlled, in_play, present, collided, offroad, hit, stopped, contact_stopped, removed:
            [W, A] bool (see the module docstring).
        world_done, episode_end: [W] bool (already truncated; this step completes the horizon).
        slot_active, slot_done: [W, C] bool, C <= A.
        goal_radius: m. reward_*: rewards per event.
        goal_behavior, collision_behavior, offroad_behavior: ``GoalBehavior`` / ``ContactBehavior``
            codes. stop_truncate_fraction: in (0, 1].

    Returns:
        :class:`EventsOut` of new tensors (inputs are not modified).

    Raises:
        ValueError: on inconsistent shapes or dtypes (Triton launcher).
    """
    C = slot_active.shape[1]
    d2 = ((pos - goal) ** 2).sum(-1)
    goal_now = in_play & (d2 <= goal_radius * goal_radius)
    col = in_play & collided
    off = in_play & offroad
    rew = (goal_now.float() * reward_goal + col.float() * reward_collision + off.float() * reward_offroad)
    reward = rew[:, :C].contiguous()

    rm_col = collision_behavior == ContactBehavior.REMOVE
    rm_off = offroad_behavior == ContactBehavior.REMOVE
    new_removed = removed.clone()
    if rm_col:
        new_removed |= col | (hit & present)
    if rm_off:
        new_removed |= off
    new_present = present & ~new_removed

    cs = torch.zeros_like(col)
    if collision_behavior == ContactBehavior.STOP:
        cs |= col
    if offroad_behavior == ContactBehavior.STOP:
        cs |= off
    cs &= ~new_removed
    new_stop = cs.clone()
    if goal_behavior == GoalBehavior.STOP:
        new_stop |= goal_now & ~new_removed
    new_stopped = stopped | new_stop
    new_cstopped = contact_stopped | cs
    new_speed = torch.where(new_stop, torch.zeros_like(speed), speed)

    n_ctrl = controlled.sum(1)
    n_cs = (new_cstopped & controlled).sum(1)
    trunc = (~world_done) & (n_ctrl > 0) & (n_cs.float() >= stop_truncate_fraction * n_ctrl.float() - 1e-6)
    new_world_done = world_done | trunc
    terminal = (trunc | episode_end)[:, None] & slot_active & ~slot_done
    new_slot_done = slot_done | terminal
    return EventsOut(reward, goal_now, new_speed, new_present, new_stopped, new_cstopped, new_removed,
                     new_world_done, trunc, terminal, new_slot_done)


@triton.jit
def _events_kernel(
    pos_ptr, goal_ptr, speed_ptr, controlled_ptr, in_play_ptr, present_ptr, collided_ptr, offroad_ptr,
    hit_ptr, stopped_ptr, cstopped_ptr, removed_ptr, world_done_ptr, episode_end_ptr,
    slot_active_ptr, slot_done_ptr,
    o_reward_ptr, o_goal_ptr, o_speed_ptr, o_present_ptr, o_stopped_ptr, o_cstopped_ptr, o_removed_ptr,
    o_world_done_ptr, o_trunc_ptr, o_terminal_ptr, o_slot_done_ptr,
    A, C, goal_r2, r_goal, r_col, r_off, frac,
    GOAL_STOP: tl.constexpr, COL_STOP: tl.constexpr, COL_REMOVE: tl.constexpr,
    OFF_STOP: tl.constexpr, OFF_REMOVE: tl.constexpr, BLOCK_A: tl.constexpr,
):
    w = tl.program_id(0).to(tl.int64)
    a = tl.arange(0, BLOCK_A).to(tl.int64)
    m = a < A
    o = w * A + a
    px = tl.load(pos_ptr + 2 * o, mask=m, other=0.0)
    py = tl.load(pos_ptr + 2 * o + 1, mask=m, other=0.0)
    gx = tl.load(goal_ptr + 2 * o, mask=m, other=0.0)
    gy = tl.load(goal_ptr + 2 * o + 1, mask=m, other=0.0)
    sp = tl.load(speed_ptr + o, mask=m, other=0.0)
    ctrl = tl.load(controlled_ptr + o, mask=m, other=0) != 0
    play = tl.load(in_play_ptr + o, mask=m, other=0) != 0
    pres = tl.load(present_ptr + o, mask=m, other=0) != 0
    coll = tl.load(collided_ptr + o, mask=m, other=0) != 0
    offr = tl.load(offroad_ptr + o, mask=m, other=0) != 0
    hit = tl.load(hit_ptr + o, mask=m, other=0) != 0
    stp = tl.load(stopped_ptr + o, mask=m, other=0) != 0
    cst = tl.load(cstopped_ptr + o, mask=m, other=0) != 0
    rem = tl.load(removed_ptr + o, mask=m, other=0) != 0
    wdone = tl.load(world_done_ptr + w) != 0
    eend = tl.load(episode_end_ptr + w) != 0

    dx = px - gx
    dy = py - gy
    goal_now = play & ((dx * dx + dy * dy) <= goal_r2)
    col = play & coll
    off = play & offr
    rew = goal_now.to(tl.float32) * r_goal + col.to(tl.float32) * r_col + off.to(tl.float32) * r_off

    new_rem = rem
    if COL_REMOVE:
        new_rem = new_rem | col | (hit & pres)
    if OFF_REMOVE:
        new_rem = new_rem | off
    new_pres = pres & (~new_rem)
    cs = a < 0  # all False
    if COL_STOP:
        cs = cs | col
    if OFF_STOP:
        cs = cs | off
    cs = cs & (~new_rem)
    new_stop = cs
    if GOAL_STOP:
        new_stop = new_stop | (goal_now & (~new_rem))
    new_stopped = stp | new_stop
    new_cst = cst | cs
    new_sp = tl.where(new_stop, 0.0, sp)

    n_ctrl = tl.sum((ctrl & m).to(tl.float32), axis=0)
    n_cs = tl.sum((new_cst & ctrl & m).to(tl.float32), axis=0)
    trunc = (~wdone) & (n_ctrl > 0) & (n_cs >= frac * n_ctrl - 1e-6)

    tl.store(o_speed_ptr + o, new_sp, mask=m)
    tl.store(o_goal_ptr + o, goal_now.to(tl.int8), mask=m)
    tl.store(o_present_ptr + o, new_pres.to(tl.int8), mask=m)
    tl.store(o_stopped_ptr + o, new_stopped.to(tl.int8), mask=m)
    tl.store(o_cstopped_ptr + o, new_cst.to(tl.int8), mask=m)
    tl.store(o_removed_ptr + o, new_rem.to(tl.int8), mask=m)
    tl.store(o_world_done_ptr + w, (wdone | trunc).to(tl.int8))
    tl.store(o_trunc_ptr + w, trunc.to(tl.int8))

    ms = a < C
    os_ = w * C + a
    sa = tl.load(slot_active_ptr + os_, mask=ms, other=0) != 0
    sd = tl.load(slot_done_ptr + os_, mask=ms, other=0) != 0
    term = (trunc | eend) & sa & (~sd)
    tl.store(o_reward_ptr + os_, rew, mask=ms)
    tl.store(o_terminal_ptr + os_, term.to(tl.int8), mask=ms)
    tl.store(o_slot_done_ptr + os_, (sd | term).to(tl.int8), mask=ms)


def _events_triton(pos, goal, speed, controlled, in_play, present, collided, offroad, hit,
                   stopped, contact_stopped, removed, world_done, episode_end, slot_active, slot_done,
                   goal_radius, reward_goal, reward_collision, reward_offroad,
                   goal_behavior, collision_behavior, offroad_behavior, stop_truncate_fraction):
    W, A = controlled.shape
    C = slot_active.shape[1]
    dev = pos.device
    spec = [
        (pos, (W, A, 2), torch.float32, "pos"), (goal, (W, A, 2), torch.float32, "goal"),
        (speed, (W, A), torch.float32, "speed"),
        (world_done, (W,), torch.bool, "world_done"), (episode_end, (W,), torch.bool, "episode_end"),
        (slot_active, (W, C), torch.bool, "slot_active"), (slot_done, (W, C), torch.bool, "slot_done"),
    ] + [(t, (W, A), torch.bool, n) for t, n in (
        (controlled, "controlled"), (in_play, "in_play"), (present, "present"), (collided, "collided"),
        (offroad, "offroad"), (hit, "hit"), (stopped, "stopped"), (contact_stopped, "contact_stopped"),
        (removed, "removed"))]
    check_tensors("events", spec, dev)
    if C > A:
        raise ValueError(f"events: {C} policy slots exceed {A} agent slots")
    i8 = lambda t: t.view(torch.int8)  # noqa: E731
    reward = torch.empty((W, C), dtype=torch.float32, device=dev)
    outs_wa = [torch.empty((W, A), dtype=torch.int8, device=dev) for _ in range(5)]
    o_speed = torch.empty_like(speed)
    o_wd = torch.empty((W,), dtype=torch.int8, device=dev)
    o_tr = torch.empty((W,), dtype=torch.int8, device=dev)
    o_term = torch.empty((W, C), dtype=torch.int8, device=dev)
    o_sd = torch.empty((W, C), dtype=torch.int8, device=dev)
    if W > 0 and A > 0:
        _events_kernel[(W,)](
            pos, goal, speed, i8(controlled), i8(in_play), i8(present), i8(collided), i8(offroad), i8(hit),
            i8(stopped), i8(contact_stopped), i8(removed), i8(world_done), i8(episode_end),
            i8(slot_active), i8(slot_done),
            reward, outs_wa[0], o_speed, outs_wa[1], outs_wa[2], outs_wa[3], outs_wa[4],
            o_wd, o_tr, o_term, o_sd,
            A, C, float(goal_radius) ** 2, float(reward_goal), float(reward_collision), float(reward_offroad),
            float(stop_truncate_fraction),
            GOAL_STOP=int(goal_behavior) == GoalBehavior.STOP,
            COL_STOP=int(collision_behavior) == ContactBehavior.STOP,
            COL_REMOVE=int(collision_behavior) == ContactBehavior.REMOVE,
            OFF_STOP=int(offroad_behavior) == ContactBehavior.STOP,
            OFF_REMOVE=int(offroad_behavior) == ContactBehavior.REMOVE,
            BLOCK_A=triton.next_power_of_2(max(A, C)),
        )
    goal_now, present_o, stopped_o, cst_o, removed_o = (t.bool() for t in outs_wa)
    return EventsOut(reward, goal_now, o_speed, present_o, stopped_o, cst_o, removed_o,
                     o_wd.bool(), o_tr.bool(), o_term.bool(), o_sd.bool())


def events(
    pos, goal, speed, controlled, in_play, present, collided, offroad, hit,
    stopped, contact_stopped, removed, world_done, episode_end, slot_active, slot_done,
    goal_radius: float, reward_goal: float, reward_collision: float, reward_offroad: float,
    goal_behavior: int, collision_behavior: int, offroad_behavior: int, stop_truncate_fraction: float,
    *, backend: str | None = None, check: bool = True,
) -> EventsOut:
    """Goals, rewards, contact behaviours, early truncation and terminal flags of one step.

    Same signature, semantics and errors as :func:`events_reference`; ``backend``: ``"torch"`` |
    ``"triton"`` | ``"c"`` | ``"cupy"`` (the Triton kernel; default :func:`gpusim.backend.op_backend`);
    ``check``: the C kernel's argument checks (:func:`events_cpu`), ignored by the others.
    """
    args = (pos, goal, speed, controlled, in_play, present, collided, offroad, hit,
            stopped, contact_stopped, removed, world_done, episode_end, slot_active, slot_done,
            goal_radius, reward_goal, reward_collision, reward_offroad,
            goal_behavior, collision_behavior, offroad_behavior, stop_truncate_fraction)
    name = op_backend(backend, pos, WITH_C)
    if name == "c":
        return events_cpu(*args, check=check)
    if name == "triton":  # the kernel indexes raw pointers: contiguous inputs (a no-op when they are)
        return _events_triton(*(a.contiguous() if isinstance(a, torch.Tensor) else a for a in args))
    return events_reference(*args)


# ---------------------------------------------------------------------------- C kernel (events.c)
#: The argument struct of ``gpusim_events`` (events.c; its C twin is generated from this table).
EVENTS_ARGS = CStruct("EventsArgs", """
    const float *pos, const float *goal, const float *speed, const uint8_t *controlled,
    const uint8_t *in_play, const uint8_t *present, const uint8_t *collided, const uint8_t *offroad,
    const uint8_t *hit, const uint8_t *stopped, const uint8_t *contact_stopped, const uint8_t *removed,
    const uint8_t *world_done, const uint8_t *episode_end, const uint8_t *slot_active, const uint8_t *slot_done,
    float *reward, uint8_t *goal_now, float *speed_out, uint8_t *present_out, uint8_t *stopped_out,
    uint8_t *cstopped_out, uint8_t *removed_out, uint8_t *world_done_out, uint8_t *trunc_out, uint8_t *terminal,
    uint8_t *slot_done_out, int64_t W, int64_t A, int64_t C, float r2, float reward_goal, float reward_collision,
    float reward_offroad, int rm_col, int rm_off, int stop_col, int stop_off, int stop_goal, float frac,
    int64_t sa_stride, int num_threads""")


def _declare(lib) -> None:
    """ctypes signature of events.c: one :data:`EVENTS_ARGS` struct."""
    declare_struct_entry(lib, "gpusim_events")


#: events.c, built at first use (:class:`gpusim.kernels.cbuild.CLibrary`).
LIBRARY = CLibrary(name="events", source=Path(__file__).with_suffix(".c"), prefix="gpusim_events", abi=2,
                   declare=_declare, label=STEP_LABEL, structs=(EVENTS_ARGS,))


@functools.lru_cache(maxsize=64)
def events_scalar_args(goal_radius: float, reward_goal: float, reward_collision: float, reward_offroad: float,
                       goal_behavior: int, collision_behavior: int, offroad_behavior: int,
                       stop_truncate_fraction: float) -> dict:
    """The scalar fields of the C kernel's :data:`EVENTS_ARGS`, by name, from :func:`events`'
    keywords: the squared goal radius ``r2`` (m^2), the three rewards, the REMOVE / STOP flags of
    collisions and offroad, the goal STOP flag and the truncation fraction ``frac``."""
    col, off = int(collision_behavior), int(offroad_behavior)
    rm, st = int(ContactBehavior.REMOVE), int(ContactBehavior.STOP)
    return dict(r2=goal_radius * goal_radius, reward_goal=reward_goal, reward_collision=reward_collision,
                reward_offroad=reward_offroad, rm_col=int(col == rm), rm_off=int(off == rm), stop_col=int(col == st),
                stop_off=int(off == st), stop_goal=int(int(goal_behavior) == int(GoalBehavior.STOP)),
                frac=stop_truncate_fraction)


def bind_events(backend: str | None, check: bool, goal_radius: float, reward_goal: float, reward_collision: float,
                reward_offroad: float, goal_behavior: int, collision_behavior: int, offroad_behavior: int,
                stop_truncate_fraction: float):
    """:func:`events` with its scalars (and ``backend``, ``check``) bound: returns
    ``fn(pos, goal, speed, controlled, in_play, present, collided, offroad, hit, stopped,
    contact_stopped, removed, world_done, episode_end, slot_active, slot_done) -> EventsOut``, where
    ``slot_active`` may also be a wider [W, A] bool tensor whose first C columns are the slots
    (C = ``slot_done.shape[1]``; the env passes ``controlled``). On the C backend without checks
    (the env's checked layout) ``fn`` calls the kernel directly, reading those columns in place;
    else it calls :func:`events` on ``slot_active[:, :C]``."""
    scalars = (goal_radius, reward_goal, reward_collision, reward_offroad, goal_behavior, collision_behavior,
               offroad_behavior, stop_truncate_fraction)
    lib = LIBRARY.load(stacklevel=4) if backend == "c" and not check else None
    if lib is None:
        def call(*tensors):
            active, done = tensors[14], tensors[15]
            return events(*tensors[:14], active[:, :done.shape[1]], done, *scalars, backend=backend, check=check)
        return call
    kernel, e, b = lib.gpusim_events, torch.empty, torch.bool
    args = EVENTS_ARGS.bind(**events_scalar_args(*scalars))

    def run(pos, goal, speed, controlled, in_play, present, collided, offroad, hit, stopped, contact_stopped, removed,
            world_done, episode_end, slot_active, slot_done):
        W, A = present.shape
        C = slot_done.shape[1]
        out = EventsOut(reward=e(W, C), goal_now=e(W, A, dtype=b), speed=e(W, A), present=e(W, A, dtype=b),
                        stopped=e(W, A, dtype=b), contact_stopped=e(W, A, dtype=b), removed=e(W, A, dtype=b),
                        world_done=e(W, dtype=b), truncated=e(W, dtype=b), terminal=e(W, C, dtype=b),
                        slot_done=e(W, C, dtype=b))
        kernel(args(
            pos=pos, goal=goal, speed=speed, controlled=controlled, in_play=in_play, present=present,
            collided=collided, offroad=offroad, hit=hit, stopped=stopped, contact_stopped=contact_stopped,
            removed=removed, world_done=world_done, episode_end=episode_end, slot_active=slot_active,
            slot_done=slot_done, reward=out.reward, goal_now=out.goal_now, speed_out=out.speed,
            present_out=out.present, stopped_out=out.stopped, cstopped_out=out.contact_stopped,
            removed_out=out.removed, world_done_out=out.world_done, trunc_out=out.truncated, terminal=out.terminal,
            slot_done_out=out.slot_done, W=W, A=A, C=C, sa_stride=slot_active.stride(0),
            num_threads=torch.get_num_threads()))
        return out
    return run


def events_cpu(pos, goal, speed, controlled, in_play, present, collided, offroad, hit, stopped, contact_stopped,
               removed, world_done, episode_end, slot_active, slot_done, goal_radius: float, reward_goal: float,
               reward_collision: float, reward_offroad: float, goal_behavior: int, collision_behavior: int,
               offroad_behavior: int, stop_truncate_fraction: float, check: bool = True) -> EventsOut:
    """The C kernel of :func:`events` (same arguments and result, new tensors). Runs
    :func:`events_reference` where the library cannot be built.

    Args:
        check: False skips the argument checks (the env, on a state whose layout an earlier checked
            step established: ``StepVars.checked``); then ``slot_active`` may also be a row-strided
            view such as ``controlled[:, :C]``.

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device.
    """
    W, A = present.shape
    C = slot_active.shape[1]
    f32, b = torch.float32, torch.bool
    if not check:  # the caller guarantees the layout: no per-argument calls (fixed cost per step)
        if slot_active.stride(-1) != 1:  # a row-strided view (e.g. controlled[:, :C]) is read in place
            slot_active = slot_active.contiguous()
        ins = [pos, goal, speed, controlled, in_play, present, collided, offroad, hit, stopped, contact_stopped,
               removed, world_done, episode_end, slot_active, slot_done]
    else:
        ins = [c_tensor(t, "events", n, d, sh) for t, n, d, sh in (
            (pos, "pos", f32, (W, A, 2)), (goal, "goal", f32, (W, A, 2)), (speed, "speed", f32, (W, A)),
            (controlled, "controlled", b, (W, A)), (in_play, "in_play", b, (W, A)), (present, "present", b, (W, A)),
            (collided, "collided", b, (W, A)), (offroad, "offroad", b, (W, A)), (hit, "hit", b, (W, A)),
            (stopped, "stopped", b, (W, A)), (contact_stopped, "contact_stopped", b, (W, A)),
            (removed, "removed", b, (W, A)), (world_done, "world_done", b, (W,)),
            (episode_end, "episode_end", b, (W,)), (slot_active, "slot_active", b, (W, C)),
            (slot_done, "slot_done", b, (W, C)),
        )]
    lib = LIBRARY.load(stacklevel=4)
    if lib is None:
        return events_reference(*ins, goal_radius, reward_goal, reward_collision, reward_offroad, goal_behavior,
                                collision_behavior, offroad_behavior, stop_truncate_fraction)
    return bind_events("c", False, goal_radius, reward_goal, reward_collision, reward_offroad, goal_behavior,
                       collision_behavior, offroad_behavior, stop_truncate_fraction)(*ins)
