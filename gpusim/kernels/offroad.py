"""Offroad test: does an agent's box outline cross a road edge?

The box of an agent (centre ``pos``, long side along ``heading``, ``box_scale * length`` by
``box_scale * width``) has four outline edges between its corners. The agent is *offroad* when one
of these edges properly intersects one of the road-edge segments that the scenario's grid lists
for the agent's cell (``grid_edge[s, cell]``, the ``KE`` road-edge segments nearest to the cell
centre; cell from :func:`gpusim.kernels.grid.cell_index`, the one cell lookup).

Proper intersection of segments ``p1p2`` and ``q1q2`` (orientation test):
``cross(p2 - p1, q1 - p1) * cross(p2 - p1, q2 - p1) < 0`` and
``cross(q2 - q1, p1 - q1) * cross(q2 - q1, p2 - q1) < 0``. Choices:

* Strict: segments that only touch (an endpoint on the other segment) or are collinear do not
  count; a road edge parallel to a box side never counts.
* A box lying entirely on one side of every listed edge, or a road-edge segment lying entirely
  inside the box, is not offroad (only outline crossings count, as in PufferDrive/GPUDrive).
* Grid padding (``-1``) is ignored; absent agents are never offroad.
* Segments are only found if the grid lists them for the agent's cell: the grid builder must keep
  enough road edges per cell (``DataConfig.grid_edge_k``) to cover a box reaching out of its cell.

Backends (``backend=`` of :func:`offroad`): the torch reference, the Triton kernel and the C
kernel of ``offroad.c`` (same float32 operations, same pre-check margin: identical booleans).
"""

from __future__ import annotations

import weakref
from pathlib import Path

import torch
import triton
import triton.language as tl

from gpusim.backend import WITH_C, op_backend
from gpusim.kernels.cbuild import (STEP_LABEL, CLibrary, CStruct, bool_out, c_tensor, check_index_range,
                                   declare_struct_entry, heading_trig_of)
from gpusim.kernels.grid import cell_index, cell_index_jit, grid_table_rows


def _corners(pos, heading, length, width, box_scale):
    """[..., 4, 2] box corners in outline order (front-left, rear-left, rear-right, front-right)."""
    a = 0.5 * box_scale * length
    b = 0.5 * box_scale * width
    c, s = torch.cos(heading), torch.sin(heading)
    ux, uy = a * c, a * s  # half length along heading
    vx, vy = -b * s, b * c  # half width across
    x, y = pos[..., 0], pos[..., 1]
    cx = torch.stack((x + ux + vx, x - ux + vx, x - ux - vx, x + ux - vx), dim=-1)
    cy = torch.stack((y + uy + vy, y - uy + vy, y - uy - vy, y + uy - vy), dim=-1)
    return cx, cy


def offroad_reference(
    pos, heading, length, width, present, scenario, road_seg, grid_edge, grid_origin, grid_dims,
    cell_size: float, box_scale: float, grid_start=None,
):
    """Is each agent's box outline crossing a road-edge segment listed for its grid cell?

    Args:
        pos: [W, A, 2] float32 box centres (m). heading: [W, A] float32 (rad).
        length, width: [W, A] float32 box sizes (m), scaled by ``box_scale``.
        present: [W, A] bool; absent agents are never offroad.
        scenario: [W] int64 scenario index of each world.
        road_seg: [S, R, 4] float32 segments (x0, y0, x1, y1) (m).
        grid_edge: [S, NC, KE] int32 road-edge segment indices per cell, -1 padding, or the
            compact [NCT, KE] int16/int32 table with ``grid_start`` (``gpusim.data.layout``).
        grid_origin: [S, 2] float32; grid_dims: [S, 2] int32 (see ``gpusim.kernels.grid``).
        cell_size: grid cell edge (m). box_scale: factor on length and width.
        grid_start: [S] int64 first row of each scenario in a compact ``grid_edge`` (None: padded).

    Returns:
        [W, A] bool offroad flags.

    CPU strategy (same answer as the exact test on every pair): only present agents are
    processed (compaction); their candidate segments are filtered by an axis-aligned bounding-box
    overlap test grown by :data:`PRECHECK_MARGIN` (a proper crossing point lies in both boxes), and
    the exact orientation test runs only on the surviving (agent, segment) pairs.
    """
    W, A = heading.shape
    S, R, _ = road_seg.shape
    edge2, start = grid_table_rows(grid_edge, grid_start, "offroad: grid_edge")
    KE = edge2.shape[1]
    out = torch.zeros(W * A, dtype=torch.bool, device=heading.device)
    agents = present.reshape(-1).nonzero().squeeze(1)  # [N] flat w * A + a
    if agents.numel() == 0 or KE == 0:
        return out.view(W, A)
    w = torch.div(agents, A, rounding_mode="floor")
    s = scenario.index_select(0, w)
    p = pos.reshape(W * A, 2).index_select(0, agents)  # [N, 2]
    cell = cell_index(p[:, None, :], s, grid_origin, grid_dims, cell_size)[:, 0]  # [N]
    idx = edge2.index_select(0, start.index_select(0, s) + cell).to(torch.int32)  # [N, KE] int32
    cx, cy = _corners(p, heading.reshape(-1).index_select(0, agents), length.reshape(-1).index_select(0, agents),
                      width.reshape(-1).index_select(0, agents), box_scale)  # [N, 4]
    seg = road_seg.view(S * R, 4).index_select(0, (idx.clamp_min(0) + (s * R)[:, None]).view(-1)).view(-1, KE, 4)
    m = PRECHECK_MARGIN
    bx0, bx1 = cx.amin(-1, keepdim=True) - m, cx.amax(-1, keepdim=True) + m  # [N, 1]
    by0, by1 = cy.amin(-1, keepdim=True) - m, cy.amax(-1, keepdim=True) + m
    qx1, qy1, qx2, qy2 = seg.unbind(-1)  # [N, KE]
    near = (idx >= 0) & (torch.maximum(qx1, qx2) >= bx0) & (torch.minimum(qx1, qx2) <= bx1)
    near &= (torch.maximum(qy1, qy2) >= by0) & (torch.minimum(qy1, qy2) <= by1)
    pair_a, pair_k = near.nonzero(as_tuple=True)  # [M] surviving (agent, segment) pairs
    if pair_a.numel() == 0:
        return out.view(W, A)
    q = seg[pair_a, pair_k]  # [M, 4]
    qx1, qy1, qx2, qy2 = (q[:, k, None] for k in range(4))  # [M, 1]
    px1, py1 = cx[pair_a], cy[pair_a]  # [M, 4] box edges start
    px2, py2 = torch.roll(px1, -1, dims=-1), torch.roll(py1, -1, dims=-1)
    ex, ey = px2 - px1, py2 - py1
    fx, fy = qx2 - qx1, qy2 - qy1
    o1 = ex * (qy1 - py1) - ey * (qx1 - px1)
    o2 = ex * (qy2 - py1) - ey * (qx2 - px1)
    o3 = fx * (py1 - qy1) - fy * (px1 - qx1)
    o4 = fx * (py2 - qy1) - fy * (px2 - qx1)
    cross = ((o1 * o2 < 0) & (o3 * o4 < 0)).any(dim=-1)  # [M]
    out.index_fill_(0, agents.index_select(0, pair_a[cross]), True)
    return out.view(W, A)


#: Margin (m) of the bounding-box pre-check of the CPU reference: far above float32 rounding of
#: the corner and orientation arithmetic at scenario scale, so the pre-check never drops a pair
#: that the exact test would flag.
PRECHECK_MARGIN = 0.01


@triton.jit
def _crosses(ax, ay, bx, by, qx1, qy1, qx2, qy2, fx, fy):
    """Proper intersection of box edge a->b with road segment q1->q2 (f = q2 - q1)."""
    ex = bx - ax
    ey = by - ay
    o1 = ex * (qy1 - ay) - ey * (qx1 - ax)
    o2 = ex * (qy2 - ay) - ey * (qx2 - ax)
    o3 = fx * (ay - qy1) - fy * (ax - qx1)
    o4 = fx * (by - qy1) - fy * (bx - qx1)
    return (o1 * o2 < 0) & (o3 * o4 < 0)


@triton.jit
def _offroad_kernel(
    pos_ptr, heading_ptr, length_ptr, width_ptr, present_ptr, scenario_ptr,
    seg_ptr, grid_ptr, start_ptr, origin_ptr, dims_ptr, out_ptr,
    A, R, KE, n, cell_size, box_scale,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    m = offs < n
    w = offs // A
    x = tl.load(pos_ptr + 2 * offs, mask=m, other=0.0)
    y = tl.load(pos_ptr + 2 * offs + 1, mask=m, other=0.0)
    h = tl.load(heading_ptr + offs, mask=m, other=0.0)
    a = 0.5 * box_scale * tl.load(length_ptr + offs, mask=m, other=0.0)
    b = 0.5 * box_scale * tl.load(width_ptr + offs, mask=m, other=0.0)
    pres = (tl.load(present_ptr + offs, mask=m, other=0) != 0) & m
    s = tl.load(scenario_ptr + w, mask=m, other=0)
    cell = cell_index_jit(x, y, s, origin_ptr, dims_ptr, cell_size, m)
    c = tl.cos(h)
    sn = tl.sin(h)
    ux = a * c
    uy = a * sn
    vx = -b * sn
    vy = b * c
    # corners in outline order: front-left, rear-left, rear-right, front-right
    x0 = x + ux + vx
    y0 = y + uy + vy
    x1 = x - ux + vx
    y1 = y - uy + vy
    x2 = x - ux - vx
    y2 = y - uy - vy
    x3 = x + ux - vx
    y3 = y + uy - vy
    hit = tl.zeros([BLOCK], dtype=tl.int1)
    gbase = (tl.load(start_ptr + s, mask=m, other=0).to(tl.int64) + cell) * KE  # grid_start[s] + cell
    for k in range(0, KE):
        sid = tl.load(grid_ptr + gbase + k, mask=pres, other=-1).to(tl.int64)
        ok = pres & (sid >= 0)
        sb = (s * R + tl.maximum(sid, 0)) * 4
        qx1 = tl.load(seg_ptr + sb, mask=ok, other=0.0)
        qy1 = tl.load(seg_ptr + sb + 1, mask=ok, other=0.0)
        qx2 = tl.load(seg_ptr + sb + 2, mask=ok, other=0.0)
        qy2 = tl.load(seg_ptr + sb + 3, mask=ok, other=0.0)
        fx = qx2 - qx1
        fy = qy2 - qy1
        hit = hit | (ok & _crosses(x0, y0, x1, y1, qx1, qy1, qx2, qy2, fx, fy))
        hit = hit | (ok & _crosses(x1, y1, x2, y2, qx1, qy1, qx2, qy2, fx, fy))
        hit = hit | (ok & _crosses(x2, y2, x3, y3, qx1, qy1, qx2, qy2, fx, fy))
        hit = hit | (ok & _crosses(x3, y3, x0, y0, qx1, qy1, qx2, qy2, fx, fy))
    tl.store(out_ptr + offs, hit.to(tl.int8), mask=m)


def _offroad_triton(
    pos, heading, length, width, present, scenario, road_seg, grid_edge, grid_origin, grid_dims,
    cell_size: float, box_scale: float, grid_start=None,
):
    if heading.dim() != 2:
        raise ValueError(f"offroad: heading must be [W, A], got {tuple(heading.shape)}")
    W, A = heading.shape
    if road_seg.dim() != 3 or road_seg.shape[-1] != 4 or grid_edge.dim() not in (2, 3):
        raise ValueError(
            f"offroad: road_seg must be [S, R, 4] and grid_edge [S, NC, KE] or [NCT, KE], got {tuple(road_seg.shape)}, {tuple(grid_edge.shape)}"
        )
    S, R, _ = road_seg.shape
    edge2, start = grid_table_rows(grid_edge, grid_start, "offroad: grid_edge")
    KE = edge2.shape[1]
    if start.shape[0] != S or (grid_edge.dim() == 3 and grid_edge.dtype != torch.int32):
        raise ValueError(f"offroad: grid_edge must hold {S} scenarios (int32 when padded)")
    dev = heading.device
    for name, t, shape, dtype in (
        ("pos", pos, (W, A, 2), torch.float32), ("heading", heading, (W, A), torch.float32),
        ("length", length, (W, A), torch.float32), ("width", width, (W, A), torch.float32),
        ("present", present, (W, A), torch.bool), ("scenario", scenario, (W,), torch.int64),
        ("road_seg", road_seg, (S, R, 4), torch.float32), ("grid_edge", edge2, tuple(edge2.shape), edge2.dtype),
        ("grid_origin", grid_origin, (S, 2), torch.float32), ("grid_dims", grid_dims, (S, 2), torch.int32),
    ):
        if tuple(t.shape) != shape or t.dtype != dtype or t.device != dev:
            raise ValueError(
                f"offroad: {name} must be {dtype} {shape} on {dev}, got {t.dtype} {tuple(t.shape)} on {t.device}"
            )
    out = torch.empty((W, A), dtype=torch.int8, device=dev)
    n = W * A
    if n:
        BLOCK = 256
        _offroad_kernel[(triton.cdiv(n, BLOCK),)](
            pos.contiguous(), heading.contiguous(), length.contiguous(), width.contiguous(),
            present.contiguous().view(torch.uint8), scenario.contiguous(), road_seg.contiguous(),
            edge2.contiguous(), start, grid_origin.contiguous(), grid_dims.contiguous(), out,
            A, R, KE, n, float(cell_size), float(box_scale), BLOCK=BLOCK,
        )
    return out != 0


def offroad(
    pos, heading, length, width, present, scenario, road_seg, grid_edge, grid_origin, grid_dims,
    cell_size: float, box_scale: float, grid_start=None, num_slots: int | None = None, *,
    backend: str | None = None, check: bool = True, cos_h=None, sin_h=None, out=None,
):
    """Is each agent's box outline crossing a road-edge segment listed for its grid cell?

    Args:
        pos: [W, A, 2] float32 box centres (m). heading: [W, A] float32 (rad).
        length, width: [W, A] float32 box sizes (m), scaled by ``box_scale``.
        present: [W, A] bool; absent agents are never offroad.
        scenario: [W] int64 scenario index of each world.
        road_seg: [S, R, 4] float32 segments (x0, y0, x1, y1) (m).
        grid_edge: [S, NC, KE] int32 road-edge segment indices per cell, -1 padding, or the
            compact [NCT, KE] int16/int32 table with ``grid_start`` (``gpusim.data.layout``).
        grid_origin: [S, 2] float32; grid_dims: [S, 2] int32 (see ``gpusim.kernels.grid``).
        cell_size: grid cell edge (m). box_scale: factor on length and width.
        grid_start: [S] int64 first row of each scenario in a compact ``grid_edge`` (None: padded).
        num_slots: test only the first ``num_slots`` agents of each world (the env's policy slots;
            the others are False); None: all A.
        backend: ``"torch"`` | ``"triton"`` | ``"c"`` | ``"cupy"`` (the Triton kernel), default
            :func:`gpusim.backend.op_backend`.
        check, cos_h, sin_h, out: C backend only (:func:`offroad_cpu`); ignored otherwise.

    Returns:
        [W, A] bool offroad flags.

    Raises (Triton and C backends): ValueError on wrong shapes, dtypes or devices.
    """
    name = op_backend(backend, heading, WITH_C)
    if name == "c":
        return offroad_cpu(pos, heading, length, width, present, scenario, road_seg, grid_edge, grid_origin,
                           grid_dims, cell_size, box_scale, grid_start, num_slots, cos_h=cos_h, sin_h=sin_h,
                           out=out, check=check)
    fn = _offroad_triton if name == "triton" else offroad_reference
    if num_slots is None:
        return fn(pos, heading, length, width, present, scenario, road_seg, grid_edge, grid_origin, grid_dims,
                  cell_size, box_scale, grid_start)
    C = int(num_slots)
    first = [t[:, :C].contiguous() for t in (pos, heading, length, width, present)]
    flags = torch.zeros(present.shape, dtype=torch.bool, device=present.device)
    flags[:, :C] = fn(*first, scenario, road_seg, grid_edge, grid_origin, grid_dims, cell_size, box_scale,
                      grid_start)
    return flags


# ---------------------------------------------------------------------------- C kernel (offroad.c)
#: The argument struct of ``gpusim_offroad`` (offroad.c; its C twin is generated from this table).
OFFROAD_ARGS = CStruct("OffroadArgs", """
    const float *pos, const float *cos_h, const float *sin_h, const float *length, const float *width,
    const uint8_t *present, const int64_t *scenario, const float *road_seg, const void *grid, int grid_is16,
    const int64_t *grid_start, const float *grid_origin, const int32_t *grid_dims, uint8_t *out, int64_t W,
    int64_t A, int64_t C, int64_t R, int64_t KE, float cell_size, float half_scale, float margin, int num_threads""")


def _declare(lib) -> None:
    """ctypes signature of offroad.c: one :data:`OFFROAD_ARGS` struct."""
    declare_struct_entry(lib, "gpusim_offroad")


#: offroad.c, built at first use (:class:`gpusim.kernels.cbuild.CLibrary`).
LIBRARY = CLibrary(name="offroad", source=Path(__file__).with_suffix(".c"), prefix="gpusim_offroad", abi=2,
                   declare=_declare, label=STEP_LABEL, structs=(OFFROAD_ARGS,))


#: ``(weak reference to the grid table, its version, grid_start, (rows, start))`` of the last call
_GRID_ROWS: list = [None, -1, None, None]


def _grid_rows(grid_edge, grid_start) -> tuple:
    """:func:`gpusim.kernels.grid.grid_table_rows` of the pack's table, contiguous; kept for the
    same table object (unchanged, same ``grid_start``) so a step pays no tensor op for it."""
    ref, version, start_in, rows = _GRID_ROWS
    if ref is not None and ref() is grid_edge and version == grid_edge._version and start_in is grid_start:
        return rows
    edge2, start = grid_table_rows(grid_edge, grid_start, "offroad: grid_edge")
    rows = (edge2.contiguous(), start.contiguous())
    _GRID_ROWS[:] = [weakref.ref(grid_edge), grid_edge._version, grid_start, rows]
    return rows


def bind_offroad(backend: str | None, check: bool, road_seg, grid_edge, grid_origin, grid_dims, cell_size: float,
                 box_scale: float, grid_start=None, num_slots: int | None = None):
    """:func:`offroad` with the pack's road tables, ``box_scale`` and ``num_slots`` (and ``backend``,
    ``check``) bound: returns ``fn(pos, heading, length, width, present, scenario) -> [W, A] bool``;
    on the C backend without checks it calls the kernel directly (cos/sin of the headings:
    ``cbuild.heading_trig``).

    Raises:
        ValueError: a grid table of the wrong layout (C backend, at binding).
    """
    lib = LIBRARY.load(stacklevel=4) if backend == "c" and not check else None
    if lib is None:
        return lambda pos, heading, length, width, present, scenario: offroad(
            pos, heading, length, width, present, scenario, road_seg, grid_edge, grid_origin, grid_dims, cell_size,
            box_scale, grid_start, num_slots, backend=backend, check=check)
    edge2, start = _grid_rows(grid_edge, grid_start)
    pack_args = dict(road_seg=road_seg.data_ptr(), grid=edge2.data_ptr(), grid_is16=int(edge2.dtype == torch.int16),
                     grid_start=start.data_ptr(), grid_origin=grid_origin.data_ptr(), grid_dims=grid_dims.data_ptr(),
                     R=road_seg.shape[1], KE=edge2.shape[1], cell_size=float(cell_size), half_scale=0.5 * box_scale,
                     margin=PRECHECK_MARGIN)
    kernel, keep = lib.gpusim_offroad, (road_seg, edge2, start, grid_origin, grid_dims)
    args = OFFROAD_ARGS.bind(**pack_args)

    def run(pos, heading, length, width, present, scenario, out=None, cos_h=None, sin_h=None):
        W, A = heading.shape
        cos_h, sin_h = heading_trig_of(heading, cos_h, sin_h)
        out = torch.empty(W, A, dtype=torch.bool) if out is None else out
        kernel(args(pos=pos, cos_h=cos_h, sin_h=sin_h, length=length, width=width, present=present,
                    scenario=scenario, out=out, W=W, A=A, C=A if num_slots is None else num_slots,
                    num_threads=torch.get_num_threads()))
        return out
    run.keep = keep  # the tensors the bound pointers point into live as long as the call
    return run


def offroad_cpu(pos, heading, length, width, present, scenario, road_seg, grid_edge, grid_origin, grid_dims,
                cell_size: float, box_scale: float, grid_start=None, num_slots: int | None = None,
                cos_h=None, sin_h=None, out=None, check: bool = True):
    """The C kernel of :func:`offroad` (same arguments and result). ``cos_h``, ``sin_h`` [W, A]
    float32 ``torch.cos/sin(heading)`` when the caller has them; ``out`` [W, A] bool contiguous,
    every element overwritten; ``check=False`` skips the argument checks (``StepVars.checked``).
    Runs :func:`offroad_reference` where the library cannot be built.

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device; a grid table of the wrong layout;
            ``num_slots`` outside [0, A]; scenario indices out of range.
    """
    W, A = heading.shape
    C = A if num_slots is None else int(num_slots)
    if not 0 <= C <= A:
        raise ValueError(f"offroad: num_slots must lie in [0, {A}], got {num_slots}")
    S, R = road_seg.shape[:2]
    if check:
        pos, heading, length, width = (c_tensor(t, "offroad", n, torch.float32, sh) for t, n, sh in (
            (pos, "pos", (W, A, 2)), (heading, "heading", (W, A)), (length, "length", (W, A)),
            (width, "width", (W, A))))
        present = c_tensor(present, "offroad", "present", torch.bool, (W, A))
        road_seg = c_tensor(road_seg, "offroad", "road_seg", torch.float32, (S, R, 4))
        scenario = c_tensor(scenario, "offroad", "scenario", torch.int64, (W,))
        grid_origin = c_tensor(grid_origin, "offroad", "grid_origin", torch.float32, (S, 2))
        grid_dims = c_tensor(grid_dims, "offroad", "grid_dims", torch.int32, (S, 2))
    _grid_rows(grid_edge, grid_start)  # raises on a grid table of the wrong layout
    lib = LIBRARY.load(stacklevel=4)
    if lib is None:
        sl = (slice(None), slice(0, C))
        ref = torch.zeros(W, A, dtype=torch.bool)
        ref[sl] = offroad_reference(pos[sl], heading[sl], length[sl], width[sl], present[sl], scenario, road_seg,
                                    grid_edge, grid_origin, grid_dims, cell_size, box_scale, grid_start)
        return ref if out is None else out.copy_(ref)
    out = None if out is None else bool_out(out, W, A, "offroad")
    if check:
        check_index_range(scenario, S, f"offroad: scenario indices must lie in [0, S = {S})")
    return bind_offroad("c", False, road_seg, grid_edge, grid_origin, grid_dims, cell_size, box_scale, grid_start,
                        C)(pos, heading, length, width, present, scenario, out, cos_h, sin_h)
