"""Reset writes: agents take their logged pose at one log index (episode reset, trial restart,
goal RESPAWN).

For world ``w`` running scenario ``s = scenario[w]`` and agent slot ``a`` selected by
``mask[w, a]`` (every agent when ``mask`` is None), with ``i = log_index``:

* ``pos = traj_pos[s, a, i]``, ``heading = traj_heading[s, a, i]``,
  ``speed = |traj_vel[s, a, i]|`` (Euclidean norm of the logged velocity);
* with ``set_present``: ``present = traj_valid[s, a, i] & agent_exists[s, a]``.

Unselected agents keep their input values. The env uses it with ``mask=None`` for the pose part
of ``gpusim.sim.episode.initial_state`` (reset; trial restarts restore from it, ``i = init_steps``) and with the
goal-reached mask and ``set_present=False`` for goal RESPAWN (a respawn never changes presence:
controlled agents are valid at ``init_steps`` by the agent selection rule, and RESPAWN does not
re-check it). The logged pose is copied even where the log is invalid (``traj_pos`` then holds
the file's sentinel coordinates); ``present`` says whether it means anything.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpusim.backend import op_backend
from gpusim.kernels.checks import check_tensors


def reset_agents_reference(
    mask: torch.Tensor | None,
    scenario: torch.Tensor,
    log_index: int,
    traj_pos: torch.Tensor,
    traj_heading: torch.Tensor,
    traj_vel: torch.Tensor,
    traj_valid: torch.Tensor,
    agent_exists: torch.Tensor,
    pos: torch.Tensor | None,
    heading: torch.Tensor | None,
    speed: torch.Tensor | None,
    present: torch.Tensor | None,
    set_present: bool = True,
):
    """Selected agents take their logged pose (and presence) at log step ``log_index``.

    Args:
        mask: [W, A] bool agents to reset, or None for every agent (a fresh state: then ``pos``,
            ``heading``, ``speed``, ``present`` may be None and are ignored).
        scenario: [W] int64 scenario index of each world.
        log_index: log step ``i`` in ``[0, T)`` (Python int, the same for every world).
        traj_pos: [S, A, T, 2] float32 logged positions (m).
        traj_heading: [S, A, T] float32 logged headings (rad).
        traj_vel: [S, A, T, 2] float32 logged velocities (m/s).
        traj_valid: [S, A, T] bool logged valid flags.
        agent_exists: [S, A] bool slot holds an object.
        pos: [W, A, 2] float32 current positions (m); required when ``mask`` is given.
        heading: [W, A] float32 current headings (rad); required when ``mask`` is given.
        speed: [W, A] float32 current speeds (m/s); required when ``mask`` is given.
        present: [W, A] bool current presence; required when ``mask`` is given and
            ``set_present``; otherwise may be None.
        set_present: write ``present = traj_valid & agent_exists`` for the selected agents. When
            False, ``present`` is returned as given (the same object, possibly None).

    Returns:
        ``(pos [W, A, 2] f32, heading [W, A] f32, speed [W, A] f32, present [W, A] bool)``, new
        contiguous tensors (except ``present`` with ``set_present=False``).

    Raises:
        ValueError: ``log_index`` outside ``[0, T)``; a missing current-state tensor when ``mask``
            is given; inconsistent shapes, wrong dtypes, mixed devices or non-contiguous inputs
            (Triton launcher).
    """
    T = traj_pos.shape[2]
    i = _check_common(mask, log_index, T, pos, heading, speed, present, set_present)
    s = scenario
    lpos = traj_pos[s, :, i]
    lhead = traj_heading[s, :, i]
    lspeed = torch.linalg.vector_norm(traj_vel[s, :, i], dim=-1)
    lpres = traj_valid[s, :, i] & agent_exists[s] if set_present else None
    if mask is None:
        out_present = lpres.contiguous() if set_present else present
        return lpos.contiguous(), lhead.contiguous(), lspeed.contiguous(), out_present
    out_present = torch.where(mask, lpres, present) if set_present else present
    return (torch.where(mask[..., None], lpos, pos), torch.where(mask, lhead, heading),
            torch.where(mask, lspeed, speed), out_present)


def _check_common(mask, log_index, T, pos, heading, speed, present, set_present) -> int:
    """Backend-independent argument checks; returns ``log_index`` as int."""
    i = int(log_index)
    if not 0 <= i < T:
        raise ValueError(f"reset_agents: log_index {i} outside [0, {T})")
    if mask is not None:
        missing = [n for n, t in (("pos", pos), ("heading", heading), ("speed", speed)) if t is None]
        if set_present and present is None:
            missing.append("present")
        if missing:
            raise ValueError(
                f"reset_agents: with a mask, {', '.join(missing)} must be given (unmasked agents keep them)")
    return i


@triton.jit
def _reset_agents_kernel(
    mask_ptr, scenario_ptr, traj_pos_ptr, traj_heading_ptr, traj_vel_ptr, traj_valid_ptr, exists_ptr,
    pos_ptr, heading_ptr, speed_ptr, present_ptr,
    out_pos_ptr, out_heading_ptr, out_speed_ptr, out_present_ptr,
    N, A, T, log_index,
    HAS_MASK: tl.constexpr, SET_PRESENT: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    m = offs < N
    w = offs // A
    a = offs % A
    s = tl.load(scenario_ptr + w, mask=m, other=0).to(tl.int64)
    t_off = (s * A + a) * T + log_index
    if HAS_MASK:
        take = (tl.load(mask_ptr + offs, mask=m, other=0) != 0) & m
    else:
        take = m
    lx = tl.load(traj_pos_ptr + 2 * t_off, mask=take, other=0.0)
    ly = tl.load(traj_pos_ptr + 2 * t_off + 1, mask=take, other=0.0)
    lh = tl.load(traj_heading_ptr + t_off, mask=take, other=0.0)
    vx = tl.load(traj_vel_ptr + 2 * t_off, mask=take, other=0.0)
    vy = tl.load(traj_vel_ptr + 2 * t_off + 1, mask=take, other=0.0)
    lsp = tl.sqrt(vx * vx + vy * vy)
    if SET_PRESENT:
        lv = tl.load(traj_valid_ptr + t_off, mask=take, other=0) != 0
        le = tl.load(exists_ptr + s * A + a, mask=take, other=0) != 0
        lpres = lv & le
    if HAS_MASK:
        keep = m & ~take
        px = tl.load(pos_ptr + 2 * offs, mask=keep, other=0.0)
        py = tl.load(pos_ptr + 2 * offs + 1, mask=keep, other=0.0)
        h = tl.load(heading_ptr + offs, mask=keep, other=0.0)
        sp = tl.load(speed_ptr + offs, mask=keep, other=0.0)
        lx = tl.where(take, lx, px)
        ly = tl.where(take, ly, py)
        lh = tl.where(take, lh, h)
        lsp = tl.where(take, lsp, sp)
        if SET_PRESENT:
            pr = tl.load(present_ptr + offs, mask=keep, other=0) != 0
            lpres = tl.where(take, lpres, pr)
    tl.store(out_pos_ptr + 2 * offs, lx, mask=m)
    tl.store(out_pos_ptr + 2 * offs + 1, ly, mask=m)
    tl.store(out_heading_ptr + offs, lh, mask=m)
    tl.store(out_speed_ptr + offs, lsp, mask=m)
    if SET_PRESENT:
        tl.store(out_present_ptr + offs, lpres.to(tl.int8), mask=m)


def _empty(shape, dtype, device) -> torch.Tensor:
    """Output allocation of the launcher (a seam for tests, which pre-fill outputs with garbage so
    that an element the kernel does not write fails the comparison)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _reset_agents_triton(mask, scenario, log_index, traj_pos, traj_heading, traj_vel, traj_valid, agent_exists,
                         pos, heading, speed, present, set_present=True, block: int = 1024):
    S, A, T = traj_valid.shape
    i = _check_common(mask, log_index, T, pos, heading, speed, present, set_present)
    W = scenario.shape[0] if scenario.dim() == 1 else -1
    dev = traj_pos.device
    checks = [
        (scenario, (W,), torch.int64, "scenario"),
        (traj_pos, (S, A, T, 2), torch.float32, "traj_pos"),
        (traj_heading, (S, A, T), torch.float32, "traj_heading"),
        (traj_vel, (S, A, T, 2), torch.float32, "traj_vel"), (traj_valid, (S, A, T), torch.bool, "traj_valid"),
        (agent_exists, (S, A), torch.bool, "agent_exists"),
    ]
    if mask is not None:
        checks += [(mask, (W, A), torch.bool, "mask"), (pos, (W, A, 2), torch.float32, "pos"),
                   (heading, (W, A), torch.float32, "heading"), (speed, (W, A), torch.float32, "speed")]
        if set_present:
            checks.append((present, (W, A), torch.bool, "present"))
    check_tensors("reset_agents", checks, dev)
    out_pos = _empty((W, A, 2), torch.float32, dev)
    out_heading = _empty((W, A), torch.float32, dev)
    out_speed = _empty((W, A), torch.float32, dev)
    out_present = _empty((W, A), torch.int8, dev) if set_present else None
    N = W * A
    if N > 0:
        has_mask = mask is not None
        # unused pointer arguments get an output tensor as placeholder (never dereferenced)
        mask_arg = mask.view(torch.int8) if has_mask else out_heading
        pos_arg, head_arg, speed_arg = (pos, heading, speed) if has_mask else (out_pos, out_heading, out_speed)
        pres_arg = present.view(torch.int8) if (has_mask and set_present) else out_heading
        o_pres_arg = out_present if set_present else out_heading
        _reset_agents_kernel[(triton.cdiv(N, block),)](
            mask_arg, scenario, traj_pos, traj_heading, traj_vel, traj_valid.view(torch.int8),
            agent_exists.view(torch.int8), pos_arg, head_arg, speed_arg, pres_arg,
            out_pos, out_heading, out_speed, o_pres_arg,
            N, A, T, i, HAS_MASK=has_mask, SET_PRESENT=bool(set_present), BLOCK=block,
        )
    return out_pos, out_heading, out_speed, (out_present.bool() if set_present else present)


def reset_agents(mask, scenario, log_index, traj_pos, traj_heading, traj_vel, traj_valid, agent_exists,
                 pos, heading, speed, present, set_present=True, *, backend: str | None = None):
    """Selected agents take their logged pose (and presence) at log step ``log_index``.

    Same signature, semantics and errors as :func:`reset_agents_reference`; runs the Triton
    kernel when ``backend`` (:func:`gpusim.backend.op_backend`, default from ``traj_pos``) is
    ``"triton"`` or ``"cupy"`` (CUDA tensors, or ``TRITON_INTERPRET=1`` with the backend forced),
    else the torch reference. The Triton speed
    is ``sqrt(vx*vx + vy*vy)`` (may differ from torch's norm in the last bit).
    """
    if op_backend(backend, traj_pos) == "triton":
        return _reset_agents_triton(mask, scenario, log_index, traj_pos, traj_heading, traj_vel, traj_valid,
                                    agent_exists, pos, heading, speed, present, set_present)
    return reset_agents_reference(mask, scenario, log_index, traj_pos, traj_heading, traj_vel, traj_valid,
                                  agent_exists, pos, heading, speed, present, set_present)
