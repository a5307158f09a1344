"""Hand-written C kernels of the step's small stages for the CPU (``step_cpu.c``).

On the torch backend the ``contacts``, ``replay``, ``motion``, ``signals`` and ``rewards`` stages
call these by default (``EnvConfig.cpu_kernels``; docs/performance.md "C contact and replay
kernels (CPU)" and "C kernels of the small CPU stages"):

* :func:`collisions_cpu` = :func:`gpusim.kernels.collision.collisions_reference` (OBB
  separating-axis test, same bounding-circle pre-check and margin),
* :func:`hit_by_cpu` = :func:`gpusim.kernels.events.hit_by_reference`,
* :func:`offroad_cpu` = :func:`gpusim.kernels.offroad.offroad_reference` on the first ``C`` slots,
* :func:`replay_cpu` = :func:`gpusim.kernels.replay.replay_reference` (and :func:`replay_state_cpu`,
  the same with ``replayed`` and ``log_index`` derived from the state in the C pass),
* :func:`in_play_cpu` = :func:`gpusim.state.in_play` and its first C columns (stage ``motion``),
* :func:`events_cpu` = :func:`gpusim.kernels.events.events_reference` (stage ``rewards``),
* :func:`red_light_cpu` = :func:`gpusim.kernels.signals.red_light_violation_reference` (stage
  ``signals``),
* :func:`bicycle_slots_cpu` = :func:`gpusim.kernels.dynamics.bicycle_step_reference` on the first
  ``C`` slots, written into full ``[W, A]`` tensors (stage ``motion``), and
  :func:`motion_discrete_cpu`, the same plus :func:`in_play_cpu` and the action decoding for
  discrete actions, with the per-action transcendental values from a table
  (:func:`discrete_motion_tables`).

Same float32 operations in the same order (``-ffp-contract=off``), cos/sin (and for the motion
tan/atan) from torch, scalars rounded to float32 as torch's tensor-scalar ops do: every output
equals the reference's bit for bit (tests/test_contacts_c.py, tests/test_stages_c.py). One loop
per world (OpenMP over worlds, ``torch.get_num_threads()`` threads); the only torch ops left
around them are those transcendental functions.

This module is longer than most (~670 lines) on purpose: it is the one Python face of one C
library, a ctypes declaration and a checked wrapper per C entry point, and the wrappers share
the library handle and the argument checks, which are private to it.

Build: :class:`gpusim.kernels.cbuild.CLibrary` (compiled at first use with ``$CC``, cached in
``~/.cache/gpusim/step_cpu-<hash>.so``). Where it cannot be built, one ``RuntimeWarning`` names the
reason and each function runs its torch reference (same results, slower).
"""

from __future__ import annotations

import ctypes
import math
from pathlib import Path

import torch

from gpusim.enums import RED_SIGNAL_STATES, ContactBehavior, GoalBehavior
from gpusim.kernels import dynamics
from gpusim.kernels.cbuild import CLibrary, check_index_range
from gpusim.kernels.collision import CIRCLE_MARGIN, collisions_reference
from gpusim.kernels.events import EventsOut, events_reference, hit_by_reference
from gpusim.kernels.grid import grid_table_rows
from gpusim.kernels.offroad import PRECHECK_MARGIN, offroad_reference
from gpusim.kernels.replay import replay_reference
from gpusim.kernels.signals import STOP_LINE_HALF_WIDTH, STOP_LINE_MAX_ANGLE, red_light_violation_reference
from gpusim.kernels.trimath import PI, TWO_PI

#: Version of the C argument lists (``gpusim_step_abi()`` in step_cpu.c must return it).
ABI = 7
SOURCE = Path(__file__).with_name("step_cpu.c")
_REMOVE, _STOP, _GOAL_STOP = int(ContactBehavior.REMOVE), int(ContactBehavior.STOP), int(GoalBehavior.STOP)


def _declare(lib) -> None:
    """ctypes signatures of the kernels (step_cpu.c)."""
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    for fn, args in (
        (lib.gpusim_collisions, [p] * 8 + [i64, i64, f32, f32, i32]),
        (lib.gpusim_hit_by, [p] * 8 + [i64, i64, i64, f32, i32]),
        (lib.gpusim_offroad, [p] * 9 + [i32] + [p] * 4 + [i64] * 5 + [f32] * 3 + [i32]),
        (lib.gpusim_replay, [p] * 15 + [i64] * 3 + [i32]),
        (lib.gpusim_events, [p] * 27 + [i64] * 3 + [f32] * 4 + [i32] * 5 + [f32, i64, i32]),
        (lib.gpusim_red_light, [p] * 13 + [i64] * 4 + [i32, i32, f32, f32, i32]),
        (lib.gpusim_motion, [p] * 13 + [i64] * 3 + [f32] * 7 + [i32]),
        (lib.gpusim_replay_state, [p] * 9 + [i64] + [p] * 8 + [i64] * 3 + [i32]),
        (lib.gpusim_in_play, [p] * 7 + [i64] * 3 + [i32]),
        (lib.gpusim_motion_prepare, [p] * 11 + [i64] * 4 + [i32]),
        (lib.gpusim_motion_discrete, [p] * 14 + [i64] * 4 + [f32] * 7 + [i32]),
    ):
        fn.restype, fn.argtypes = None, args
    lib.gpusim_accounting.restype = i64
    lib.gpusim_accounting.argtypes = [p] * 22 + [i64] * 3 + [i32]


_LIB = CLibrary(name="step_cpu", source=SOURCE, prefix="gpusim_step", abi=ABI, declare=_declare,
                label="C step kernels")


def step_kernels_available() -> bool:
    """True when the C library is built and loaded (builds it on first call; warns once if not)."""
    return _LIB.load(stacklevel=3) is not None


def step_library():
    """The loaded C library (ctypes handle, built on first call), or None where it cannot be built.
    For callers that drive the kernels directly on a layout they established themselves
    (``gpusim.sim.fused_cpu``); every other caller goes through the checked wrappers here."""
    return _LIB.load(stacklevel=3)


def step_kernels_status() -> dict:
    """``{"available", "reason", "openmp", "path"}`` of the library (builds it on first call)."""
    return _LIB.status()


def forget_step_library() -> None:
    """Forget the loaded library and any build failure (tests: another ``CC`` or cache directory)."""
    _LIB.forget()


def _c(t: torch.Tensor, fn: str, name: str, dtype, shape) -> torch.Tensor:
    """``t`` as a contiguous CPU tensor of ``dtype`` and ``shape`` (a copy only when not already).
    Called ~60 times a step, so the test is cheap and the message is built only on failure."""
    if t.dtype is not dtype or t.shape != shape or not t.is_cpu:
        raise ValueError(f"{fn}: {name} must be a CPU {dtype} tensor of shape {tuple(shape)}, "
                         f"got {t.dtype} {tuple(t.shape)} on {t.device}")
    return t if t.is_contiguous() else t.contiguous()


def _trusted(t: torch.Tensor, fn: str, name: str, dtype, shape) -> torch.Tensor:
    """:func:`_c` without the checks (``check=False``: the caller guarantees the layout)."""
    return t


def _bool_out(out, W: int, A: int, name: str) -> torch.Tensor:
    if out is None:
        return torch.empty(W, A, dtype=torch.bool)
    if out.dtype != torch.bool or tuple(out.shape) != (W, A) or not out.is_contiguous() or out.device.type != "cpu":
        raise ValueError(f"{name}: out must be a contiguous CPU bool tensor of shape {(W, A)}")
    return out


def _trig(heading, cos_h, sin_h):
    if cos_h is None or sin_h is None:
        return torch.cos(heading), torch.sin(heading)
    return cos_h.contiguous(), sin_h.contiguous()


def _box_inputs(cc, fn: str, pos, heading, length, width, present):
    W, A = heading.shape
    return (W, A, cc(pos, fn, "pos", torch.float32, (W, A, 2)),
            cc(heading, fn, "heading", torch.float32, (W, A)),
            cc(length, fn, "length", torch.float32, (W, A)), cc(width, fn, "width", torch.float32, (W, A)),
            cc(present, fn, "present", torch.bool, (W, A)))


def collisions_cpu(pos, heading, length, width, present, box_scale: float, num_query: int | None = None,
                   query: torch.Tensor | None = None, cos_h=None, sin_h=None, out=None, check: bool = True):
    """C version of :func:`gpusim.kernels.collision.collisions` (same arguments and result; see
    there). Extra keywords: ``cos_h``, ``sin_h`` [W, A] float32 ``torch.cos/sin(heading)`` when the
    caller has them; ``out`` [W, A] bool contiguous, every element overwritten.

    Args:
        check: False skips the argument checks (the env's pipeline, on a state whose layout an
            earlier checked step established: ``gpusim.sim.context.StepVars.checked``).

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device.
    """
    cc = _c if check else _trusted
    W, A, pos, heading, length, width, present = _box_inputs(cc, "collisions", pos, heading, length, width, present)
    if query is None:
        Q = A if num_query is None else max(0, min(int(num_query), A))
        query = torch.zeros(W, A, dtype=torch.bool)
        query[:, :Q] = True
    query = cc(query, "collisions", "query", torch.bool, (W, A))
    lib = _LIB.load(stacklevel=3)
    if lib is None:
        ref = collisions_reference(pos, heading, length, width, present, box_scale, query=query)
        return ref if out is None else out.copy_(ref)
    out = _bool_out(out, W, A, "collisions")
    c, s = _trig(heading, cos_h, sin_h)
    lib.gpusim_collisions(pos.data_ptr(), c.data_ptr(), s.data_ptr(), length.data_ptr(), width.data_ptr(),
                          present.data_ptr(), query.data_ptr(), out.data_ptr(), W, A, 0.5 * box_scale,
                          0.5 * CIRCLE_MARGIN, torch.get_num_threads())
    return out


def hit_by_cpu(pos, heading, length, width, present, source, box_scale: float, cos_h=None, sin_h=None, out=None,
               check: bool = True):
    """C version of :func:`gpusim.kernels.events.hit_by` (same arguments and result; ``source``
    [W, S] bool, S <= A). ``cos_h``, ``sin_h``, ``out`` as in :func:`collisions_cpu`.

    Args:
        check: False skips the argument checks (the env's pipeline, on a state whose layout an
            earlier checked step established: ``gpusim.sim.context.StepVars.checked``).

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device.
    """
    cc = _c if check else _trusted
    W, A, pos, heading, length, width, present = _box_inputs(cc, "hit_by", pos, heading, length, width, present)
    if source.dim() != 2 or source.shape[0] != W or source.shape[1] > A:
        raise ValueError(f"hit_by: source must be [W, S] bool with S <= {A}, got {tuple(source.shape)}")
    S = source.shape[1]
    source = cc(source, "hit_by", "source", torch.bool, (W, S))
    lib = _LIB.load(stacklevel=3)
    if lib is None:
        ref = hit_by_reference(pos, heading, length, width, present, source, box_scale)
        return ref if out is None else out.copy_(ref)
    out = _bool_out(out, W, A, "hit_by")
    c, s = _trig(heading, cos_h, sin_h)
    lib.gpusim_hit_by(pos.data_ptr(), c.data_ptr(), s.data_ptr(), length.data_ptr(), width.data_ptr(),
                      present.data_ptr(), source.data_ptr(), out.data_ptr(), W, A, S, 0.5 * box_scale,
                      torch.get_num_threads())
    return out


def offroad_cpu(pos, heading, length, width, present, scenario, road_seg, grid_edge, grid_origin, grid_dims,
                cell_size: float, box_scale: float, grid_start=None, num_slots: int | None = None,
                cos_h=None, sin_h=None, out=None, check: bool = True):
    """C version of :func:`gpusim.kernels.offroad.offroad` (same arguments; see there), tested for
    the first ``num_slots`` agents of each world only (default all A): the result [W, A] bool is
    False in the other columns, and equals ``offroad_reference`` on ``[:, :num_slots]`` views of
    the inputs there. ``cos_h``, ``sin_h``, ``out`` as in :func:`collisions_cpu`.

    Args:
        check: False skips the argument checks (the env's pipeline, on a state whose layout an
            earlier checked step established: ``gpusim.sim.context.StepVars.checked``).

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device; a grid table of the wrong layout.
    """
    cc = _c if check else _trusted
    W, A, pos, heading, length, width, present = _box_inputs(cc, "offroad", pos, heading, length, width, present)
    C = A if num_slots is None else int(num_slots)
    if not 0 <= C <= A:
        raise ValueError(f"offroad: num_slots must lie in [0, {A}], got {num_slots}")
    S, R = road_seg.shape[:2]
    road_seg = cc(road_seg, "offroad", "road_seg", torch.float32, (S, R, 4))
    edge2, start = grid_table_rows(grid_edge, grid_start, "offroad: grid_edge")
    scenario = cc(scenario, "offroad", "scenario", torch.int64, (W,))
    grid_origin = cc(grid_origin, "offroad", "grid_origin", torch.float32, (S, 2))
    grid_dims = cc(grid_dims, "offroad", "grid_dims", torch.int32, (S, 2))
    lib = _LIB.load(stacklevel=3)
    if lib is None:
        sl = (slice(None), slice(0, C))
        ref = torch.zeros(W, A, dtype=torch.bool)
        ref[sl] = offroad_reference(pos[sl], heading[sl], length[sl], width[sl], present[sl], scenario, road_seg,
                                    grid_edge, grid_origin, grid_dims, cell_size, box_scale, grid_start)
        return ref if out is None else out.copy_(ref)
    out = _bool_out(out, W, A, "offroad")
    if check:
        check_index_range(scenario, S, f"offroad: scenario indices must lie in [0, S = {S})")
    edge2, start = edge2.contiguous(), start.contiguous()
    c, s = _trig(heading, cos_h, sin_h)
    lib.gpusim_offroad(pos.data_ptr(), c.data_ptr(), s.data_ptr(), length.data_ptr(), width.data_ptr(),
                       present.data_ptr(), scenario.data_ptr(), road_seg.data_ptr(), edge2.data_ptr(),
                       int(edge2.dtype == torch.int16), start.data_ptr(), grid_origin.data_ptr(),
                       grid_dims.data_ptr(), out.data_ptr(), W, A, C, R, edge2.shape[1], float(cell_size),
                       0.5 * box_scale, PRECHECK_MARGIN, torch.get_num_threads())
    return out


def replay_cpu(pos, heading, speed, present, replayed, scenario, log_index, traj_pos, traj_heading, traj_vel,
               traj_valid, out=None):
    """C version of :func:`gpusim.kernels.replay.replay` (same arguments and result; see there).
    ``out``: optional ``(pos, heading, speed, present)`` tensors of the result's shapes and
    dtypes (contiguous), every element overwritten.

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device.
    """
    W, A = present.shape
    S, _, T = traj_valid.shape
    args = [_c(t, "replay", n, d, sh) for t, n, d, sh in (
        (pos, "pos", torch.float32, (W, A, 2)), (heading, "heading", torch.float32, (W, A)),
        (speed, "speed", torch.float32, (W, A)), (present, "present", torch.bool, (W, A)),
        (replayed, "replayed", torch.bool, (W, A)), (scenario, "scenario", torch.int64, (W,)),
    )]
    if tuple(log_index.shape) != (W,) or log_index.dtype not in (torch.int32, torch.int64):
        raise ValueError("replay: log_index must be a [W] int32/int64 tensor")
    args.append(log_index.to(torch.int64).contiguous())
    args += [_c(t, "replay", n, d, sh) for t, n, d, sh in (
        (traj_pos, "traj_pos", torch.float32, (S, A, T, 2)), (traj_heading, "traj_heading", torch.float32, (S, A, T)),
        (traj_vel, "traj_vel", torch.float32, (S, A, T, 2)), (traj_valid, "traj_valid", torch.bool, (S, A, T)),
    )]
    lib = _LIB.load(stacklevel=3)
    if lib is None or T == 0:
        ref = replay_reference(*args)
        return ref if out is None else tuple(o.copy_(r) for o, r in zip(out, ref))
    if out is None:
        out = (torch.empty(W, A, 2), torch.empty(W, A), torch.empty(W, A), torch.empty(W, A, dtype=torch.bool))
    for o, ref_t in zip(out, args[:4]):
        if o.dtype != ref_t.dtype or o.shape != ref_t.shape or not o.is_contiguous() or o.device.type != "cpu":
            raise ValueError(f"replay: out tensors must be contiguous CPU {ref_t.dtype} {tuple(ref_t.shape)}")
    check_index_range(args[5], S, f"replay: scenario indices must lie in [0, S = {S})")
    lib.gpusim_replay(*(t.data_ptr() for t in args + list(out)), W, A, T, torch.get_num_threads())
    return tuple(out)


def replay_state_cpu(pos, heading, speed, present, controlled, removed, scenario, step, trial_start,
                     init_steps: int, traj_pos, traj_heading, traj_vel, traj_valid, check: bool = True):
    """Stage ``replay``'s call of :func:`replay_cpu` with the two derived inputs computed in the C
    pass: the result equals ``replay_cpu(..., replayed=~controlled & ~removed, log_index=init_steps
    + (step - trial_start), ...)`` (new tensors), without the four torch ops that build them.

    Args:
        controlled, removed: [W, A] bool. step, trial_start: [W] int32 (``step`` the new clock).
        init_steps: log index of step 0. The rest as :func:`replay_cpu`.
        check: False skips the argument checks (the env's pipeline, on a state whose layout an
            earlier checked step established: ``gpusim.sim.context.StepVars.checked``).

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device.
    """
    W, A = present.shape
    S, _, T = traj_valid.shape
    f32, b = torch.float32, torch.bool
    if not check:  # the caller guarantees the layout: no per-argument calls (fixed cost per step)
        args = [pos, heading, speed, present, controlled, removed, scenario, step, trial_start]
        traj = [traj_pos, traj_heading, traj_vel, traj_valid]
    else:
        args = [_c(t, "replay", n, d, sh) for t, n, d, sh in (
            (pos, "pos", f32, (W, A, 2)), (heading, "heading", f32, (W, A)), (speed, "speed", f32, (W, A)),
            (present, "present", b, (W, A)), (controlled, "controlled", b, (W, A)), (removed, "removed", b, (W, A)),
            (scenario, "scenario", torch.int64, (W,)), (step, "step", torch.int32, (W,)),
            (trial_start, "trial_start", torch.int32, (W,)),
        )]
        traj = [_c(t, "replay", n, d, sh) for t, n, d, sh in (
            (traj_pos, "traj_pos", f32, (S, A, T, 2)), (traj_heading, "traj_heading", f32, (S, A, T)),
            (traj_vel, "traj_vel", f32, (S, A, T, 2)), (traj_valid, "traj_valid", b, (S, A, T)),
        )]
    lib = _LIB.load(stacklevel=3)
    if lib is None or T == 0:
        pos, heading, speed, present, controlled, removed, scenario, step, trial_start = args
        return replay_reference(pos, heading, speed, present, ~controlled & ~removed, scenario,
                                init_steps + (step - trial_start), *traj)
    if check:
        check_index_range(args[6], S, f"replay: scenario indices must lie in [0, S = {S})")
    out = (torch.empty(W, A, 2), torch.empty(W, A), torch.empty(W, A), torch.empty(W, A, dtype=b))
    lib.gpusim_replay_state(*[t.data_ptr() for t in args], int(init_steps), *[t.data_ptr() for t in traj],
                            *[t.data_ptr() for t in out], W, A, T, torch.get_num_threads())
    return out


def in_play_cpu(controlled, present, stopped, removed, world_done, num_slots: int, check: bool = True):
    """:func:`gpusim.state.in_play` from its five flag tensors, plus its first ``num_slots`` columns,
    in one C pass (stage ``motion``): ``(in_play [W, A] bool, loss_mask [W, C] bool)``, new
    contiguous tensors, equal to ``in_play`` and ``in_play[:, :C]``.

    Args:
        controlled, present, stopped, removed: [W, A] bool. world_done: [W] bool. num_slots: C <= A.
        check: False skips the argument checks (the env's pipeline, on a state whose layout an
            earlier checked step established: ``gpusim.sim.context.StepVars.checked``).

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device; C outside [0, A].
    """
    W, A = present.shape
    C = int(num_slots)
    if not 0 <= C <= A:
        raise ValueError(f"in_play: num_slots must lie in [0, {A}], got {num_slots}")
    b = torch.bool
    ins = [controlled, present, stopped, removed, world_done] if not check else [
        _c(t, "in_play", n, b, sh) for t, n, sh in (
            (controlled, "controlled", (W, A)), (present, "present", (W, A)), (stopped, "stopped", (W, A)),
            (removed, "removed", (W, A)), (world_done, "world_done", (W,)))]
    lib = _LIB.load(stacklevel=3)
    if lib is None:
        play = ins[0] & ins[1] & ~ins[2] & ~ins[3] & ~ins[4][:, None]
        return play, play[:, :C].contiguous()
    play, mask = torch.empty(W, A, dtype=b), torch.empty(W, C, dtype=b)
    lib.gpusim_in_play(*[t.data_ptr() for t in ins], play.data_ptr(), mask.data_ptr(), W, A, C,
                       torch.get_num_threads())
    return play, mask


def events_cpu(pos, goal, speed, controlled, in_play, present, collided, offroad, hit, stopped, contact_stopped,
               removed, world_done, episode_end, slot_active, slot_done, goal_radius: float, reward_goal: float,
               reward_collision: float, reward_offroad: float, goal_behavior: int, collision_behavior: int,
               offroad_behavior: int, stop_truncate_fraction: float, check: bool = True) -> EventsOut:
    """C version of :func:`gpusim.kernels.events.events` (same arguments and result, new tensors;
    see there): one pass per world instead of ~50 torch ops. Scalars enter as float32, as in
    torch's tensor-scalar ops, so every output equals the reference's bit for bit.

    Args:
        check: False skips the argument checks (the env's pipeline, on a state whose layout an
            earlier checked step established: ``gpusim.sim.context.StepVars.checked``); then
            ``slot_active`` may also be a row-strided view such as ``controlled[:, :C]``.

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
        ins = [_c(t, "events", n, d, sh) for t, n, d, sh in (
            (pos, "pos", f32, (W, A, 2)), (goal, "goal", f32, (W, A, 2)), (speed, "speed", f32, (W, A)),
            (controlled, "controlled", b, (W, A)), (in_play, "in_play", b, (W, A)), (present, "present", b, (W, A)),
            (collided, "collided", b, (W, A)), (offroad, "offroad", b, (W, A)), (hit, "hit", b, (W, A)),
            (stopped, "stopped", b, (W, A)), (contact_stopped, "contact_stopped", b, (W, A)),
            (removed, "removed", b, (W, A)), (world_done, "world_done", b, (W,)),
            (episode_end, "episode_end", b, (W,)), (slot_active, "slot_active", b, (W, C)),
            (slot_done, "slot_done", b, (W, C)),
        )]
    lib = _LIB.load(stacklevel=3)
    if lib is None:
        return events_reference(*ins, goal_radius, reward_goal, reward_collision, reward_offroad, goal_behavior,
                                collision_behavior, offroad_behavior, stop_truncate_fraction)
    e = torch.empty
    out = EventsOut(e(W, C), e(W, A, dtype=b), e(W, A), e(W, A, dtype=b), e(W, A, dtype=b), e(W, A, dtype=b),
                    e(W, A, dtype=b), e(W, dtype=b), e(W, dtype=b), e(W, C, dtype=b), e(W, C, dtype=b))
    scalars = events_scalar_args(goal_radius, reward_goal, reward_collision, reward_offroad, goal_behavior,
                                 collision_behavior, offroad_behavior, stop_truncate_fraction)
    lib.gpusim_events(*[t.data_ptr() for t in ins], *[t.data_ptr() for t in out], W, A, C, *scalars,
                      ins[14].stride(0), torch.get_num_threads())
    return out


def events_scalar_args(goal_radius: float, reward_goal: float, reward_collision: float, reward_offroad: float,
                       goal_behavior: int, collision_behavior: int, offroad_behavior: int,
                       stop_truncate_fraction: float) -> tuple:
    """The scalar arguments of the C events kernel, in its order, from ``events``' keywords: the
    squared goal radius (m^2), the three rewards, the REMOVE / STOP flags of collisions and offroad,
    the goal STOP flag and the truncation fraction."""
    col, off = int(collision_behavior), int(offroad_behavior)
    return (goal_radius * goal_radius, reward_goal, reward_collision, reward_offroad, col == _REMOVE,
            off == _REMOVE, col == _STOP, off == _STOP, int(goal_behavior) == _GOAL_STOP, stop_truncate_fraction)


def red_light_cpu(pos_before, pos, heading, moving, scenario, log_index, signal_pos, signal_dir, signal_state,
                  signal_valid, num_signals, cos_h=None, sin_h=None, out=None, check: bool = True) -> torch.Tensor:
    """C version of :func:`gpusim.kernels.signals.red_light_violation` with the default stop-line
    half width and angle (same arguments and [W, C] bool result; see there). ``cos_h``, ``sin_h``
    [W, C] float32 ``torch.cos/sin(heading)`` when the caller has them; ``out`` [W, C] bool
    contiguous, every element overwritten.

    Args:
        check: False skips the argument checks (the env's pipeline, on a state whose layout an
            earlier checked step established: ``gpusim.sim.context.StepVars.checked``).

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device.
    """
    cc = _c if check else _trusted
    W, C = heading.shape
    S, T, L = signal_state.shape
    ins = [cc(t, "red_light", n, d, sh) for t, n, d, sh in (
        (pos_before, "pos_before", torch.float32, (W, C, 2)), (pos, "pos", torch.float32, (W, C, 2)),
        (heading, "heading", torch.float32, (W, C)), (moving, "moving", torch.bool, (W, C)),
        (scenario, "scenario", torch.int64, (W,)),
        (signal_pos, "signal_pos", torch.float32, (S, L, 2)), (signal_dir, "signal_dir", torch.float32, (S, L, 2)),
        (signal_state, "signal_state", torch.int8, (S, T, L)), (signal_valid, "signal_valid", torch.bool, (S, T, L)),
        (num_signals, "num_signals", torch.int32, (S,)),
    )]
    if tuple(log_index.shape) != (W,) or log_index.dtype not in (torch.int32, torch.int64):
        raise ValueError("red_light: log_index must be a [W] int32/int64 tensor")
    lib = _LIB.load(stacklevel=3)
    if lib is None:
        ref = red_light_violation_reference(*ins[:5], log_index, *ins[5:])
        return ref if out is None else out.copy_(ref)
    out = _bool_out(out, W, C, "red_light")
    if check:
        check_index_range(ins[4], S, f"red_light: scenario indices must lie in [0, S = {S})")
    c, s = _trig(ins[2], cos_h, sin_h)
    pb, p, _, mv, sc, sp, sd, st, sv, ns = ins
    red = [int(v) for v in RED_SIGNAL_STATES]
    li = log_index.to(torch.int64).contiguous()  # kept alive through the call
    lib.gpusim_red_light(pb.data_ptr(), p.data_ptr(), c.data_ptr(), s.data_ptr(), mv.data_ptr(), sc.data_ptr(),
                         li.data_ptr(), sp.data_ptr(), sd.data_ptr(),
                         st.data_ptr(), sv.data_ptr(), ns.data_ptr(), out.data_ptr(), W, C, T, L, red[0], red[1],
                         STOP_LINE_HALF_WIDTH, math.cos(STOP_LINE_MAX_ANGLE), torch.get_num_threads())
    return out


def bicycle_slots_cpu(pos, heading, speed, length, accel, steer, moving, dt: float, check: bool = True):
    """:func:`gpusim.kernels.dynamics.bicycle_step` of the first ``C`` agent slots, returned as
    full tensors: the result equals ``with_slots(t, bicycle_step_reference(t[:, :C] ...))`` for
    each of pos, heading, speed, bit for bit (columns >= C copied unchanged).

    The transcendental functions run as the reference's torch ops (tan, atan, cos, sin on [W, C]
    tensors, so their values are torch's); the rest (clamps, speed, yaw rate, position, wrapped
    heading, the ``moving`` select) is one C pass: ~10 torch ops instead of ~45.

    Args:
        pos: [W, A, 2] float32 (m). heading, speed, length: [W, A] float32 (rad, m/s, m).
        accel, steer: [W, C] float32 controls (m/s^2, rad), C <= A. moving: [W, C] bool.
        dt: step (s).
        check: False skips the argument checks (the env's pipeline, on a state whose layout an
            earlier checked step established: ``gpusim.sim.context.StepVars.checked``).

    Returns:
        ``(pos [W, A, 2], heading [W, A], speed [W, A])`` float32, new tensors.

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device.
    """
    W, A = heading.shape
    C = accel.shape[1] if accel.dim() == 2 else -1
    if not 0 <= C <= A:
        raise ValueError(f"bicycle_slots: accel must be [W, C] with C <= {A}, got {tuple(accel.shape)}")
    f32 = torch.float32
    if check:
        pos, heading, speed, length = (_c(t, "bicycle_slots", n, f32, sh) for t, n, sh in (
            (pos, "pos", (W, A, 2)), (heading, "heading", (W, A)), (speed, "speed", (W, A)),
            (length, "length", (W, A))))
        accel = _c(accel, "bicycle_slots", "accel", f32, (W, C))
        steer = _c(steer, "bicycle_slots", "steer", f32, (W, C))
        moving = _c(moving, "bicycle_slots", "moving", torch.bool, (W, C))
    lib = _LIB.load(stacklevel=3)
    if lib is None:
        p2, h2, v2 = dynamics.bicycle_step_reference(pos[:, :C], heading[:, :C], speed[:, :C], length[:, :C],
                                                     accel, steer, moving, dt)
        return (torch.cat([p2, pos[:, C:]], 1), torch.cat([h2, heading[:, C:]], 1),
                torch.cat([v2, speed[:, C:]], 1))
    # the reference's transcendental ops, on the same [W, C] values
    tan_d = torch.tan(steer.clamp(-dynamics.MAX_STEER, dynamics.MAX_STEER))
    beta = torch.atan(0.5 * tan_d)
    cos_b = torch.cos(beta)
    theta = heading[:, :C] + beta
    cos_t, sin_t = torch.cos(theta), torch.sin(theta)
    out = (torch.empty(W, A, 2), torch.empty(W, A), torch.empty(W, A))
    lib.gpusim_motion(pos.data_ptr(), heading.data_ptr(), speed.data_ptr(), length.data_ptr(), accel.data_ptr(),
                      tan_d.data_ptr(), cos_b.data_ptr(), cos_t.data_ptr(), sin_t.data_ptr(), moving.data_ptr(),
                      out[0].data_ptr(), out[1].data_ptr(), out[2].data_ptr(), W, A, C, dt, dynamics.MAX_ACCEL,
                      dynamics.MIN_SPEED, dynamics.MAX_SPEED, dynamics.MIN_LENGTH, PI, TWO_PI,
                      torch.get_num_threads())
    return out


_MOTION_TABLES: list = []  # [tables or None], built once per process


def discrete_motion_tables() -> dict | None:
    """Per-action float32 tables [91] of the discrete motion: ``accel_of`` (m/s^2), ``tan_of``
    (tan of the clamped steering angle), ``beta_of`` (slip angle ``atan(0.5 tan)``, rad),
    ``cos_b_of`` (its cosine), computed with the reference's torch ops
    (:func:`gpusim.kernels.dynamics.bicycle_step_reference`) on the decoded table values.

    A table value equals the reference's per-agent value only if torch returns the same float for
    an element wherever it sits in a tensor (its CPU kernels run a vectorised body and a scalar
    tail, which may differ in the last bit on some machines). That is checked here once: each op on
    the table alone, element by element, and shifted by every offset 0..39. Returns None when any
    value depends on its position (the caller then runs the per-agent ops)."""
    if _MOTION_TABLES:
        return _MOTION_TABLES[0]
    tables = dynamics.action_tables(torch.device("cpu"))
    steer = tables["steer_of"]
    ops = (lambda x: torch.tan(x.clamp(-dynamics.MAX_STEER, dynamics.MAX_STEER)),
           lambda x: torch.atan(0.5 * x), torch.cos)
    values, x = [], steer
    for op in ops:
        y = op(x)
        same = all(torch.equal(op(torch.cat([torch.zeros(k), x]))[k:], y) for k in range(40))
        same = same and all(torch.equal(op(x[i:i + 1]), y[i:i + 1]) for i in range(x.numel()))
        if not same:
            _MOTION_TABLES.append(None)
            return None
        values.append(y)
        x = y
    tan_of, beta_of, cos_b_of = values
    out = {"accel_of": tables["accel_of"].contiguous(), "tan_of": tan_of.contiguous(),
           "beta_of": beta_of.contiguous(), "cos_b_of": cos_b_of.contiguous()}
    _MOTION_TABLES.append(out)
    return out


def motion_discrete_cpu(controlled, present, stopped, removed, world_done, pos, heading, speed, length, actions,
                        dt: float, check: bool = True):
    """Stage ``motion`` for discrete actions in two C passes around torch's cos/sin: equals
    :func:`in_play_cpu` followed by :func:`bicycle_slots_cpu` on
    ``dynamics.decode_actions(actions, 0)`` moving the in-play slots, bit for bit (the tan/atan/cos
    of the steering come from :func:`discrete_motion_tables`; the caller uses the per-agent path when
    that returns None).

    Args:
        controlled, present, stopped, removed: [W, A] bool. world_done: [W] bool.
        pos: [W, A, 2] float32 (m). heading, speed, length: [W, A] float32 (rad, m/s, m).
        actions: [W, C] int64 joint action indices (clamped to [0, 91) as ``decode_actions`` does).
        dt: step (s). check: False skips the argument checks (``StepVars.checked``).

    Returns:
        ``(in_play [W, A] bool, loss_mask [W, C] bool, pos [W, A, 2], heading [W, A], speed [W, A])``,
        new tensors.

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device; no tables on this machine.
    """
    tables = discrete_motion_tables()
    lib = _LIB.load(stacklevel=3)
    if tables is None or lib is None:
        raise ValueError("motion_discrete: needs the C library and position-independent tables "
                         "(step_kernels_available(), discrete_motion_tables())")
    W, A = present.shape
    C = actions.shape[1] if actions.dim() == 2 else -1
    if not 0 <= C <= A:
        raise ValueError(f"motion_discrete: actions must be [W, C] with C <= {A}, got {tuple(actions.shape)}")
    if check:
        b, f32 = torch.bool, torch.float32
        controlled, present, stopped, removed = (_c(t, "motion_discrete", n, b, (W, A)) for t, n in (
            (controlled, "controlled"), (present, "present"), (stopped, "stopped"), (removed, "removed")))
        world_done = _c(world_done, "motion_discrete", "world_done", b, (W,))
        pos = _c(pos, "motion_discrete", "pos", f32, (W, A, 2))
        heading, speed, length = (_c(t, "motion_discrete", n, f32, (W, A)) for t, n in (
            (heading, "heading"), (speed, "speed"), (length, "length")))
        actions = _c(actions, "motion_discrete", "actions", torch.int64, (W, C))
    n_act, threads = dynamics.NUM_ACTIONS, torch.get_num_threads()
    play, mask = torch.empty(W, A, dtype=torch.bool), torch.empty(W, C, dtype=torch.bool)
    theta = torch.empty(W, C)
    lib.gpusim_motion_prepare(controlled.data_ptr(), present.data_ptr(), stopped.data_ptr(), removed.data_ptr(),
                              world_done.data_ptr(), heading.data_ptr(), actions.data_ptr(),
                              tables["beta_of"].data_ptr(), play.data_ptr(), mask.data_ptr(), theta.data_ptr(),
                              W, A, C, n_act, threads)
    cos_t, sin_t = torch.cos(theta), torch.sin(theta)  # the reference's ops on the same [W, C] values
    out = (torch.empty(W, A, 2), torch.empty(W, A), torch.empty(W, A))
    lib.gpusim_motion_discrete(pos.data_ptr(), heading.data_ptr(), speed.data_ptr(), length.data_ptr(),
                               actions.data_ptr(), tables["accel_of"].data_ptr(), tables["tan_of"].data_ptr(),
                               tables["cos_b_of"].data_ptr(), cos_t.data_ptr(), sin_t.data_ptr(), mask.data_ptr(),
                               out[0].data_ptr(), out[1].data_ptr(), out[2].data_ptr(), W, A, C, n_act, dt,
                               dynamics.MAX_ACCEL, dynamics.MIN_SPEED, dynamics.MAX_SPEED, dynamics.MIN_LENGTH, PI,
                               TWO_PI, threads)
    return play, mask, out[0], out[1], out[2]


def accounting_cpu(ep_return, reward, ep_length, loss_mask, goal_reached, goal_now, in_play, collided, offroad,
                   ever_collided, ever_offroad, ever_red_light, red_light_now, terminal, check: bool = True):
    """The accumulator updates of stage ``accounting`` in one C pass (new tensors, equal to the torch
    expressions bit for bit): ``ep_return + reward``, ``ep_length + loss_mask``,
    ``goal_reached | goal_now``, ``ever_collided | (in_play & collided)``,
    ``ever_offroad | (in_play & offroad)``, ``ever_red_light | red_light_now``, plus the contacts of
    agents in play and the number of terminal slots (a host int from the C call: no tensor read).

    Args:
        ep_return, reward: [W, C] float32. ep_length: [W, C] int32. loss_mask: [W, C] bool.
        goal_reached, goal_now, in_play, collided, offroad, ever_collided, ever_offroad: [W, A] bool.
        ever_red_light, red_light_now, terminal: [W, C] bool.
        check: False skips the argument checks (``StepVars.checked``).

    Returns:
        ``(changes, collided_in_play [W, A] bool, offroad_in_play [W, A] bool, terminals: int)``;
        ``changes`` maps ``ep_return``, ``ep_length``, ``goal_reached``, ``ever_collided``,
        ``ever_offroad``, ``ever_red_light`` to their new tensors.

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device.
    """
    W, A = in_play.shape
    C = ep_return.shape[1]
    b = torch.bool
    ins = [ep_return, reward, ep_length, loss_mask, goal_reached, goal_now, in_play, collided, offroad,
           ever_collided, ever_offroad, ever_red_light, red_light_now, terminal]
    if check:
        specs = ((torch.float32, (W, C)), (torch.float32, (W, C)), (torch.int32, (W, C)), (b, (W, C))) + \
            ((b, (W, A)),) * 7 + ((b, (W, C)),) * 3
        names = ("ep_return", "reward", "ep_length", "loss_mask", "goal_reached", "goal_now", "in_play", "collided",
                 "offroad", "ever_collided", "ever_offroad", "ever_red_light", "red_light_now", "terminal")
        ins = [_c(t, "accounting", n, d, sh) for t, n, (d, sh) in zip(ins, names, specs)]
    lib = _LIB.load(stacklevel=3)
    if lib is None:
        ret, rew, length, mask, reached, now, play, col, off, ever_c, ever_o, ever_r, red, term = ins
        col_ip, off_ip = play & col, play & off
        changes = {"ep_return": ret + rew, "ep_length": length + mask, "goal_reached": reached | now,
                   "ever_collided": ever_c | col_ip, "ever_offroad": ever_o | off_ip, "ever_red_light": ever_r | red}
        return changes, col_ip, off_ip, int(term.sum())
    e = torch.empty
    outs = [e(W, C), e(W, C, dtype=torch.int32), e(W, A, dtype=b), e(W, A, dtype=b), e(W, A, dtype=b),
            e(W, A, dtype=b), e(W, A, dtype=b), e(W, C, dtype=b)]
    terminals = lib.gpusim_accounting(*[t.data_ptr() for t in ins], *[t.data_ptr() for t in outs], W, A, C,
                                      torch.get_num_threads())
    ret, length, reached, col_ip, off_ip, ever_c, ever_o, ever_r = outs
    changes = {"ep_return": ret, "ep_length": length, "goal_reached": reached, "ever_collided": ever_c,
               "ever_offroad": ever_o, "ever_red_light": ever_r}
    return changes, col_ip, off_ip, int(terminals)
