"""Agent-agent collisions: oriented-bounding-box (OBB) overlap by the separating-axis test.

Each agent is a rectangle centred at ``pos`` with its long side along ``heading``; half extents
``a = box_scale * length / 2`` (along the heading) and ``b = box_scale * width / 2`` (across).
For two rectangles the separating-axis test needs four axes, the two edge normals of each box.
With ``D = c_j - c_i``, unit axes ``u = (cos h, sin h)``, ``v = (-sin h, cos h)`` and the relative
rotation ``c = |cos(h_j - h_i)|``, ``s = |sin(h_j - h_i)|``, the boxes are separated iff one of

    |D . u_i| > a_i + a_j c + b_j s        |D . v_i| > b_i + a_j s + b_j c
    |D . u_j| > a_j + a_i c + b_i s        |D . v_j| > b_j + a_i s + b_i c

holds. Otherwise they overlap. Choices:

* Touching counts as overlap (the comparisons are strict ``>`` for separation), so two boxes
  sharing an edge or a corner collide.
* A zero-size box is a point: it collides with a box that contains it or has it on its boundary
  (and two coincident points collide).
* A cheap bounding-circle pre-check (``|D| <= r_i + r_j`` with ``r = sqrt(a^2 + b^2)``) is applied
  first; it never changes the answer of the exact test, it only lets the kernel skip work.
* Absent agents (``present = False``) never collide and are never hit; an agent never collides
  with itself.

``box_scale`` shrinks the logged boxes (0.7 in GPUDrive/PufferDrive, whose logged WOMD boxes are
generous; see ``EnvConfig.collision_box_scale``).

:func:`hit_by` (collision REMOVE: who was touched by an agent in collision) is the same box test
between a set of source agents and everyone.

Backends of both ops (``backend=``, :func:`gpusim.backend.op_backend`): the torch references, the
Triton kernels and the C kernels of ``collision.c`` (same float32 operations in the same order,
the same bounding-circle pre-check and margin: identical booleans).
"""

from __future__ import annotations

from pathlib import Path

import torch
import triton
import triton.language as tl

from gpusim.backend import WITH_C, interpreting, op_backend
from gpusim.kernels.cbuild import STEP_LABEL, CLibrary, CStruct, bool_out, c_tensor, declare_struct_entry, heading_trig_of

def collisions_reference(pos, heading, length, width, present, box_scale: float, num_query: int | None = None,
                         query: torch.Tensor | None = None):
    """For every agent, does its box overlap the box of another present agent of the same world?

    Args:
        pos: [W, A, 2] float32 box centres (m).
        heading: [W, A] float32 headings (rad).
        length, width: [W, A] float32 box sizes (m), scaled by ``box_scale``.
        present: [W, A] bool; absent agents take no part.
        box_scale: factor on length and width (> 0).
        num_query: optional ``Q``: only agents ``[0, Q)`` (the controlled slots) are tested
            against everyone; an agent ``j >= Q`` is then flagged only when it overlaps one of the
            first ``Q`` (overlaps among agents ``>= Q``, e.g. log-replayed experts, are not
            computed). ``None`` (default) tests all pairs.
        query: optional [W, A] bool, overrides ``num_query``: only these agents are tested
            against everyone (the env passes its controlled agents); any other agent is flagged
            only when it overlaps a query agent.

    Returns:
        [W, A] bool collision flags (False for absent agents).

    CPU strategy (same answer as testing every pair): only present query agents are processed
    (compaction); the bounding-circle pre-check runs on their [N, A] pairs, and the exact
    separating-axis test only on the pairs that pass it.
    """
    W, A = heading.shape
    _check_query(query, heading)
    Q = A if num_query is None else max(0, min(int(num_query), A))
    out = torch.zeros(W * A, dtype=torch.bool, device=heading.device)
    if query is not None:
        gi = (query & present).reshape(-1).nonzero().squeeze(1)  # [N] flat index of the query agents
    elif Q:
        qi = present[:, :Q].reshape(-1).nonzero().squeeze(1)
        gi = torch.div(qi, Q, rounding_mode="floor") * A + qi % Q
    else:
        return out.view(W, A)
    if gi.numel() == 0:
        return out.view(W, A)
    w = torch.div(gi, A, rounding_mode="floor")
    i = gi - w * A
    a = (0.5 * box_scale) * length.reshape(-1)
    b = (0.5 * box_scale) * width.reshape(-1)
    # bounding circles grown by CIRCLE_MARGIN: a pre-check that never drops a pair the exact test
    # would find overlapping (no square root per pair)
    r = torch.sqrt(a * a + b * b) + 0.5 * CIRCLE_MARGIN  # [W*A]
    p2 = pos.reshape(W * A, 2)
    pw = pos.reshape(W, A * 2).index_select(0, w).view(-1, A, 2)  # [N, A, 2] partners of each query
    dx = pw[..., 0] - p2[gi, 0, None]
    dy = pw[..., 1] - p2[gi, 1, None]
    rs = r.view(W, A).index_select(0, w) + r[gi, None]  # [N, A]
    circle = dx * dx + dy * dy <= rs * rs
    circle &= present.index_select(0, w)
    circle &= torch.arange(A, device=heading.device)[None, :] != i[:, None]
    pn, pj = circle.nonzero(as_tuple=True)  # [M] candidate pairs (query row, partner slot)
    if pn.numel() == 0:
        return out.view(W, A)
    gI = gi[pn]
    gJ = w[pn] * A + pj
    dx, dy = dx[pn, pj], dy[pn, pj]
    hI, hJ = heading.reshape(-1)[gI], heading.reshape(-1)[gJ]
    ci, si, cj, sj = torch.cos(hI), torch.sin(hI), torch.cos(hJ), torch.sin(hJ)
    ai, bi, aj, bj = a[gI], b[gI], a[gJ], b[gJ]
    c = (ci * cj + si * sj).abs()
    s = (ci * sj - si * cj).abs()
    sep = (dx * ci + dy * si).abs() > ai + aj * c + bj * s
    sep |= (dy * ci - dx * si).abs() > bi + aj * s + bj * c
    sep |= (dx * cj + dy * sj).abs() > aj + ai * c + bi * s
    sep |= (dy * cj - dx * sj).abs() > bj + ai * s + bi * c
    hit = ~sep
    # the query agent is hit; so is its partner (for a query partner the pair is also found from its row)
    out.index_fill_(0, torch.cat([gI[hit], gJ[hit]]), True)
    return out.view(W, A)


#: Margin (m) added to the sum of bounding-circle radii in the CPU pre-check (keeps it conservative
#: under float32 rounding; the exact separating-axis test decides).
CIRCLE_MARGIN = 0.01


def _check_query(query, heading):
    if query is not None:
        if not isinstance(query, torch.Tensor) or query.dtype != torch.bool or tuple(query.shape) != tuple(heading.shape):
            raise ValueError(f"collisions: query must be a bool tensor of shape {tuple(heading.shape)}")
        if query.device != heading.device:
            raise ValueError(f"collisions: query is on {query.device}, heading on {heading.device}")


@triton.jit
def _collisions_kernel(
    pos_ptr, heading_ptr, length_ptr, width_ptr, present_ptr, query_ptr, out_ptr,
    A, Q, QF, box_scale,
    BLOCK: tl.constexpr, HAS_QUERY: tl.constexpr,
):
    w = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mi = i < Q
    base = w * A
    gi = base + i.to(tl.int64)
    px = tl.load(pos_ptr + 2 * gi, mask=mi, other=0.0)
    py = tl.load(pos_ptr + 2 * gi + 1, mask=mi, other=0.0)
    hi = tl.load(heading_ptr + gi, mask=mi, other=0.0)
    ai = 0.5 * box_scale * tl.load(length_ptr + gi, mask=mi, other=0.0)
    bi = 0.5 * box_scale * tl.load(width_ptr + gi, mask=mi, other=0.0)
    pi_ = (tl.load(present_ptr + gi, mask=mi, other=0) != 0) & mi
    if HAS_QUERY:
        pi_ = pi_ & (tl.load(query_ptr + gi, mask=mi, other=0) != 0)
    ci = tl.cos(hi)
    si = tl.sin(hi)
    ri2 = ai * ai + bi * bi
    hit_any = tl.zeros([BLOCK], dtype=tl.int32)
    for j in range(0, A):
        gj = base + j
        pj = tl.load(present_ptr + gj) != 0
        qx = tl.load(pos_ptr + 2 * gj)
        qy = tl.load(pos_ptr + 2 * gj + 1)
        hj = tl.load(heading_ptr + gj)
        aj = 0.5 * box_scale * tl.load(length_ptr + gj)
        bj = 0.5 * box_scale * tl.load(width_ptr + gj)
        cj = tl.cos(hj)
        sj = tl.sin(hj)
        dx = qx - px
        dy = qy - py
        c = tl.abs(ci * cj + si * sj)
        s = tl.abs(ci * sj - si * cj)
        rj2 = aj * aj + bj * bj
        circle = dx * dx + dy * dy <= ri2 + rj2 + 2.0 * tl.sqrt(ri2 * rj2)
        sep = tl.abs(dx * ci + dy * si) > ai + aj * c + bj * s
        sep = sep | (tl.abs(dy * ci - dx * si) > bi + aj * s + bj * c)
        sep = sep | (tl.abs(dx * cj + dy * sj) > aj + ai * c + bi * s)
        sep = sep | (tl.abs(dy * cj - dx * sj) > bj + ai * s + bi * c)
        hit = circle & (~sep) & pi_ & pj & (i != j)
        hit_i = hit.to(tl.int32)
        hit_any = tl.maximum(hit_any, hit_i)
        if j >= QF:
            # partner possibly outside the query set: flag it if any query agent of this block hits it
            tl.atomic_max(out_ptr + gj, tl.max(hit_i, axis=0))
    # query rows: programs own disjoint rows, but other programs may atomically flag nothing here
    # (they only flag j >= Q), so a plain max-combine via atomics keeps it race-free anyway.
    tl.atomic_max(out_ptr + gi, hit_any, mask=mi)


def _collisions_triton(pos, heading, length, width, present, box_scale: float, num_query: int | None = None,
                       query: torch.Tensor | None = None):
    if heading.dim() != 2:
        raise ValueError(f"collisions: heading must be [W, A], got {tuple(heading.shape)}")
    W, A = heading.shape
    for name, t, shape, dtype in (
        ("pos", pos, (W, A, 2), torch.float32), ("heading", heading, (W, A), torch.float32),
        ("length", length, (W, A), torch.float32), ("width", width, (W, A), torch.float32),
        ("present", present, (W, A), torch.bool),
    ):
        if tuple(t.shape) != shape or t.dtype != dtype or t.device != heading.device:
            raise ValueError(
                f"collisions: {name} must be {dtype} {shape} on {heading.device}, got {t.dtype} {tuple(t.shape)} on {t.device}"
            )
    _check_query(query, heading)
    Q = A if num_query is None or query is not None else max(0, min(int(num_query), A))
    QF = 0 if query is not None else Q  # partners j >= QF are flagged from the query rows
    out = torch.zeros((W, A), dtype=torch.int32, device=heading.device)
    if W and A and Q:
        BLOCK = max(16, min(128, triton.next_power_of_2(Q)))
        grid = (W, triton.cdiv(Q, BLOCK))
        pres_u8 = present.contiguous().view(torch.uint8)
        _collisions_kernel[grid](
            pos.contiguous(), heading.contiguous(), length.contiguous(), width.contiguous(),
            pres_u8, pres_u8 if query is None else query.contiguous().view(torch.uint8), out, A, Q, QF,
            float(box_scale), BLOCK=BLOCK, HAS_QUERY=query is not None,
        )
    return out != 0



def collisions(pos, heading, length, width, present, box_scale: float, num_query: int | None = None,
               query: torch.Tensor | None = None, *, backend: str | None = None, check: bool = True,
               cos_h=None, sin_h=None, out=None):
    """For every agent, does its box overlap the box of another present agent of the same world?

    Args:
        pos: [W, A, 2] float32 box centres (m).
        heading: [W, A] float32 headings (rad).
        length, width: [W, A] float32 box sizes (m), scaled by ``box_scale``.
        present: [W, A] bool; absent agents take no part.
        box_scale: factor on length and width (> 0).
        num_query: optional ``Q``: only agents ``[0, Q)`` (the controlled slots) are tested
            against everyone; an agent ``j >= Q`` is then flagged only when it overlaps one of the
            first ``Q`` (overlaps among agents ``>= Q``, e.g. log-replayed experts, are not
            computed). ``None`` (default) tests all pairs.
        query: optional [W, A] bool, overrides ``num_query``: only these agents are tested
            against everyone (the env passes its controlled agents); any other agent is flagged
            only when it overlaps a query agent.
        backend: ``"torch"`` | ``"triton"`` | ``"c"`` | ``"cupy"`` (the Triton kernel), default
            :func:`gpusim.backend.op_backend`.
        check, cos_h, sin_h, out: C backend only (:func:`collisions_cpu`); ignored otherwise.

    Returns:
        [W, A] bool collision flags (False for absent agents).

    Raises:
        ValueError: ``query`` of the wrong shape, dtype or device; an unknown backend.
    Raises (Triton and C backends): ValueError on wrong shapes, dtypes or devices.
    """
    name = op_backend(backend, heading, WITH_C)
    if name == "c":
        return collisions_cpu(pos, heading, length, width, present, box_scale, num_query, query, cos_h=cos_h,
                              sin_h=sin_h, out=out, check=check)
    if name == "triton":
        return _collisions_triton(pos, heading, length, width, present, box_scale, num_query, query)
    return collisions_reference(pos, heading, length, width, present, box_scale, num_query, query)


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



def hit_by(pos, heading, length, width, present, source, box_scale: float, *, backend: str | None = None,
           check: bool = True, cos_h=None, sin_h=None, out=None) -> torch.Tensor:
    name = op_backend(backend, heading, WITH_C)
    if name == "c":
        return hit_by_cpu(pos, heading, length, width, present, source, box_scale, cos_h=cos_h, sin_h=sin_h,
                          out=out, check=check)
    if name == "triton":
        return _hit_by_triton(pos, heading, length, width, present, source, box_scale)
    return hit_by_reference(pos, heading, length, width, present, source, box_scale)


hit_by.__doc__ = _HIT_BY_DOC + """
    Backend (``backend=``, :func:`gpusim.backend.op_backend`): the Triton kernel (one program per
    world and block of target agents), the C kernel (:func:`hit_by_cpu`; ``check``, ``cos_h``,
    ``sin_h``, ``out`` are its keywords, ignored by the others) or :func:`hit_by_reference`.
    """


# ---------------------------------------------------------------------------- C kernels (collision.c)
#: The argument structs of ``gpusim_collisions`` and ``gpusim_hit_by`` (collision.c; their C twins are
#: generated from these tables).
COLLISIONS_ARGS = CStruct("CollisionsArgs", """
    const float *pos, const float *cos_h, const float *sin_h, const float *length, const float *width,
    const uint8_t *present, const uint8_t *query, uint8_t *out, int64_t W, int64_t A, float half_scale,
    float half_margin, int num_threads""")
HIT_BY_ARGS = CStruct("HitByArgs", """
    const float *pos, const float *cos_h, const float *sin_h, const float *length, const float *width,
    const uint8_t *present, const uint8_t *source, uint8_t *out, int64_t W, int64_t A, int64_t S, float half_scale,
    int num_threads""")


def _declare(lib) -> None:
    """ctypes signatures of collision.c: one struct each (:data:`COLLISIONS_ARGS`, :data:`HIT_BY_ARGS`)."""
    declare_struct_entry(lib, "gpusim_collisions")
    declare_struct_entry(lib, "gpusim_hit_by")


#: collision.c, built at first use (:class:`gpusim.kernels.cbuild.CLibrary`).
LIBRARY = CLibrary(name="collision", source=Path(__file__).with_suffix(".c"), prefix="gpusim_collision", abi=2,
                   declare=_declare, label=STEP_LABEL, structs=(COLLISIONS_ARGS, HIT_BY_ARGS))


def _box_inputs(cc, fn: str, pos, heading, length, width, present):
    W, A = heading.shape
    return (W, A, cc(pos, fn, "pos", torch.float32, (W, A, 2)),
            cc(heading, fn, "heading", torch.float32, (W, A)),
            cc(length, fn, "length", torch.float32, (W, A)), cc(width, fn, "width", torch.float32, (W, A)),
            cc(present, fn, "present", torch.bool, (W, A)))


def bind_collisions(backend: str | None, check: bool, box_scale: float):
    """:func:`collisions` with ``box_scale`` (and ``backend``, ``check``) bound: returns
    ``fn(pos, heading, length, width, present, query) -> [W, A] bool``; on the C backend without
    checks it calls the kernel directly (cos/sin of the headings: ``cbuild.heading_trig``; the C
    call also takes ``out``, ``cos_h``, ``sin_h`` as :func:`collisions_cpu`)."""
    lib = LIBRARY.load(stacklevel=4) if backend == "c" and not check else None
    if lib is None:
        return lambda pos, heading, length, width, present, query: collisions(
            pos, heading, length, width, present, box_scale, query=query, backend=backend, check=check)
    kernel = lib.gpusim_collisions
    args = COLLISIONS_ARGS.bind(half_scale=0.5 * box_scale, half_margin=0.5 * CIRCLE_MARGIN)

    def run(pos, heading, length, width, present, query, out=None, cos_h=None, sin_h=None):
        W, A = heading.shape
        cos_h, sin_h = heading_trig_of(heading, cos_h, sin_h)
        out = torch.empty(W, A, dtype=torch.bool) if out is None else out
        kernel(args(pos=pos, cos_h=cos_h, sin_h=sin_h, length=length, width=width, present=present, query=query,
                    out=out, W=W, A=A, num_threads=torch.get_num_threads()))
        return out
    return run


def bind_hit_by(backend: str | None, check: bool, box_scale: float):
    """:func:`hit_by` with ``box_scale`` (and ``backend``, ``check``) bound: returns
    ``fn(pos, heading, length, width, present, source) -> [W, A] bool``; on the C backend without
    checks it calls the kernel directly (cos/sin of the headings: ``cbuild.heading_trig``)."""
    lib = LIBRARY.load(stacklevel=4) if backend == "c" and not check else None
    if lib is None:
        return lambda pos, heading, length, width, present, source: hit_by(
            pos, heading, length, width, present, source, box_scale, backend=backend, check=check)
    kernel, args = lib.gpusim_hit_by, HIT_BY_ARGS.bind(half_scale=0.5 * box_scale)

    def run(pos, heading, length, width, present, source, out=None, cos_h=None, sin_h=None):
        W, A = heading.shape
        cos_h, sin_h = heading_trig_of(heading, cos_h, sin_h)
        source = source.contiguous()
        out = torch.empty(W, A, dtype=torch.bool) if out is None else out
        kernel(args(pos=pos, cos_h=cos_h, sin_h=sin_h, length=length, width=width, present=present, source=source,
                    out=out, W=W, A=A, S=source.shape[1], num_threads=torch.get_num_threads()))
        return out
    return run


def collisions_cpu(pos, heading, length, width, present, box_scale: float, num_query: int | None = None,
                   query: torch.Tensor | None = None, cos_h=None, sin_h=None, out=None, check: bool = True):
    """The C kernel of :func:`collisions` (same arguments and result). Extra keywords: ``cos_h``,
    ``sin_h`` [W, A] float32 ``torch.cos/sin(heading)`` when the caller has them; ``out`` [W, A]
    bool contiguous, every element overwritten; ``check=False`` skips the argument checks (the env,
    on a state whose layout an earlier checked step established: ``StepVars.checked``). Runs
    :func:`collisions_reference` where the library cannot be built.

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device.
    """
    if check:
        W, A, pos, heading, length, width, present = _box_inputs(c_tensor, "collisions", pos, heading, length, width,
                                                                 present)
    else:  # the caller guarantees the layout: no per-argument calls (fixed cost per step)
        W, A = heading.shape
    if query is None:
        Q = A if num_query is None else max(0, min(int(num_query), A))
        query = torch.zeros(W, A, dtype=torch.bool)
        query[:, :Q] = True
    elif check:
        query = c_tensor(query, "collisions", "query", torch.bool, (W, A))
    lib = LIBRARY.load(stacklevel=4)
    if lib is None:
        ref = collisions_reference(pos, heading, length, width, present, box_scale, query=query)
        return ref if out is None else out.copy_(ref)
    out = None if out is None else bool_out(out, W, A, "collisions")
    return bind_collisions("c", False, box_scale)(pos, heading, length, width, present, query, out, cos_h, sin_h)


def hit_by_cpu(pos, heading, length, width, present, source, box_scale: float, cos_h=None, sin_h=None, out=None,
               check: bool = True):
    """The C kernel of :func:`hit_by` (same arguments and result; ``source`` [W, S] bool, S <= A).
    ``cos_h``, ``sin_h``, ``out``, ``check`` as in :func:`collisions_cpu`. Runs
    :func:`hit_by_reference` where the library cannot be built.

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device.
    """
    if check:
        W, A, pos, heading, length, width, present = _box_inputs(c_tensor, "hit_by", pos, heading, length, width,
                                                                 present)
        if source.dim() != 2 or source.shape[0] != W or source.shape[1] > A:
            raise ValueError(f"hit_by: source must be [W, S] bool with S <= {A}, got {tuple(source.shape)}")
        source = c_tensor(source, "hit_by", "source", torch.bool, tuple(source.shape))
    W, A = heading.shape
    S = source.shape[1]
    lib = LIBRARY.load(stacklevel=4)
    if lib is None:
        ref = hit_by_reference(pos, heading, length, width, present, source, box_scale)
        return ref if out is None else out.copy_(ref)
    out = None if out is None else bool_out(out, W, A, "hit_by")
    return bind_hit_by("c", False, box_scale)(pos, heading, length, width, present, source, out, cos_h, sin_h)
