"""NEW_GOAL sampling: a new goal on a lane ahead for the agents that just reached theirs.

For each selected agent (``mask[w, a]``) of world ``w`` running scenario ``s = scenario[w]``, at
position ``p`` with heading ``h`` (forward unit vector ``f = (cos h, sin h)``):

1. the agent's grid cell (``gpusim.kernels.grid.cell_index``) gives K candidate segments
   ``grid_road[s, cell, 0..K-1]`` (nearest to the cell centre first, ``-1`` padding);
2. candidate ``k`` *qualifies* when it is a real segment of type ``lane_type`` (LANE) whose
   midpoint ``m = (p0 + p1) / 2`` satisfies ``(m - p) . f >= min_ahead`` (ahead along the
   heading) and ``|m - p|^2 <= max_dist^2`` (within reach);
3. with ``n`` qualifying candidates and ``u = rand[w, a]`` in [0, 1), the new goal is the midpoint
   of the ``j``-th qualifying candidate *in candidate order* (0-based), with
   ``j = min(floor(u * n), n - 1)`` (computed in float32) -- a uniform draw among the qualifying
   candidates when ``u`` is uniform;
4. when none qualifies (``n = 0``): the fallback point ``p + fallback * f`` straight ahead.

Unselected agents keep their goal. The computation is dense over the W x A agents: no compaction,
no host synchronisation, so it runs inside a CUDA step without a device-to-host read. On CPU
tensors the public :func:`new_goal` computes only the selected rows (a compaction that costs no
synchronisation there) with the same per-row arithmetic, so it equals the dense reference bit for
bit. The rule "a lane segment ahead, within reach, from the cell's candidate list" follows
GPUDrive/PufferDrive's "sample a new goal on the road graph ahead" idea; the constants are the
env's (``gpusim.env.NEW_GOAL_*``).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gpusim.backend import op_backend
from gpusim.kernels.checks import check_tensors
from gpusim.enums import RoadType
from gpusim.kernels.grid import cell_index, cell_index_jit, grid_table_rows

#: Road type code of a lane (``RoadType.LANE`` of the leaf module :mod:`gpusim.enums`).
LANE_TYPE = int(RoadType.LANE)


def _check_scalars(cell_size, min_ahead, max_dist, fallback):
    for name, v in (("cell_size", cell_size), ("min_ahead", min_ahead), ("max_dist", max_dist),
                    ("fallback", fallback)):
        if not math.isfinite(float(v)):
            raise ValueError(f"new_goal: {name} must be finite, got {v}")
    if not float(cell_size) > 0:
        raise ValueError(f"new_goal: cell_size must be > 0, got {cell_size}")
    if not float(max_dist) >= 0:
        raise ValueError(f"new_goal: max_dist must be >= 0, got {max_dist}")


def _f32_square(x: float) -> float:
    """``x * x`` rounded as float32 arithmetic does it (the bound both backends compare with)."""
    v = torch.tensor(float(x), dtype=torch.float32)
    return float(v * v)


def _goal_rows(rand, s, p, h, grid_road, grid_origin, grid_dims, cell_size, road_seg, road_type,
               min_ahead, max_dist, fallback, lane_type, grid_start=None):
    """New goal [N, 2] of N agent rows: ``rand`` [N] f32, ``s`` [N] int64, ``p`` [N, 2], ``h`` [N]."""
    grid2, start = grid_table_rows(grid_road, grid_start, "new_goal: grid_road")
    S, R = road_seg.shape[:2]
    c, sn = torch.cos(h), torch.sin(h)
    cell = cell_index(p[:, None, :], s, grid_origin, grid_dims, cell_size)[:, 0]  # [N]
    cand = grid2.index_select(0, start.index_select(0, s) + cell).to(torch.int64)  # [N, K]
    real = cand >= 0
    g = s[:, None] * R + cand.clamp_min(0)  # [N, K] flat segment index
    seg = road_seg.reshape(S * R, 4)[g]  # [N, K, 4]
    rtype = road_type.reshape(S * R)[g]
    mx = 0.5 * (seg[..., 0] + seg[..., 2])
    my = 0.5 * (seg[..., 1] + seg[..., 3])
    rx = mx - p[:, 0:1]
    ry = my - p[:, 1:2]
    ahead = rx * c[:, None] + ry * sn[:, None]
    d2 = rx * rx + ry * ry
    ok = real & (rtype == lane_type) & (ahead >= float(min_ahead)) & (d2 <= _f32_square(max_dist))
    oki = ok.to(torch.int32)
    n_ok = oki.sum(1, dtype=torch.int32)  # [N]
    j = torch.floor(rand * n_ok.to(torch.float32)).to(torch.int32)
    j = torch.minimum(j.clamp_min(0), n_ok - 1)
    rank = oki.cumsum(1, dtype=torch.int32) - 1
    k = (ok & (rank == j[:, None])).to(torch.int8).argmax(1, keepdim=True)  # the one picked (0 if none)
    gx = mx.gather(1, k)[:, 0]
    gy = my.gather(1, k)[:, 0]
    has = n_ok > 0
    fb = float(fallback)
    return torch.stack([torch.where(has, gx, p[:, 0] + fb * c), torch.where(has, gy, p[:, 1] + fb * sn)], -1)


def new_goal_reference(
    mask: torch.Tensor,
    rand: torch.Tensor,
    scenario: torch.Tensor,
    pos: torch.Tensor,
    heading: torch.Tensor,
    goal: torch.Tensor,
    grid_road: torch.Tensor,
    grid_origin: torch.Tensor,
    grid_dims: torch.Tensor,
    cell_size: float,
    road_seg: torch.Tensor,
    road_type: torch.Tensor,
    min_ahead: float,
    max_dist: float,
    fallback: float,
    lane_type: int = LANE_TYPE,
    grid_start: torch.Tensor | None = None,
) -> torch.Tensor:
    """New goals for the agents in ``mask`` (rule in the module docstring), dense over all agents.

    Args:
        mask: [W, A] bool agents that draw a new goal.
        rand: [W, A] float32 uniform numbers in [0, 1) (only masked entries are used; values
            outside [0, 1) are clamped to the first / last qualifying candidate).
        scenario: [W] int64 scenario index of each world.
        pos: [W, A, 2] float32 positions (m).
        heading: [W, A] float32 headings (rad).
        goal: [W, A, 2] float32 current goals (m), kept where ``mask`` is False.
        grid_road: [S, NC, K] int32 candidate segments per grid cell (``-1`` padding), or the
            compact [NCT, K] int16/int32 table with ``grid_start`` (``gpusim.data.layout``).
        grid_origin: [S, 2] float32, grid_dims: [S, 2] int32, cell_size: float (m) -- the grid.
        road_seg: [S, R, 4] float32 segments (x0, y0, x1, y1) (m).
        road_type: [S, R] int8 road type codes (``-1`` padding).
        min_ahead: minimum projection of (midpoint - pos) on the heading (m).
        max_dist: maximum distance from pos to the midpoint (m).
        fallback: distance of the fallback goal straight ahead (m).
        lane_type: road type code of lanes (``RoadType.LANE`` = 0).
        grid_start: [S] int64 first row of each scenario in a compact ``grid_road`` (None: padded).

    Returns:
        [W, A, 2] float32 new tensor of goals.

    Raises:
        ValueError: non-finite scalars, ``cell_size <= 0`` or ``max_dist < 0``; inconsistent
            shapes, wrong dtypes, mixed devices or non-contiguous inputs (Triton launcher).
    """
    _check_scalars(cell_size, min_ahead, max_dist, fallback)
    W, A = mask.shape
    s = scenario.to(torch.int64)[:, None].expand(W, A).reshape(-1)
    new = _goal_rows(rand.reshape(-1), s, pos.reshape(-1, 2), heading.reshape(-1), grid_road, grid_origin,
                     grid_dims, cell_size, road_seg, road_type, min_ahead, max_dist, fallback, lane_type, grid_start)
    return torch.where(mask[..., None], new.view(W, A, 2), goal)


def new_goal_compact(mask, rand, scenario, pos, heading, goal, grid_road, grid_origin, grid_dims, cell_size,
                      road_seg, road_type, min_ahead, max_dist, fallback, lane_type=LANE_TYPE, grid_start=None):
    """CPU path of :func:`new_goal`: the rows of the masked agents only (``nonzero`` costs no device
    synchronisation on the CPU), same per-row arithmetic as :func:`new_goal_reference`."""
    _check_scalars(cell_size, min_ahead, max_dist, fallback)
    W, A = mask.shape
    rows = mask.reshape(-1).nonzero().squeeze(1)
    out = goal.clone()
    if rows.numel() == 0:
        return out
    s = scenario.to(torch.int64).index_select(0, torch.div(rows, A, rounding_mode="floor"))
    new = _goal_rows(rand.reshape(-1).index_select(0, rows), s, pos.reshape(-1, 2).index_select(0, rows),
                     heading.reshape(-1).index_select(0, rows), grid_road, grid_origin, grid_dims, cell_size,
                     road_seg, road_type, min_ahead, max_dist, fallback, lane_type, grid_start)
    out.view(-1, 2).index_copy_(0, rows, new)
    return out


@triton.jit
def _new_goal_kernel(
    mask_ptr, rand_ptr, scenario_ptr, pos_ptr, heading_ptr, goal_ptr,
    grid_ptr, start_ptr, origin_ptr, dims_ptr, seg_ptr, rtype_ptr,
    out_goal_ptr,
    N, A, K, R, cell_size, min_ahead, max_d2, fallback, lane_type,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    m = rows < N
    sel = (tl.load(mask_ptr + rows, mask=m, other=0) != 0) & m
    keep = m & ~sel
    gx = tl.load(goal_ptr + 2 * rows, mask=keep, other=0.0)
    gy = tl.load(goal_ptr + 2 * rows + 1, mask=keep, other=0.0)

    w = rows // A
    s = tl.load(scenario_ptr + w, mask=sel, other=0).to(tl.int64)
    px = tl.load(pos_ptr + 2 * rows, mask=sel, other=0.0)
    py = tl.load(pos_ptr + 2 * rows + 1, mask=sel, other=0.0)
    h = tl.load(heading_ptr + rows, mask=sel, other=0.0)
    u = tl.load(rand_ptr + rows, mask=sel, other=0.0)
    c = tl.cos(h)
    sn = tl.sin(h)

    cell = cell_index_jit(px, py, s, origin_ptr, dims_ptr, cell_size, sel)

    # the cell's K candidates: [BLOCK_N, BLOCK_K]
    ko = tl.arange(0, BLOCK_K)
    lm = sel[:, None] & (ko[None, :] < K)
    row = tl.load(start_ptr + s, mask=sel, other=0).to(tl.int64) + cell  # grid_start[s] + cell
    cand = tl.load(grid_ptr + row[:, None] * K + ko[None, :], mask=lm, other=-1).to(tl.int32)
    real = lm & (cand >= 0)
    g = s[:, None] * R + tl.where(real, cand, 0).to(tl.int64)
    x0 = tl.load(seg_ptr + g * 4 + 0, mask=real, other=0.0)
    y0 = tl.load(seg_ptr + g * 4 + 1, mask=real, other=0.0)
    x1 = tl.load(seg_ptr + g * 4 + 2, mask=real, other=0.0)
    y1 = tl.load(seg_ptr + g * 4 + 3, mask=real, other=0.0)
    rt = tl.load(rtype_ptr + g, mask=real, other=-1).to(tl.int32)
    mx = 0.5 * (x0 + x1)
    my = 0.5 * (y0 + y1)
    rx = mx - px[:, None]
    ry = my - py[:, None]
    ahead = rx * c[:, None] + ry * sn[:, None]
    d2 = rx * rx + ry * ry
    ok = real & (rt == lane_type) & (ahead >= min_ahead) & (d2 <= max_d2)
    oki = ok.to(tl.int32)
    n_ok = tl.sum(oki, axis=1)
    j = tl.floor(u * n_ok.to(tl.float32)).to(tl.int32)
    j = tl.minimum(tl.maximum(j, 0), n_ok - 1)
    rank = tl.cumsum(oki, axis=1) - 1
    pick = ok & (rank == j[:, None])
    cx = tl.sum(tl.where(pick, mx, 0.0), axis=1)  # exactly one term when n_ok > 0
    cy = tl.sum(tl.where(pick, my, 0.0), axis=1)
    has = n_ok > 0
    nxg = tl.where(has, cx, px + fallback * c)
    nyg = tl.where(has, cy, py + fallback * sn)
    tl.store(out_goal_ptr + 2 * rows, tl.where(sel, nxg, gx), mask=m)
    tl.store(out_goal_ptr + 2 * rows + 1, tl.where(sel, nyg, gy), mask=m)


def _empty(shape, dtype, device) -> torch.Tensor:
    """Output allocation of the launcher (a seam for tests, which pre-fill outputs with garbage so
    that an element the kernel does not write fails the comparison)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _new_goal_triton(mask, rand, scenario, pos, heading, goal, grid_road, grid_origin, grid_dims, cell_size,
                     road_seg, road_type, min_ahead, max_dist, fallback, lane_type=LANE_TYPE, grid_start=None):
    _check_scalars(cell_size, min_ahead, max_dist, fallback)
    if mask.dim() != 2:
        raise ValueError(f"new_goal: mask must be [W, A], got shape {tuple(mask.shape)}")
    W, A = mask.shape
    if grid_road.dim() not in (2, 3) or road_seg.dim() != 3:
        raise ValueError("new_goal: grid_road must be [S, NC, K] or [NCT, K] and road_seg [S, R, 4]")
    grid2, start = grid_table_rows(grid_road, grid_start, "new_goal: grid_road")
    S, R = road_seg.shape[:2]
    K = grid2.shape[1]
    if start.shape[0] != S or (grid_road.dim() == 3 and grid_road.dtype != torch.int32):
        raise ValueError(f"new_goal: grid_road must hold {S} scenarios (int32 when padded)")
    dev = pos.device
    spec = [
        (mask, (W, A), torch.bool, "mask"), (rand, (W, A), torch.float32, "rand"),
        (scenario, (W,), torch.int64, "scenario"), (pos, (W, A, 2), torch.float32, "pos"),
        (heading, (W, A), torch.float32, "heading"), (goal, (W, A, 2), torch.float32, "goal"),
        (grid2, tuple(grid2.shape), grid2.dtype, "grid_road"), (grid_origin, (S, 2), torch.float32, "grid_origin"),
        (grid_dims, (S, 2), torch.int32, "grid_dims"), (road_seg, (S, R, 4), torch.float32, "road_seg"),
        (road_type, (S, R), torch.int8, "road_type"),
    ]
    check_tensors("new_goal", spec, dev)
    out = _empty((W, A, 2), torch.float32, dev)
    N = W * A
    if N == 0:
        return out
    block_k = triton.next_power_of_2(max(K, 1))
    block_n = max(1, min(triton.next_power_of_2(N), 4096 // block_k))
    max_d2 = _f32_square(max_dist)  # as the reference
    _new_goal_kernel[(triton.cdiv(N, block_n),)](
        mask.view(torch.int8), rand, scenario, pos, heading, goal,
        grid2, start, grid_origin, grid_dims, road_seg, road_type, out,
        N, A, K, R, float(cell_size), float(min_ahead), max_d2, float(fallback), int(lane_type),
        BLOCK_N=block_n, BLOCK_K=block_k,
    )
    return out


def new_goal(mask, rand, scenario, pos, heading, goal, grid_road, grid_origin, grid_dims, cell_size,
             road_seg, road_type, min_ahead, max_dist, fallback, lane_type=LANE_TYPE, grid_start=None, *,
             backend: str | None = None):
    """New goals for the agents in ``mask`` (rule in the module docstring).

    Same signature, semantics and errors as :func:`new_goal_reference`. Runs the Triton kernel
    when ``backend`` (:func:`gpusim.backend.op_backend`, default from ``pos``) is ``"triton"`` or
    ``"cupy"`` (CUDA tensors, or
    ``TRITON_INTERPRET=1`` with the backend forced); on CPU tensors the torch path computes only
    the masked rows (equal to the dense reference bit for bit); forced ``torch`` on a CUDA device
    runs the dense reference (no host synchronisation).
    """
    args = (mask, rand, scenario, pos, heading, goal, grid_road, grid_origin, grid_dims, cell_size,
            road_seg, road_type, min_ahead, max_dist, fallback, lane_type, grid_start)
    if op_backend(backend, pos) == "triton":
        return _new_goal_triton(*args)
    if pos.device.type == "cpu":
        return new_goal_compact(*args)
    return new_goal_reference(*args)
