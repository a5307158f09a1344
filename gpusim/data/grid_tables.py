"""Per-scenario uniform grid of nearest road segments (``grid_road``, ``grid_edge`` of the pack).

The grid covers the bounding box of the points given (valid agent positions and goals), grown by
``margin`` on every side, with square cells of edge ``cell_size``. Cell ``(ix, iy)`` has id
``iy * nx + ix`` and centre ``origin + ((ix + 0.5) * cell_size, (iy + 0.5) * cell_size)``, the same
convention as :func:`gpusim.kernels.grid.cell_index`. For each cell the table holds the indices of
the ``k`` segments nearest to the cell centre (Euclidean point-to-segment distance), nearest
first, padded with -1 when fewer segments exist. Equal distances (common: two consecutive segments
of a polyline share their nearest vertex) are ordered by segment index.

The result equals a brute-force sort over (cells x segments) in float32; to save work, cells are
processed in 4 x 4 blocks and each block only considers the segments that can possibly be among
its cells' k nearest (a triangle-inequality bound, see :func:`nearest_segments`).
"""

from __future__ import annotations

import math

import torch


def grid_geometry(points: torch.Tensor, cell_size: float, margin: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Origin and size of the grid covering ``points`` grown by ``margin``.

    Args:
        points: [M, 2] float positions (m); at least one point.
        cell_size: cell edge (m), > 0.
        margin: growth of the bounding box on every side (m), >= 0.

    Returns:
        ``(origin, dims)``: origin [2] float32 lower-left corner of cell (0, 0); dims [2] int32
        ``(nx, ny)``, each >= 1.

    Raises:
        ValueError: if ``points`` is empty or not finite, or ``cell_size <= 0`` or ``margin < 0``.
    """
    if points.ndim != 2 or points.shape[-1] != 2 or points.shape[0] == 0:
        raise ValueError(f"grid_geometry: points must be [M>0, 2], got {tuple(points.shape)}")
    if not bool(torch.isfinite(points).all()):
        raise ValueError("grid_geometry: points must be finite")
    if cell_size <= 0 or margin < 0:
        raise ValueError(f"grid_geometry: need cell_size > 0 and margin >= 0, got {cell_size}, {margin}")
    p = points.to(torch.float64)
    lo = p.min(dim=0).values - margin
    hi = p.max(dim=0).values + margin
    n = torch.clamp(torch.ceil((hi - lo) / cell_size), min=1).to(torch.int64)
    # Centre the grid on the box so the margin is symmetric after rounding up.
    lo = lo - 0.5 * (n.to(torch.float64) * cell_size - (hi - lo))
    return lo.to(torch.float32), n.to(torch.int32)


def cell_centres(origin: torch.Tensor, dims: torch.Tensor, cell_size: float) -> torch.Tensor:
    """[nx * ny, 2] float32 centres of the cells in id order (``id = iy * nx + ix``)."""
    nx, ny = int(dims[0]), int(dims[1])
    ix = torch.arange(nx, dtype=torch.float32)
    iy = torch.arange(ny, dtype=torch.float32)
    cx = origin[0] + (ix + 0.5) * cell_size
    cy = origin[1] + (iy + 0.5) * cell_size
    return torch.stack([cx.repeat(ny), cy.repeat_interleave(nx)], dim=-1)


def point_segment_distance(points: torch.Tensor, seg: torch.Tensor, squared: bool = False) -> torch.Tensor:
    """Euclidean distance from every point to every segment.

    Args:
        points: [M, 2] float (m). seg: [R, 4] float ``(x0, y0, x1, y1)`` (m); zero-length
            segments are allowed (distance to the point).
        squared: return squared distances (m^2) instead (no square root; same order).

    Returns:
        [M, R] distances (m) or squared distances, dtype of ``points``.
    """
    ax, ay, bx, by = (seg[:, i][None, :] for i in range(4))
    abx, aby = bx - ax, by - ay
    px, py = points[:, 0:1], points[:, 1:2]
    dx, dy = px - ax, py - ay
    den = (abx * abx + aby * aby).clamp_min(1e-12)
    t = ((dx * abx + dy * aby) / den).clamp_(0.0, 1.0)
    ex = dx.sub_(t * abx)
    ey = dy.sub_(t * aby)
    d2 = ex.mul_(ex).add_(ey * ey)
    return d2 if squared else d2.sqrt_()


def _sort_keys(dist: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """int64 keys ordering (distance, index) pairs: a non-negative float32's bit pattern is
    monotonic in its value, so ``bits << 32 | index`` sorts by distance, then by index."""
    bits = dist.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)
    return (bits << 32) | index.to(torch.int64)


def nearest_segments(
    centres: torch.Tensor,
    seg: torch.Tensor,
    k: int,
    candidates: torch.Tensor | None = None,
    groups: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Indices of the ``k`` segments nearest to each centre, nearest first, -1 padded.

    The result is exactly that of a brute-force sort of all squared distances (float32, computed
    by :func:`point_segment_distance`; ties by segment index). To save work, queries are processed in spatially compact ``groups``:
    with ``c`` the group's mean point, ``h`` the largest distance from ``c`` to a query of the group
    and ``d_k(c)`` the k-th smallest distance from ``c``, every query ``q`` of the group has
    ``d_k(q) <= d_k(c) + h`` and ``d(c, s) <= d(q, s) + h`` (triangle inequality), so only segments
    with ``d(c, s) <= d_k(c) + 2 h`` can be among its k nearest; the others are skipped.

    Args:
        centres: [M, 2] float32 query points (m).
        seg: [R, 4] float32 segments (m).
        k: entries per query (>= 1).
        candidates: optional [R'] int64 ascending subset of segment indices to consider (e.g. road
            edges); returned indices are still indices into ``seg``.
        groups: optional list of int64 index tensors partitioning ``range(M)`` into compact groups
            (default: one group per 256 consecutive queries; correct for any grouping, only
            slower when groups are spread out).

    Returns:
        [M, k] int32.
    """
    m = centres.shape[0]
    out = torch.full((m, k), -1, dtype=torch.int32)
    if candidates is None:
        candidates = torch.arange(seg.shape[0])
    pool = seg[candidates]
    r = pool.shape[0]
    if r == 0 or m == 0:
        return out
    if groups is None:
        groups = list(torch.arange(m).split(256))
    pool_idx = torch.arange(r)
    for g in groups:
        q = centres[g]
        if r > k:
            c = q.mean(dim=0, keepdim=True)
            h = float(torch.linalg.vector_norm(q - c, dim=1).max())
            dc = point_segment_distance(c, pool)[0]
            bound = float(torch.kthvalue(dc, k).values) + 2.0 * h + 1e-3
            sel = torch.nonzero(dc <= bound).flatten()
        else:
            sel = pool_idx
        d2 = point_segment_distance(q, pool[sel], squared=True)
        key = _sort_keys(d2, sel.expand_as(d2))
        kk = min(k, sel.numel())
        key = torch.topk(key, kk, dim=1, largest=False, sorted=True).values
        out[g, :kk] = candidates[key & 0xFFFFFFFF].to(torch.int32)
    return out


def cell_blocks(dims: torch.Tensor, block: int = 4) -> list[torch.Tensor]:
    """Cell ids grouped into ``block x block`` squares (border blocks smaller), for
    :func:`nearest_segments`."""
    nx, ny = int(dims[0]), int(dims[1])
    ids = torch.arange(nx * ny).reshape(ny, nx)
    return [ids[y : y + block, x : x + block].flatten() for y in range(0, ny, block) for x in range(0, nx, block)]


def build_grid_tables(
    seg: torch.Tensor,
    seg_type: torch.Tensor,
    points: torch.Tensor,
    cell_size: float,
    margin: float,
    k: int,
    edge_k: int,
    edge_type: int,
) -> dict[str, torch.Tensor]:
    """Grid geometry and nearest-segment tables of one scenario.

    Args:
        seg: [R, 4] float32 segments (m, scenario frame). seg_type: [R] int8 RoadType codes.
        points: [M, 2] positions the grid must cover (valid agent positions and goals).
        cell_size, margin: see :func:`grid_geometry`. k: ``grid_k``; edge_k: ``grid_edge_k``.
        edge_type: the RoadType code of road edges (``RoadType.ROAD_EDGE``).

    Returns:
        dict with ``grid_origin`` [2] float32, ``grid_dims`` [2] int32, ``grid_road`` [NC, k] int32,
        ``grid_edge`` [NC, edge_k] int32 (NC = nx * ny).
    """
    origin, dims = grid_geometry(points, cell_size, margin)
    centres = cell_centres(origin, dims, cell_size)
    seg = seg.to(torch.float32)
    groups = cell_blocks(dims)
    road = nearest_segments(centres, seg, k, groups=groups)
    edges = torch.nonzero(seg_type == edge_type).flatten()
    edge = nearest_segments(centres, seg, edge_k, candidates=edges, groups=groups)
    return {"grid_origin": origin, "grid_dims": dims, "grid_road": road, "grid_edge": edge}


def grid_cells(dims: torch.Tensor) -> int:
    """nx * ny."""
    return int(math.prod(int(v) for v in dims))
