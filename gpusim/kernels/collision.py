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
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpusim.backend import backend_for


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

    Raises:
        ValueError: ``query`` of the wrong shape, dtype or device.
    Raises (Triton backend): ValueError on wrong shapes, dtypes or devices.
    """
    if backend_for(heading) == "triton":
        return _collisions_triton(pos, heading, length, width, present, box_scale, num_query, query)
    return collisions_reference(pos, heading, length, width, present, box_scale, num_query, query)
