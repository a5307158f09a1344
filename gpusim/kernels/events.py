"""Events of one step: goals, rewards, contact behaviours, STOP invalid steps, early truncation and
terminal flags, as one computation (DESIGN.md section 4).

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
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from gpusim.backend import backend_for, interpreting
from gpusim.enums import ContactBehavior, GoalBehavior
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
) -> EventsOut:
    """Goals, rewards, contact behaviours, early truncation and terminal flags of one step.

    Same signature, semantics and errors as :func:`events_reference`; dispatches with
    :func:`gpusim.backend.backend_for` (Triton kernel: one program per world).
    """
    args = (pos, goal, speed, controlled, in_play, present, collided, offroad, hit,
            stopped, contact_stopped, removed, world_done, episode_end, slot_active, slot_done,
            goal_radius, reward_goal, reward_collision, reward_offroad,
            goal_behavior, collision_behavior, offroad_behavior, stop_truncate_fraction)
    if backend_for(pos) == "triton":
        return _events_triton(*args)
    return events_reference(*args)


_HIT_BY_DOC = """Agents touched by a source agent: the "agent it hit" of collision REMOVE.

    Oriented-bounding-box separating-axis test between every source agent and every other present
    agent of its world, with boxes ``box_scale`` times the logged length and width: two boxes
    overlap iff, on each of the four box axes (the two edge normals of each box), the centre
    offset projected on the axis is at most the sum of the two boxes' half-extents on it; touching
    counts, as in ``collision.collisions``. Costs ``W x S x A`` pair tests (S = source slots); the
    env calls it only with collision REMOVE.

    Args:
        pos: [W, A, 2] float32 box centres (m). heading, length, width: [W, A] float32 (rad, m, m).
        present: [W, A] bool; absent agents neither hit nor are hit.
        source: [W, S] bool with S <= A: the source agents are the first S agent slots where set
            (and present); the env passes ``in_play & collided`` ([W, A]).
        box_scale: factor on length and width (> 0).

    Returns:
        [W, A] bool, True for present agents whose box overlaps the box of at least one source
        agent other than themselves.

    Raises (Triton backend): ValueError on wrong shapes, dtypes or devices, or S > A.
    """


def hit_by_reference(pos, heading, length, width, present, source, box_scale: float) -> torch.Tensor:
    S = source.shape[1]
    src = source & present[:, :S]
    hl = 0.5 * box_scale * length
    hw = 0.5 * box_scale * width
    c, s = torch.cos(heading), torch.sin(heading)
    # source box i (first S), target box j (all A): pairs [W, S, A]
    dx = pos[:, None, :, 0] - pos[:, :S, None, 0]
    dy = pos[:, None, :, 1] - pos[:, :S, None, 1]
    ci, si, li, wi = c[:, :S, None], s[:, :S, None], hl[:, :S, None], hw[:, :S, None]
    cj, sj, lj, wj = c[:, None, :], s[:, None, :], hl[:, None, :], hw[:, None, :]
    cos_ij = (ci * cj + si * sj).abs()
    sin_ij = (ci * sj - si * cj).abs()
    # axes of box i: (ci, si) and (-si, ci); axes of box j likewise
    sep = (dx * ci + dy * si).abs() > li + lj * cos_ij + wj * sin_ij
    sep |= (dy * ci - dx * si).abs() > wi + lj * sin_ij + wj * cos_ij
    sep |= (dx * cj + dy * sj).abs() > lj + li * cos_ij + wi * sin_ij
    sep |= (dy * cj - dx * sj).abs() > wj + li * sin_ij + wi * cos_ij
    A = pos.shape[1]
    not_self = torch.arange(S, device=pos.device)[:, None] != torch.arange(A, device=pos.device)[None, :]
    touch = ~sep & src[:, :, None] & present[:, None, :] & not_self[None]
    return touch.any(1)


hit_by_reference.__doc__ = _HIT_BY_DOC


@triton.jit
def _hit_by_kernel(pos_ptr, heading_ptr, length_ptr, width_ptr, present_ptr, source_ptr, out_ptr,
                   A, S, box_scale, BLOCK: tl.constexpr, BLOCK_S: tl.constexpr):
    """Program (w, b): targets j of block b of world w (rows of a [BLOCK, BLOCK_S] tile) against
    the S source slots, BLOCK_S at a time (columns). Every program owns its outputs (no atomics)."""
    w = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mj = j < A
    gj = w * A + j
    qx = tl.load(pos_ptr + 2 * gj, mask=mj, other=0.0)[:, None]
    qy = tl.load(pos_ptr + 2 * gj + 1, mask=mj, other=0.0)[:, None]
    hj = tl.load(heading_ptr + gj, mask=mj, other=0.0)
    lj = (0.5 * box_scale * tl.load(length_ptr + gj, mask=mj, other=0.0))[:, None]
    wj = (0.5 * box_scale * tl.load(width_ptr + gj, mask=mj, other=0.0))[:, None]
    pj = ((tl.load(present_ptr + gj, mask=mj, other=0) != 0) & mj)[:, None]
    cj = tl.cos(hj)[:, None]
    sj = tl.sin(hj)[:, None]
    hit = tl.zeros([BLOCK], dtype=tl.int32)
    for i0 in range(0, S, BLOCK_S):
        i = i0 + tl.arange(0, BLOCK_S).to(tl.int64)
        mi = i < S
        gi = w * A + i
        src = (tl.load(source_ptr + w * S + i, mask=mi, other=0) != 0) & \
            (tl.load(present_ptr + gi, mask=mi, other=0) != 0) & mi
        px = tl.load(pos_ptr + 2 * gi, mask=mi, other=0.0)[None, :]
        py = tl.load(pos_ptr + 2 * gi + 1, mask=mi, other=0.0)[None, :]
        hi = tl.load(heading_ptr + gi, mask=mi, other=0.0)
        li = (0.5 * box_scale * tl.load(length_ptr + gi, mask=mi, other=0.0))[None, :]
        wi = (0.5 * box_scale * tl.load(width_ptr + gi, mask=mi, other=0.0))[None, :]
        ci = tl.cos(hi)[None, :]
        si = tl.sin(hi)[None, :]
        dx = qx - px
        dy = qy - py
        cos_ij = tl.abs(ci * cj + si * sj)
        sin_ij = tl.abs(ci * sj - si * cj)
        sep = tl.abs(dx * ci + dy * si) > li + lj * cos_ij + wj * sin_ij
        sep = sep | (tl.abs(dy * ci - dx * si) > wi + lj * sin_ij + wj * cos_ij)
        sep = sep | (tl.abs(dx * cj + dy * sj) > lj + li * cos_ij + wi * sin_ij)
        sep = sep | (tl.abs(dy * cj - dx * sj) > wj + li * sin_ij + wi * cos_ij)
        touch = (~sep) & pj & src[None, :] & (j[:, None] != i[None, :])
        hit = tl.maximum(hit, tl.max(touch.to(tl.int32), axis=1))
    tl.store(out_ptr + gj, hit.to(tl.int8), mask=mj)


def _hit_by_triton(pos, heading, length, width, present, source, box_scale: float, block: int | None = None,
                   block_s: int | None = None, out: torch.Tensor | None = None):
    """Launcher. ``block`` (targets per program), ``block_s`` (sources per tile column) and ``out`` (a
    preallocated [W, A] int8 tensor whose every element the kernel overwrites with 0 or 1) are for
    tests; by default a program covers up to 64 targets x 32 sources per loop iteration (all S at
    once when interpreting)."""
    if heading.dim() != 2 or source.dim() != 2:
        raise ValueError(f"hit_by: heading and source must be 2-D, got {tuple(heading.shape)}, {tuple(source.shape)}")
    W, A = heading.shape
    S = source.shape[1]
    if S > A or source.shape[0] != W:
        raise ValueError(f"hit_by: source must be [W={W}, S <= A={A}], got {tuple(source.shape)}")
    dev = heading.device
    for name, t, shape, dtype in (
        ("pos", pos, (W, A, 2), torch.float32), ("heading", heading, (W, A), torch.float32),
        ("length", length, (W, A), torch.float32), ("width", width, (W, A), torch.float32),
        ("present", present, (W, A), torch.bool), ("source", source, (W, S), torch.bool),
    ):
        if tuple(t.shape) != shape or t.dtype != dtype or t.device != dev:
            raise ValueError(f"hit_by: {name} must be {dtype} {shape} on {dev}, "
                             f"got {t.dtype} {tuple(t.shape)} on {t.device}")
    if out is None:
        out = torch.empty((W, A), dtype=torch.int8, device=dev)
    if W and A:
        if block is None:
            block = max(16, min(64, triton.next_power_of_2(A)))
        if block_s is None:
            block_s = max(16, min(128 if interpreting() else 32, triton.next_power_of_2(max(S, 1))))
        grid = (W, triton.cdiv(A, block))
        _hit_by_kernel[grid](pos.contiguous(), heading.contiguous(), length.contiguous(), width.contiguous(),
                             present.contiguous().view(torch.uint8), source.contiguous().view(torch.uint8), out,
                             A, S, float(box_scale), BLOCK=block, BLOCK_S=block_s)
    return out != 0


def hit_by(pos, heading, length, width, present, source, box_scale: float) -> torch.Tensor:
    if backend_for(heading) == "triton":
        return _hit_by_triton(pos, heading, length, width, present, source, box_scale)
    return hit_by_reference(pos, heading, length, width, present, source, box_scale)


hit_by.__doc__ = _HIT_BY_DOC + """
    Dispatch: :func:`gpusim.backend.backend_for` (Triton kernel: one program per world and block of
    target agents), else :func:`hit_by_reference`.
    """
