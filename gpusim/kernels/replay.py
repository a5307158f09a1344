"""Log replay: log-replayed ("expert") agents take their logged pose at a per-world log index.

For world ``w`` running scenario ``s = scenario[w]`` and agent slot ``a`` with ``replayed[w, a]``:
``i = log_index[w]``; the agent is present iff ``0 <= i < T`` and ``traj_valid[s, a, i]``; then it
takes ``traj_pos[s, a, i]``, ``traj_heading[s, a, i]`` and speed ``|traj_vel[s, a, i]|``. When it
is not valid there (before it appears, after its log ends) it leaves the scene: ``present =
False``, speed 0, position and heading kept from the input (so they stay finite). Slots that are
not replayed are copied unchanged. The env calls it with
``log_index = init_steps + (step - trial_start)`` (docs/contracts.md, docs/design.md section 6):
:func:`replay_state`, which derives ``replayed`` and the log index from the state's fields.

Backends (``backend=``): the torch reference, the Triton kernel and the C kernels of ``replay.c``
(bit for bit: speed is the reference's ``torch.linalg.vector_norm``, computed as torch's CPU
reduction computes it).
"""

from __future__ import annotations

from pathlib import Path

import torch
import triton
import triton.language as tl

from gpusim.backend import WITH_C, op_backend
from gpusim.kernels.cbuild import STEP_LABEL, CLibrary, CStruct, c_tensor, check_index_range, declare_struct_entry
from gpusim.kernels.clocks import log_index


def replay_reference(
    pos: torch.Tensor,
    heading: torch.Tensor,
    speed: torch.Tensor,
    present: torch.Tensor,
    replayed: torch.Tensor,
    scenario: torch.Tensor,
    log_index: torch.Tensor,
    traj_pos: torch.Tensor,
    traj_heading: torch.Tensor,
    traj_vel: torch.Tensor,
    traj_valid: torch.Tensor,
):
    """Poses of log-replayed agents at each world's log index.

    Args:
        pos: [W, A, 2] float32 current positions (m).
        heading: [W, A] float32 current headings (rad).
        speed: [W, A] float32 current speeds (m/s).
        present: [W, A] bool current presence.
        replayed: [W, A] bool slots that follow the log (experts not removed).
        scenario: [W] int64 scenario index of each world.
        log_index: [W] integer log step of each world (any value; out of ``[0, T)`` = not valid).
        traj_pos: [S, A, T, 2] float32 logged positions (m).
        traj_heading: [S, A, T] float32 logged headings (rad).
        traj_vel: [S, A, T, 2] float32 logged velocities (m/s).
        traj_valid: [S, A, T] bool logged valid flags.

    Returns:
        ``(pos [W, A, 2] f32, heading [W, A] f32, speed [W, A] f32, present [W, A] bool)``, new
        tensors; replayed slots take the logged values (or leave the scene), others are copies.

    Raises:
        ValueError: on inconsistent shapes, wrong dtypes, mixed devices or non-contiguous inputs
            (Triton launcher).
    """
    T = traj_pos.shape[2]
    idx = log_index.to(torch.int64)
    in_range = (idx >= 0) & (idx < T)
    i = idx.clamp(0, T - 1)
    W, A = present.shape
    s = scenario[:, None].expand(W, A)
    a = torch.arange(A, device=pos.device)[None, :].expand(W, A)
    ii = i[:, None].expand(W, A)
    valid = traj_valid[s, a, ii] & in_range[:, None]
    take = replayed & valid
    lp = traj_pos[s, a, ii]
    lh = traj_heading[s, a, ii]
    lv = traj_vel[s, a, ii]
    new_pos = torch.where(take[..., None], lp, pos)
    new_heading = torch.where(take, lh, heading)
    new_speed = torch.where(take, torch.linalg.vector_norm(lv, dim=-1), torch.where(replayed, 0.0, speed))
    new_present = torch.where(replayed, valid, present)
    return new_pos, new_heading, new_speed, new_present


@triton.jit
def _replay_kernel(
    pos_ptr, heading_ptr, speed_ptr, present_ptr, replayed_ptr, scenario_ptr, log_index_ptr,
    traj_pos_ptr, traj_heading_ptr, traj_vel_ptr, traj_valid_ptr,
    out_pos_ptr, out_heading_ptr, out_speed_ptr, out_present_ptr,
    N, A, T,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    m = offs < N
    w = offs // A
    a = offs % A
    s = tl.load(scenario_ptr + w, mask=m, other=0).to(tl.int64)
    li = tl.load(log_index_ptr + w, mask=m, other=-1).to(tl.int64)
    in_range = (li >= 0) & (li < T)
    i = tl.minimum(tl.maximum(li, 0), T - 1)
    t_off = (s * A + a) * T + i
    valid = (tl.load(traj_valid_ptr + t_off, mask=m, other=0) != 0) & in_range
    rep = tl.load(replayed_ptr + offs, mask=m, other=0) != 0
    take = rep & valid

    px = tl.load(pos_ptr + 2 * offs, mask=m, other=0.0)
    py = tl.load(pos_ptr + 2 * offs + 1, mask=m, other=0.0)
    h = tl.load(heading_ptr + offs, mask=m, other=0.0)
    sp = tl.load(speed_ptr + offs, mask=m, other=0.0)
    pr = tl.load(present_ptr + offs, mask=m, other=0) != 0

    lx = tl.load(traj_pos_ptr + 2 * t_off, mask=m & take, other=0.0)
    ly = tl.load(traj_pos_ptr + 2 * t_off + 1, mask=m & take, other=0.0)
    lh = tl.load(traj_heading_ptr + t_off, mask=m & take, other=0.0)
    vx = tl.load(traj_vel_ptr + 2 * t_off, mask=m & take, other=0.0)
    vy = tl.load(traj_vel_ptr + 2 * t_off + 1, mask=m & take, other=0.0)
    lsp = tl.sqrt(vx * vx + vy * vy)

    tl.store(out_pos_ptr + 2 * offs, tl.where(take, lx, px), mask=m)
    tl.store(out_pos_ptr + 2 * offs + 1, tl.where(take, ly, py), mask=m)
    tl.store(out_heading_ptr + offs, tl.where(take, lh, h), mask=m)
    tl.store(out_speed_ptr + offs, tl.where(take, lsp, tl.where(rep, 0.0, sp)), mask=m)
    tl.store(out_present_ptr + offs, tl.where(rep, valid, pr).to(tl.int8), mask=m)


def _replay_triton(pos, heading, speed, present, replayed, scenario, log_index,
                   traj_pos, traj_heading, traj_vel, traj_valid, block: int = 1024):
    W, A = present.shape
    S, A2, T = traj_valid.shape
    checks = [
        (pos, (W, A, 2), torch.float32, "pos"), (heading, (W, A), torch.float32, "heading"),
        (speed, (W, A), torch.float32, "speed"), (present, (W, A), torch.bool, "present"),
        (replayed, (W, A), torch.bool, "replayed"), (scenario, (W,), torch.int64, "scenario"),
        (traj_pos, (S, A, T, 2), torch.float32, "traj_pos"),
        (traj_heading, (S, A, T), torch.float32, "traj_heading"),
        (traj_vel, (S, A, T, 2), torch.float32, "traj_vel"), (traj_valid, (S, A, T), torch.bool, "traj_valid"),
    ]
    for t, shape, dtype, name in checks:
        if tuple(t.shape) != shape:
            raise ValueError(f"replay: {name} has shape {tuple(t.shape)}, expected {shape}")
        if t.dtype != dtype:
            raise ValueError(f"replay: {name} has dtype {t.dtype}, expected {dtype}")
        if t.device != pos.device:
            raise ValueError(f"replay: {name} is on {t.device}, expected {pos.device}")
        if not t.is_contiguous():
            raise ValueError(f"replay: {name} must be contiguous")
    if tuple(log_index.shape) != (W,) or log_index.dtype not in (torch.int32, torch.int64):
        raise ValueError("replay: log_index must be a [W] int32/int64 tensor")
    log_index = log_index.contiguous()
    out_pos = torch.empty_like(pos)
    out_heading = torch.empty_like(heading)
    out_speed = torch.empty_like(speed)
    out_present = torch.empty((W, A), dtype=torch.int8, device=pos.device)
    N = W * A
    if N == 0:
        return out_pos, out_heading, out_speed, out_present.bool()
    grid = (triton.cdiv(N, block),)
    _replay_kernel[grid](
        pos, heading, speed, present.view(torch.int8), replayed.view(torch.int8), scenario, log_index,
        traj_pos, traj_heading, traj_vel, traj_valid.view(torch.int8),
        out_pos, out_heading, out_speed, out_present, N, A, T, BLOCK=block,
    )
    return out_pos, out_heading, out_speed, out_present.bool()


def replay(pos, heading, speed, present, replayed, scenario, log_index,
           traj_pos, traj_heading, traj_vel, traj_valid, *, backend: str | None = None):
    """Poses of log-replayed agents at each world's log index.

    Same signature, semantics and errors as :func:`replay_reference`; ``backend``: ``"torch"`` |
    ``"triton"`` | ``"c"`` (:func:`replay_cpu`) | ``"cupy"`` (the Triton kernel), default
    :func:`gpusim.backend.op_backend`.
    """
    args = (pos, heading, speed, present, replayed, scenario, log_index, traj_pos, traj_heading, traj_vel,
            traj_valid)
    name = op_backend(backend, pos, WITH_C)
    if name == "c":
        return replay_cpu(*args)
    return (_replay_triton if name == "triton" else replay_reference)(*args)


def replay_state(pos, heading, speed, present, controlled, removed, scenario, step, trial_start, init_steps: int,
                 traj_pos, traj_heading, traj_vel, traj_valid, *, backend: str | None = None, check: bool = True):
    """Stage ``replay``'s call: :func:`replay` with ``replayed = ~controlled & ~removed`` and
    ``log_index = init_steps + (step - trial_start)`` (the C kernel derives both in its pass).

    Args:
        controlled, removed: [W, A] bool. step, trial_start: [W] int32 (``step`` the new clock).
        init_steps: log index of step 0. The rest as :func:`replay`.
        backend: as :func:`replay`. check: the C kernel's argument checks (:func:`replay_state_cpu`).

    Returns:
        ``(pos [W, A, 2], heading [W, A], speed [W, A], present [W, A] bool)``, new tensors.

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device.
    """
    name = op_backend(backend, pos, WITH_C)
    if name == "c":
        return replay_state_cpu(pos, heading, speed, present, controlled, removed, scenario, step, trial_start,
                                init_steps, traj_pos, traj_heading, traj_vel, traj_valid, check=check)
    return replay(pos, heading, speed, present, ~controlled & ~removed, scenario,
                  log_index(init_steps, step, trial_start), traj_pos, traj_heading, traj_vel, traj_valid, backend=name)


# ---------------------------------------------------------------------------- C kernels (replay.c)
#: The argument structs of ``gpusim_replay`` and ``gpusim_replay_state`` (replay.c; their C twins are
#: generated from these tables).
REPLAY_ARGS = CStruct("ReplayArgs", """
    const float *pos, const float *heading, const float *speed, const uint8_t *present, const uint8_t *replayed,
    const int64_t *scenario, const int64_t *log_index, const float *traj_pos, const float *traj_heading,
    const float *traj_vel, const uint8_t *traj_valid, float *out_pos, float *out_heading, float *out_speed,
    uint8_t *out_present, int64_t W, int64_t A, int64_t T, int num_threads""")
REPLAY_STATE_ARGS = CStruct("ReplayStateArgs", """
    const float *pos, const float *heading, const float *speed, const uint8_t *present, const uint8_t *controlled,
    const uint8_t *removed, const int64_t *scenario, const int32_t *step, const int32_t *trial_start,
    int64_t init_steps, const float *traj_pos, const float *traj_heading, const float *traj_vel,
    const uint8_t *traj_valid, float *out_pos, float *out_heading, float *out_speed, uint8_t *out_present,
    int64_t W, int64_t A, int64_t T, int num_threads""")


def _declare(lib) -> None:
    """ctypes signatures of replay.c: one struct each (:data:`REPLAY_ARGS`, :data:`REPLAY_STATE_ARGS`)."""
    declare_struct_entry(lib, "gpusim_replay")
    declare_struct_entry(lib, "gpusim_replay_state")


#: replay.c, built at first use (:class:`gpusim.kernels.cbuild.CLibrary`).
LIBRARY = CLibrary(name="replay", source=Path(__file__).with_suffix(".c"), prefix="gpusim_replay", abi=2,
                   declare=_declare, label=STEP_LABEL, structs=(REPLAY_ARGS, REPLAY_STATE_ARGS))


def _traj(S: int, A: int, T: int, traj_pos, traj_heading, traj_vel, traj_valid) -> list:
    f32 = torch.float32
    return [c_tensor(t, "replay", n, d, sh) for t, n, d, sh in (
        (traj_pos, "traj_pos", f32, (S, A, T, 2)), (traj_heading, "traj_heading", f32, (S, A, T)),
        (traj_vel, "traj_vel", f32, (S, A, T, 2)), (traj_valid, "traj_valid", torch.bool, (S, A, T)))]


def bind_replay_state(backend: str | None, check: bool, init_steps: int, traj_pos, traj_heading, traj_vel,
                      traj_valid):
    """:func:`replay_state` with the log (and ``backend``, ``check``, ``init_steps``) bound: returns
    ``fn(pos, heading, speed, present, controlled, removed, scenario, step, trial_start) -> (pos,
    heading, speed, present)``; on the C backend without checks it calls the kernel directly."""
    T = traj_valid.shape[-1]
    lib = LIBRARY.load(stacklevel=4) if backend == "c" and not check and T > 0 else None
    if lib is None:
        return lambda pos, heading, speed, present, controlled, removed, scenario, step, trial_start: replay_state(
            pos, heading, speed, present, controlled, removed, scenario, step, trial_start, init_steps, traj_pos,
            traj_heading, traj_vel, traj_valid, backend=backend, check=check)
    kernel, init, e = lib.gpusim_replay_state, int(init_steps), torch.empty
    args = REPLAY_STATE_ARGS.bind(traj_pos=traj_pos, traj_heading=traj_heading, traj_vel=traj_vel,
                                  traj_valid=traj_valid, init_steps=init, T=T)

    def run(pos, heading, speed, present, controlled, removed, scenario, step, trial_start):
        W, A = present.shape
        out = (e(W, A, 2), e(W, A), e(W, A), e(W, A, dtype=torch.bool))
        kernel(args(
            pos=pos, heading=heading, speed=speed, present=present, controlled=controlled, removed=removed,
            scenario=scenario, step=step, trial_start=trial_start, out_pos=out[0], out_heading=out[1],
            out_speed=out[2], out_present=out[3], W=W, A=A, num_threads=torch.get_num_threads()))
        return out
    run.keep = (traj_pos, traj_heading, traj_vel, traj_valid)  # the bound pointers point into these
    return run


def replay_cpu(pos, heading, speed, present, replayed, scenario, log_index, traj_pos, traj_heading, traj_vel,
               traj_valid, out=None):
    """The C kernel of :func:`replay` (same arguments and result). ``out``: optional ``(pos,
    heading, speed, present)`` tensors of the result's shapes and dtypes (contiguous), every
    element overwritten. Runs :func:`replay_reference` where the library cannot be built.

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device; scenario indices out of range.
    """
    W, A = present.shape
    S, _, T = traj_valid.shape
    args = [c_tensor(t, "replay", n, d, sh) for t, n, d, sh in (
        (pos, "pos", torch.float32, (W, A, 2)), (heading, "heading", torch.float32, (W, A)),
        (speed, "speed", torch.float32, (W, A)), (present, "present", torch.bool, (W, A)),
        (replayed, "replayed", torch.bool, (W, A)), (scenario, "scenario", torch.int64, (W,)),
    )]
    if tuple(log_index.shape) != (W,) or log_index.dtype not in (torch.int32, torch.int64):
        raise ValueError("replay: log_index must be a [W] int32/int64 tensor")
    args.append(log_index.to(torch.int64).contiguous())
    args += _traj(S, A, T, traj_pos, traj_heading, traj_vel, traj_valid)
    lib = LIBRARY.load(stacklevel=4)
    if lib is None or T == 0:
        ref = replay_reference(*args)
        return ref if out is None else tuple(o.copy_(r) for o, r in zip(out, ref))
    if out is None:
        out = (torch.empty(W, A, 2), torch.empty(W, A), torch.empty(W, A), torch.empty(W, A, dtype=torch.bool))
    for o, ref_t in zip(out, args[:4]):
        if o.dtype != ref_t.dtype or o.shape != ref_t.shape or not o.is_contiguous() or o.device.type != "cpu":
            raise ValueError(f"replay: out tensors must be contiguous CPU {ref_t.dtype} {tuple(ref_t.shape)}")
    check_index_range(args[5], S, f"replay: scenario indices must lie in [0, S = {S})")
    pos, heading, speed, present, replayed, scenario, log_index, traj_pos, traj_heading, traj_vel, traj_valid = args
    lib.gpusim_replay(REPLAY_ARGS(
        pos=pos, heading=heading, speed=speed, present=present, replayed=replayed, scenario=scenario,
        log_index=log_index, traj_pos=traj_pos, traj_heading=traj_heading, traj_vel=traj_vel, traj_valid=traj_valid,
        out_pos=out[0], out_heading=out[1], out_speed=out[2], out_present=out[3], W=W, A=A, T=T,
        num_threads=torch.get_num_threads()))
    return tuple(out)


def replay_state_cpu(pos, heading, speed, present, controlled, removed, scenario, step, trial_start,
                     init_steps: int, traj_pos, traj_heading, traj_vel, traj_valid, check: bool = True):
    """The C kernel of :func:`replay_state` (same arguments and result, new tensors), without the
    four torch ops that build ``replayed`` and the log index. ``check=False`` skips the argument
    checks (``StepVars.checked``). Runs the reference where the library cannot be built.

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device; scenario indices out of range.
    """
    W, A = present.shape
    S, _, T = traj_valid.shape
    f32, b = torch.float32, torch.bool
    if not check:  # the caller guarantees the layout: no per-argument calls (fixed cost per step)
        args = [pos, heading, speed, present, controlled, removed, scenario, step, trial_start]
        traj = [traj_pos, traj_heading, traj_vel, traj_valid]
    else:
        args = [c_tensor(t, "replay", n, d, sh) for t, n, d, sh in (
            (pos, "pos", f32, (W, A, 2)), (heading, "heading", f32, (W, A)), (speed, "speed", f32, (W, A)),
            (present, "present", b, (W, A)), (controlled, "controlled", b, (W, A)), (removed, "removed", b, (W, A)),
            (scenario, "scenario", torch.int64, (W,)), (step, "step", torch.int32, (W,)),
            (trial_start, "trial_start", torch.int32, (W,)),
        )]
        traj = _traj(S, A, T, traj_pos, traj_heading, traj_vel, traj_valid)
    lib = LIBRARY.load(stacklevel=4)
    if lib is None or T == 0:
        pos, heading, speed, present, controlled, removed, scenario, step, trial_start = args
        return replay_reference(pos, heading, speed, present, ~controlled & ~removed, scenario,
                                log_index(init_steps, step, trial_start), *traj)
    if check:
        check_index_range(args[6], S, f"replay: scenario indices must lie in [0, S = {S})")
    return bind_replay_state("c", False, init_steps, *traj)(*args)
