"""Ego-centric observations: ego features, nearest partners, nearest road segments.

For every policy slot ``c`` of every world ``w`` (slot ``c`` is agent ``c``) the observation is one
flat float32 vector (see :class:`ObsLayout`)::

    [ ego (ego_dim) | partners (P x partner_dim, row-major) | roads (K x road_dim, row-major) ]

*Ego frame*: origin at the agent's centre, x axis along its heading, y axis to its left.

Ego block (``EGO_FEATURES``): signed speed / ``SPEED_SCALE``, length and width / ``SIZE_SCALE``,
goal position in the ego frame and goal distance / ``GOAL_SCALE``, then the five ``EGO_EXTRA``
values the env computes (copied unchanged).

Partner block: every *other* present agent of the world (controlled or log-replayed expert) whose
centre lies within ``partner_radius`` of the ego's centre; the nearest ``P`` of them, nearest first.
Per slot (``PARTNER_FEATURES``): relative position in the ego frame / ``partner_radius``, relative
heading as cos/sin, the partner's signed speed / ``SPEED_SCALE``, length and width /
``SIZE_SCALE``, type one-hot (vehicle, pedestrian, cyclist), valid flag.

Road block: the ``K = grid_road.shape[2]`` candidate segments the scenario's grid stores for the
ego's cell (``gpusim.kernels.grid.cell_index``; nearest to the cell centre), re-sorted by the true
point-to-segment distance from the ego's centre. A slot is valid when its index is ``>= 0`` and
that distance is ``<= road_radius``; valid slots come first. Per slot (``ROAD_FEATURES``): segment
midpoint in the ego frame / ``road_radius``, length / ``road_radius`` (same unit as the midpoint,
so the endpoints are ``mid +- length/2 * dir``), direction (x0,y0)->(x1,y1) as cos/sin in the ego
frame, type one-hot in ``NUM_ROAD_OBS_TYPES`` groups (lane, road_line, road_edge, other), valid.

Padding slots (no partner / invalid segment) are all zero, so the last feature of each slot (the
valid flag) is 0 exactly there. An inactive slot (``ego_active`` false) gets an all-zero vector.

Ordering and ties: the sort key of a partner (squared centre distance) or a road candidate
(squared point-to-segment distance) is the float32 bit pattern with its lowest ``b`` mantissa
bits replaced by the candidate's index (``b = ceil(log2(A))`` resp. ``ceil(log2(K))``). Keys are
therefore unique: candidates whose squared distances agree to a relative ``2**(b-23)`` (about
1e-5 for b = 7, i.e. under a millimetre at 50 m) are ordered by index (agent slot, resp. grid
order). The torch reference and the Triton kernel use the same keys and the same distance
arithmetic; where the projection falls outside a segment the distance comes from the exact
endpoint coordinates (:func:`_segment_d2`), so segments sharing their nearest vertex tie exactly
and are ordered by grid position in both backends, whatever the last bits of the ego position.

CPU fast path: :func:`observations_compiled` (opt-in, ``EnvConfig.compile``) runs the same
computation through ``torch.compile`` over fixed-size row blocks.

Normalisation constants (:data:`SPEED_SCALE`, :data:`SIZE_SCALE`, :data:`GOAL_SCALE`) are chosen so
typical urban values are O(1); they are not taken from another project.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpusim.backend import backend_for
from gpusim.kernels.grid import cell_index

from gpusim.kernels.obs_layout import (  # noqa: F401  (re-exported: the layout is part of this API)
    SPEED_SCALE,
    SIZE_SCALE,
    GOAL_SCALE,
    EGO_EXTRA,
    EGO_FEATURES,
    PARTNER_FEATURES,
    ROAD_FEATURES,
    ObsLayout,
    obs_layout,
    _NUM_OBJECT_TYPES,
    _NUM_ROAD_OBS_TYPES,
)


def _index_bits(n: int) -> int:
    """Low mantissa bits that hold a candidate index in the sort key (``ceil(log2(n))``, >= 1)."""
    return max(1, (int(n) - 1).bit_length())


def _sort_key(d2: torch.Tensor, ok: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 sort key: float bits of ``d2 >= 0`` with the low ``bits`` replaced by the last-axis
    index; invalid candidates get the bits of +inf (sorted last, still by index)."""
    n = d2.shape[-1]
    raw = torch.where(ok, d2, float("inf")).view(torch.int32)
    ar = torch.arange(n, dtype=torch.int32, device=d2.device)
    return (raw & ~((1 << bits) - 1)) | ar


#: int32 bit pattern of float32 +inf: sort keys at or above it are invalid candidates.
_INF_BITS = 0x7F800000
#: Slot rows per block of the CPU reference: with K = 128 about 64K road candidates, so the
#: per-candidate intermediates of a block stay in the CPU cache.
_BLOCK_CANDIDATES = 65536
#: Midpoint of the "far" padding row of the road table: any ego is farther than any road radius
#: from it (finite, so the distance arithmetic stays finite: (1e18)^2 < float32 max).
_FAR = 1.0e18
#: Columns of the per-segment road feature table (see :func:`road_table`).
_ROAD_COLS = 10
#: Columns of the per-segment road geometry table (see :func:`road_table`).
_GEO_COLS = 8
#: Columns of the per-agent table (see :func:`_agent_table`).
_AGENT_COLS = 12

_road_table_cache: list = []  # [(weakref road_seg, weakref road_type, versions, (geo, feat))]


def road_table(road_seg: torch.Tensor, road_type: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-segment road tables, computed once per pack and cached (CPU reference).

    Args:
        road_seg: [S, R, 4] float32 segments (x0, y0, x1, y1) (m).
        road_type: [S, R] int8 ``RoadType`` codes.

    Returns:
        ``(geo, feat)`` for global segment ``s * R + r``:

        * ``geo`` [S*R + 2, 8] float32 rows ``(x0, y0, x1, y1, dir_x, dir_y, length, 0)``: what the
          point-to-segment distance needs (:func:`_segment_d2`);
        * ``feat`` [S*R + 2, 10] float32 rows ``(mid_x, mid_y, dir_x, dir_y, half_length, is_lane,
          is_road_line, is_road_edge, is_other, 1)``: what an observation slot shows.

        Row ``S*R`` is a "far" row (both endpoints at 1e18 m: never within a road radius) that grid
        padding points to; row ``S*R + 1`` is all zero (what padding observation slots gather).
        Zero-length segments get direction (1, 0), which keeps the distance formula exact.

    The tables are cached for the last few (road_seg, road_type) tensor objects (weak references
    plus the tensors' in-place version counters, so an edited or freed tensor is never served a
    stale table).
    """
    import weakref

    key = (road_seg._version, road_type._version)
    for ref_s, ref_t, ver, tabs in _road_table_cache:
        if ref_s() is road_seg and ref_t() is road_type and ver == key:
            return tabs
    S, R = road_type.shape
    p0, p1 = road_seg[..., 0:2], road_seg[..., 2:4]
    d = p1 - p0
    seg_len = torch.sqrt(d[..., 0] * d[..., 0] + d[..., 1] * d[..., 1])  # not .sum(): same rounding as the kernel
    nz = seg_len > 0
    inv = 1.0 / torch.where(nz, seg_len, 1.0)
    ux = torch.where(nz, d[..., 0] * inv, 1.0)
    uy = torch.where(nz, d[..., 1] * inv, 0.0)
    t = road_type.to(torch.int64)
    group = torch.where((t >= 0) & (t < 3), t, 3)
    onehot = (group[..., None] == torch.arange(_NUM_ROAD_OBS_TYPES, device=road_seg.device)).to(torch.float32)
    mid = 0.5 * (p0 + p1)
    feat = road_seg.new_zeros(S * R + 2, _ROAD_COLS)
    feat[: S * R] = torch.cat(
        [mid, torch.stack([ux, uy, 0.5 * seg_len], dim=-1), onehot, torch.ones_like(ux)[..., None]], dim=-1
    ).reshape(S * R, _ROAD_COLS)
    feat[S * R, 0:2] = _FAR
    feat[S * R, 2] = 1.0
    geo = road_seg.new_zeros(S * R + 2, _GEO_COLS)
    geo[: S * R] = torch.cat(
        [road_seg, torch.stack([ux, uy, seg_len, torch.zeros_like(ux)], dim=-1)], dim=-1
    ).reshape(S * R, _GEO_COLS)
    geo[S * R, 0:4] = _FAR
    geo[S * R, 4] = 1.0
    tabs = (geo, feat)
    _road_table_cache.insert(0, (weakref.ref(road_seg), weakref.ref(road_type), key, tabs))
    del _road_table_cache[4:]
    return tabs


def _segment_d2(ex, ey, x0, y0, x1, y1, ux, uy, seg_len):
    """Squared distance (m^2) from the point (ex, ey) to the segment (x0, y0)-(x1, y1) with unit
    direction (ux, uy) and length ``seg_len`` (broadcasting float32 tensors).

    Where the projection falls outside the segment the distance is taken from the *exact* endpoint
    coordinates, ``(ex - x)^2 + (ey - y)^2`` in this operation order, and the Triton kernel does the
    same: segments that share their nearest vertex (consecutive polyline pieces, polylines starting
    at one vertex) then get bit-identical distances, so their order is decided by the index bits of
    the sort key alone, identically in both backends, however the ego position differs in its last
    bits between them. Inside the segment it is the squared perpendicular distance.
    """
    q0x = ex - x0
    q0y = ey - y0
    along = q0x * ux + q0y * uy
    perp = q0x * uy - q0y * ux
    before = along <= 0.0
    cx = torch.where(before, q0x, ex - x1)
    cy = torch.where(before, q0y, ey - y1)
    return torch.where(before | (along >= seg_len), cx * cx + cy * cy, perp * perp)


def _agent_table(pos, heading, speed, length, width, agent_type) -> torch.Tensor:
    """[W*A + 1, 12] per-agent rows x, y, cos h, sin h, speed/20, length/5, width/5, 3 type
    one-hots, 1, 0 — and a final all-zero row that padding partner slots gather."""
    W, A = speed.shape
    n = W * A
    tab = pos.new_empty(n + 1, _AGENT_COLS)
    tab[n] = 0.0
    t = tab[:n]
    t[:, 0:2] = pos.view(n, 2)
    h = heading.view(n)
    torch.cos(h, out=t[:, 2])
    torch.sin(h, out=t[:, 3])
    torch.mul(speed.view(n), 1.0 / SPEED_SCALE, out=t[:, 4])
    torch.mul(length.view(n), 1.0 / SIZE_SCALE, out=t[:, 5])
    torch.mul(width.view(n), 1.0 / SIZE_SCALE, out=t[:, 6])
    at = agent_type.view(n)
    for k in range(_NUM_OBJECT_TYPES):
        torch.eq(at, k, out=t[:, 7 + k])
    t[:, 10] = 1.0
    t[:, 11] = 0.0
    return tab


def _live_rows(obs2d: torch.Tensor, act: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """Compaction shared by the eager and compiled CPU paths: zero the requested rows of ``obs2d``
    ([W*C, D]) whose slot is not active (``act`` [W*C] bool) and return the active ones ([n] int64)
    — all rows when ``rows`` is None. On the CPU ``nonzero`` costs no device sync."""
    if rows is None:
        live = act.nonzero().squeeze(1)
        dead = (~act).nonzero().squeeze(1)
    else:
        sel = act.index_select(0, rows)
        live, dead = rows[sel], rows[~sel]
    if dead.numel():
        obs2d.index_fill_(0, dead, 0.0)
    return live


def observations_reference(
    pos: torch.Tensor,
    heading: torch.Tensor,
    speed: torch.Tensor,
    length: torch.Tensor,
    width: torch.Tensor,
    agent_type: torch.Tensor,
    present: torch.Tensor,
    goal: torch.Tensor,
    ego_extra: torch.Tensor,
    ego_active: torch.Tensor,
    scenario: torch.Tensor,
    road_seg: torch.Tensor,
    road_type: torch.Tensor,
    grid_road: torch.Tensor,
    grid_origin: torch.Tensor,
    grid_dims: torch.Tensor,
    cell_size: float,
    num_partners: int,
    partner_radius: float,
    road_radius: float,
    out: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Ego-centric observation of every policy slot (layout: :func:`obs_layout`, module docstring).

    Args:
        pos: [W, A, 2] float32 agent centres (m, scenario-centred frame).
        heading: [W, A] float32 headings (rad, CCW from +x).
        speed: [W, A] float32 signed speed along the heading (m/s).
        length, width: [W, A] float32 box size (m).
        agent_type: [W, A] int8 ``ObjectType`` code (0 vehicle, 1 pedestrian, 2 cyclist; others
            give an all-zero one-hot).
        present: [W, A] bool, agent is in the scene and observable (controlled agents in play and
            present experts; removed agents are not present).
        goal: [W, C, 2] float32 goal of controlled slot c = agent c (m), C <= A.
        ego_extra: [W, C, 5] float32 env-computed features ``EGO_EXTRA`` (copied as given).
        ego_active: [W, C] bool, the slot's agent is in play; inactive slots get all zeros.
        scenario: [W] int64 scenario index of each world.
        road_seg: [S, R, 4] float32 segments (x0, y0, x1, y1) (m).
        road_type: [S, R] int8 ``RoadType`` code (lane 0, road_line 1, road_edge 2, other >= 3).
        grid_road: [S, NC, K] int32 candidate segment indices per cell, -1 padding.
        grid_origin: [S, 2] float32, grid_dims: [S, 2] int32, cell_size: float (m) — the grid
            (see ``gpusim.kernels.grid``).
        num_partners: P partner slots.
        partner_radius: partners farther than this (centre distance, m) are not observed.
        road_radius: segments farther than this (point-to-segment distance, m) are invalid.
        out: optional preallocated [W, C, D] float32 contiguous output; reusing one buffer avoids
            re-faulting a large fresh allocation each step. Without ``rows`` every element is
            written.
        rows: optional [N] int64 flat slot indices ``w * C + c`` (unique, any order; requires
            ``out``): only these slots are written (an inactive listed slot gets zeros), every
            other element of ``out`` is left as it is. The env uses it to rewrite only the slots
            whose content can change and keep the rest of a zeroed buffer (see docs/performance.md).

    Returns:
        [W, C, D] float32 observations, D = ``obs_layout(num_partners, K).obs_dim``
        (``out`` itself when given).

    Raises:
        ValueError: on inconsistent shapes, wrong dtypes or devices, non-contiguous tensors,
            C > A, num_partners < 1, non-positive radii / cell size, or ``rows`` that is not a
            1-D int64 tensor on the same device, or is given without ``out``.
    """
    lay = _check_inputs(
        pos, heading, speed, length, width, agent_type, present, goal, ego_extra, ego_active, scenario,
        road_seg, road_type, grid_road, grid_origin, grid_dims, cell_size, num_partners, partner_radius,
        road_radius, out, rows,
    )
    W, A = heading.shape
    C = goal.shape[1]
    D = lay.obs_dim
    obs = out if out is not None else torch.empty(W, C, D, device=pos.device, dtype=torch.float32)
    obs2d = obs.view(W * C, D)
    live = _live_rows(obs2d, ego_active.view(W * C), rows)
    n_live = live.numel()
    if n_live == 0:
        return obs
    agent_tab = _agent_table(pos, heading, speed, length, width, agent_type)  # [W*A + 1, 12]
    road_tab = road_table(road_seg, road_type)  # ([S*R + 2, 8] geometry, [S*R + 2, 10] features)
    K = grid_road.shape[2]
    block = n_live if pos.is_cuda else max(1, _BLOCK_CANDIDATES // max(K, A, 1))
    for r0 in range(0, n_live, block):
        _observe_rows(
            obs2d, live[r0 : r0 + block], lay, C, pos, present, goal, ego_extra, scenario, road_seg.shape[1],
            grid_road, grid_origin, grid_dims, cell_size, agent_tab, road_tab, partner_radius, road_radius,
        )
    return obs


def _observe_rows(
    obs2d, rows, lay, C, pos, present, goal, ego_extra, scenario, R, grid_road, grid_origin, grid_dims, cell_size,
    agent_tab, road_tab, partner_radius, road_radius,
):
    """Compute the observations of the in-play slots ``rows`` [n] (flat ``w * C + c``) and copy
    them into ``obs2d`` [W*C, D] (see :func:`observations_reference`)."""
    n = rows.shape[0]
    W, A = present.shape
    S, NC, K = grid_road.shape
    P = lay.num_partners
    dev = pos.device
    w = torch.div(rows, C, rounding_mode="floor")
    c = rows - w * C
    blk = torch.empty(n, lay.obs_dim, device=dev, dtype=torch.float32)

    # ------------------------------------------------------------ ego block [n, 11]
    e = agent_tab.index_select(0, w * A + c)  # [n, 12]
    ex, ey, ec, es = e[:, 0:1], e[:, 1:2], e[:, 2:3], e[:, 3:4]  # [n, 1]
    gl = goal.view(W * C, 2).index_select(0, rows)
    gx, gy = gl[:, 0:1] - ex, gl[:, 1:2] - ey
    blk[:, 0:3] = e[:, 4:7]
    blk[:, 3:4] = (gx * ec + gy * es) / GOAL_SCALE
    blk[:, 4:5] = (gy * ec - gx * es) / GOAL_SCALE
    blk[:, 5:6] = torch.sqrt(gx * gx + gy * gy) / GOAL_SCALE
    blk[:, 6:lay.ego_dim] = ego_extra.view(W * C, -1).index_select(0, rows)

    # ------------------------------------------------------------ partners [n, P, 11]
    pw = pos.view(W, A * 2).index_select(0, w).view(n, A, 2)
    rx, ry = pw[..., 0] - ex, pw[..., 1] - ey  # [n, A]
    d2 = rx * rx + ry * ry
    ok = present.index_select(0, w)
    ok &= torch.arange(A, device=dev)[None, :] != c[:, None]
    ok &= d2 <= partner_radius * partner_radius
    kp = min(P, A)
    abits = _index_bits(A)
    top = torch.topk(_sort_key(d2, ok, abits), kp, dim=-1, largest=False, sorted=True).values  # [n, kp]
    prow = torch.where(top < _INF_BITS, (top & ((1 << abits) - 1)) + (w * A)[:, None], agent_tab.shape[0] - 1)
    g = agent_tab.index_select(0, prow.view(-1)).view(n, kp, _AGENT_COLS)
    one = g[..., 10]
    px, py = g[..., 0] - ex * one, g[..., 1] - ey * one  # zero on padding rows
    pc, ps = g[..., 2], g[..., 3]
    inv_pr = 1.0 / partner_radius
    part = blk[:, lay.partners].view(n, P, lay.partner_dim)
    part[:, :kp, 0] = (px * ec + py * es) * inv_pr
    part[:, :kp, 1] = (py * ec - px * es) * inv_pr
    part[:, :kp, 2] = pc * ec + ps * es
    part[:, :kp, 3] = ps * ec - pc * es
    part[:, :kp, 4:] = g[..., 4:11]
    if kp < P:
        part[:, kp:] = 0.0

    # ------------------------------------------------------------ roads [n, K, 10]
    s = scenario.index_select(0, w)  # [n] int64
    cell = cell_index(e[:, None, 0:2], s, grid_origin, grid_dims, cell_size)[:, 0]  # [n]
    cand = grid_road.view(S * NC, K).index_select(0, s * NC + cell)  # [n, K] int32
    geo, feat = road_tab
    far = geo.shape[0] - 2
    gidx = torch.where(cand >= 0, cand + (s * R).to(torch.int32)[:, None], far)  # [n, K] int32
    g = geo.index_select(0, gidx.view(-1)).view(n, K, _GEO_COLS)
    rd2 = _segment_d2(ex, ey, g[..., 0], g[..., 1], g[..., 2], g[..., 3], g[..., 4], g[..., 5], g[..., 6])
    rbits = _index_bits(K)
    rkey = torch.sort(_sort_key(rd2, rd2 <= road_radius * road_radius, rbits), dim=-1).values  # [n, K]
    order = (rkey & ((1 << rbits) - 1)).to(torch.int64)
    srow = torch.where(rkey < _INF_BITS, torch.gather(gidx, 1, order), far + 1)  # invalid -> zero row
    g = feat.index_select(0, srow.view(-1)).view(n, K, _ROAD_COLS)
    one = g[..., 9]
    mx, my = g[..., 0] - ex * one, g[..., 1] - ey * one  # zero on padding rows
    ux, uy = g[..., 2], g[..., 3]
    inv_rr = 1.0 / road_radius
    road = blk[:, lay.roads].view(n, K, lay.road_dim)
    road[..., 0] = (mx * ec + my * es) * inv_rr
    road[..., 1] = (my * ec - mx * es) * inv_rr
    road[..., 2] = g[..., 4] * (2.0 * inv_rr)
    road[..., 3] = ux * ec + uy * es
    road[..., 4] = uy * ec - ux * es
    road[..., 5:] = g[..., 5:]
    obs2d.index_copy_(0, rows, blk)


# ---------------------------------------------------------------------------------------------
# Compiled CPU path (opt-in, EnvConfig.compile): the same computation as the reference, written
# functionally for torch.compile (inductor) over blocks of a FIXED number of slot rows, so every
# shape is static (dynamic=False) and one compiled graph serves every step of an env.
# ---------------------------------------------------------------------------------------------

#: Slot rows per compiled block: full blocks of the first size while that many rows remain, the
#: rest in blocks of the second size; a short last block is padded with copies of its last row
#: (their identical values are written twice). So there are two graphs, never a new shape.
COMPILED_BLOCK_ROWS = (512, 64)
_compiled_fn: list = []  # [torch.compile(_observe_block_into)], built on first use


def _observe_block(rows, agent_tab, geo, feat, pos, present, goal2, extra2, scenario, grid2, grid_origin, grid_dims,
                   C: int, P: int, R: int, cell_size: float, partner_radius: float, road_radius: float):
    """Observations [n, D] of the slot rows ``rows`` [n] (flat ``w * C + c``, all in play); a
    functional (no in-place) copy of :func:`_observe_rows` for torch.compile. ``goal2`` [W*C, 2],
    ``extra2`` [W*C, 5], ``grid2`` [S*NC, K] are flat views of the reference's inputs."""
    n = rows.shape[0]
    W, A = present.shape
    K = grid2.shape[1]
    NC = grid2.shape[0] // grid_origin.shape[0]
    w = torch.div(rows, C, rounding_mode="floor")
    c = rows - w * C
    e = agent_tab.index_select(0, w * A + c)
    ex, ey, ec, es = e[:, 0:1], e[:, 1:2], e[:, 2:3], e[:, 3:4]
    gl = goal2.index_select(0, rows)
    gx, gy = gl[:, 0:1] - ex, gl[:, 1:2] - ey
    ego = torch.cat([e[:, 4:7], (gx * ec + gy * es) / GOAL_SCALE, (gy * ec - gx * es) / GOAL_SCALE,
                     torch.sqrt(gx * gx + gy * gy) / GOAL_SCALE, extra2.index_select(0, rows)], 1)
    # partners
    pw = pos.view(W, A * 2).index_select(0, w).view(n, A, 2)
    rx, ry = pw[..., 0] - ex, pw[..., 1] - ey
    d2 = rx * rx + ry * ry
    ok = (present.index_select(0, w) & (torch.arange(A, device=pos.device)[None, :] != c[:, None])
          & (d2 <= partner_radius * partner_radius))
    kp = min(P, A)
    abits = _index_bits(A)
    top = torch.topk(_sort_key(d2, ok, abits), kp, dim=-1, largest=False, sorted=True).values
    prow = torch.where(top < _INF_BITS, (top & ((1 << abits) - 1)) + (w * A)[:, None], agent_tab.shape[0] - 1)
    g = agent_tab.index_select(0, prow.view(-1)).view(n, kp, _AGENT_COLS)
    one = g[..., 10]
    px, py = g[..., 0] - ex * one, g[..., 1] - ey * one
    pc, ps = g[..., 2], g[..., 3]
    inv_pr = 1.0 / partner_radius
    part = torch.cat([torch.stack([(px * ec + py * es) * inv_pr, (py * ec - px * es) * inv_pr, pc * ec + ps * es,
                                   ps * ec - pc * es], -1), g[..., 4:11]], -1)
    if kp < P:
        part = torch.cat([part, part.new_zeros(n, P - kp, part.shape[-1])], 1)
    # roads
    s = scenario.index_select(0, w)
    cell = cell_index(e[:, None, 0:2], s, grid_origin, grid_dims, cell_size)[:, 0]
    cand = grid2.index_select(0, s * NC + cell)
    far = geo.shape[0] - 2
    gidx = torch.where(cand >= 0, cand + (s * R).to(torch.int32)[:, None], far)
    g = geo.index_select(0, gidx.view(-1)).view(n, K, _GEO_COLS)
    rd2 = _segment_d2(ex, ey, g[..., 0], g[..., 1], g[..., 2], g[..., 3], g[..., 4], g[..., 5], g[..., 6])
    rbits = _index_bits(K)
    rkey = torch.sort(_sort_key(rd2, rd2 <= road_radius * road_radius, rbits), dim=-1).values
    order = (rkey & ((1 << rbits) - 1)).to(torch.int64)
    srow = torch.where(rkey < _INF_BITS, torch.gather(gidx, 1, order), far + 1)
    g = feat.index_select(0, srow.view(-1)).view(n, K, _ROAD_COLS)
    one = g[..., 9]
    mx, my = g[..., 0] - ex * one, g[..., 1] - ey * one
    ux, uy = g[..., 2], g[..., 3]
    inv_rr = 1.0 / road_radius
    road = torch.cat([torch.stack([(mx * ec + my * es) * inv_rr, (my * ec - mx * es) * inv_rr, g[..., 4] * (2.0 * inv_rr),
                                   ux * ec + uy * es, uy * ec - ux * es], -1), g[..., 5:]], -1)
    return torch.cat([ego, part.reshape(n, -1), road.reshape(n, -1)], 1)


def _observe_block_into(obs2d, rows, *args):
    """:func:`_observe_block` scattered into ``obs2d`` [W*C, D] at ``rows`` (inside the compiled
    graph, so the block is written once, straight into the buffer)."""
    obs2d.index_copy_(0, rows, _observe_block(rows, *args))


def observations_compiled(
    pos, heading, speed, length, width, agent_type, present, goal, ego_extra, ego_active, scenario,
    road_seg, road_type, grid_road, grid_origin, grid_dims, cell_size, num_partners, partner_radius,
    road_radius, out=None, rows=None,
):
    """``torch.compile`` (inductor, CPU) version of :func:`observations_reference`: same arguments,
    result within float32 rounding (a few 1e-7) and the same slot order.

    The in-play rows are processed in blocks of :data:`COMPILED_BLOCK_ROWS` (512, then 64 for the
    rest) with static shapes (``dynamic=False``; the last block is padded), so two graphs are
    compiled per set of input shapes and scalar arguments: the first call of a new env size
    compiles for about 10-30 s on the 2-core development machine (docs/performance.md). The sort and top-k stay ATen calls inside
    the graph; the gathers, distances, transforms and the scatter into ``out`` are fused. The
    per-agent table is built eagerly, the road tables come from the :func:`road_table` cache.

    Raises:
        ValueError: as :func:`observations_reference`.
    """
    lay = _check_inputs(
        pos, heading, speed, length, width, agent_type, present, goal, ego_extra, ego_active, scenario,
        road_seg, road_type, grid_road, grid_origin, grid_dims, cell_size, num_partners, partner_radius,
        road_radius, out, rows,
    )
    W, A = heading.shape
    C = goal.shape[1]
    S, NC, K = grid_road.shape
    obs = out if out is not None else torch.empty(W, C, lay.obs_dim, device=pos.device, dtype=torch.float32)
    obs2d = obs.view(W * C, lay.obs_dim)
    live = _live_rows(obs2d, ego_active.view(W * C), rows)
    n_live = live.numel()
    if n_live == 0:
        return obs
    if not _compiled_fn:
        _compiled_fn.append(torch.compile(_observe_block_into, dynamic=False))
    fn = _compiled_fn[0]
    agent_tab = _agent_table(pos, heading, speed, length, width, agent_type)
    geo, feat = road_table(road_seg, road_type)
    big, small = COMPILED_BLOCK_ROWS
    args = (agent_tab, geo, feat, pos, present, goal.view(W * C, 2), ego_extra.view(W * C, -1), scenario,
            grid_road.view(S * NC, K), grid_origin, grid_dims, C, lay.num_partners, road_seg.shape[1],
            float(cell_size), float(partner_radius), float(road_radius))
    r0 = 0
    while r0 < n_live:
        B = big if n_live - r0 >= big else small
        r = live[r0 : r0 + B]
        r0 += B
        if r.numel() < B:  # pad with the last row: same values written again, no new shape
            r = torch.cat([r, r[-1:].expand(B - r.numel())])
        fn(obs2d, r, *args)
    return obs


def _check_inputs(
    pos, heading, speed, length, width, agent_type, present, goal, ego_extra, ego_active, scenario,
    road_seg, road_type, grid_road, grid_origin, grid_dims, cell_size, num_partners, partner_radius,
    road_radius, out, rows=None,
) -> ObsLayout:
    """Validate shapes/dtypes/devices (host-side metadata only, no device sync); return the layout."""
    if pos.dim() != 3 or pos.shape[-1] != 2:
        raise ValueError(f"observations: pos must be [W, A, 2], got {tuple(pos.shape)}")
    W, A = pos.shape[:2]
    if goal.dim() != 3 or goal.shape[0] != W or goal.shape[2] != 2:
        raise ValueError(f"observations: goal must be [W={W}, C, 2], got {tuple(goal.shape)}")
    C = goal.shape[1]
    if C > A:
        raise ValueError(f"observations: C = goal.shape[1] = {C} exceeds A = {A}")
    if grid_road.dim() != 3:
        raise ValueError(f"observations: grid_road must be [S, NC, K], got {tuple(grid_road.shape)}")
    if road_seg.dim() != 3 or road_seg.shape[-1] != 4:
        raise ValueError(f"observations: road_seg must be [S, R, 4], got {tuple(road_seg.shape)}")
    S, R = road_seg.shape[:2]
    K = grid_road.shape[2]
    expect = {
        "pos": (pos, (W, A, 2), torch.float32),
        "heading": (heading, (W, A), torch.float32),
        "speed": (speed, (W, A), torch.float32),
        "length": (length, (W, A), torch.float32),
        "width": (width, (W, A), torch.float32),
        "agent_type": (agent_type, (W, A), torch.int8),
        "present": (present, (W, A), torch.bool),
        "goal": (goal, (W, C, 2), torch.float32),
        "ego_extra": (ego_extra, (W, C, len(EGO_EXTRA)), torch.float32),
        "ego_active": (ego_active, (W, C), torch.bool),
        "scenario": (scenario, (W,), torch.int64),
        "road_seg": (road_seg, (S, R, 4), torch.float32),
        "road_type": (road_type, (S, R), torch.int8),
        "grid_road": (grid_road, (S, grid_road.shape[1], K), torch.int32),
        "grid_origin": (grid_origin, (S, 2), torch.float32),
        "grid_dims": (grid_dims, (S, 2), torch.int32),
    }
    for name, (t, shape, dtype) in expect.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"observations: {name} must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != shape:
            raise ValueError(f"observations: {name} must have shape {shape}, got {tuple(t.shape)}")
        if t.dtype != dtype:
            raise ValueError(f"observations: {name} must be {dtype}, got {t.dtype}")
        if t.device != pos.device:
            raise ValueError(f"observations: {name} is on {t.device}, pos on {pos.device}")
        if not t.is_contiguous():
            raise ValueError(f"observations: {name} must be contiguous")
    if int(num_partners) < 1:
        raise ValueError(f"observations: num_partners must be >= 1, got {num_partners}")
    if not (partner_radius > 0 and road_radius > 0 and cell_size > 0):
        raise ValueError(
            f"observations: partner_radius, road_radius, cell_size must be > 0, got "
            f"{partner_radius}, {road_radius}, {cell_size}"
        )
    if A > 2**16 or K > 2**16:
        raise ValueError(f"observations: A = {A} and K = {K} must be <= 65536 (sort keys hold the index)")
    lay = obs_layout(num_partners, K)
    if out is not None:
        if tuple(out.shape) != (W, C, lay.obs_dim) or out.dtype != torch.float32 or out.device != pos.device:
            raise ValueError(
                f"observations: out must be float32 [W, C, D] = {(W, C, lay.obs_dim)} on {pos.device}, "
                f"got {out.dtype} {tuple(out.shape)} on {out.device}"
            )
        if not out.is_contiguous():
            raise ValueError("observations: out must be contiguous")
    if rows is not None:
        if out is None:
            raise ValueError("observations: rows needs out (the slots not listed are left as they are in out)")
        if not isinstance(rows, torch.Tensor) or rows.dim() != 1 or rows.dtype != torch.int64:
            raise ValueError("observations: rows must be a 1-D int64 tensor of flat slot indices w * C + c")
        if rows.device != pos.device:
            raise ValueError(f"observations: rows is on {rows.device}, pos on {pos.device}")
    return lay


# ---------------------------------------------------------------------------------------------
# Triton kernel: one program per (world, slot). Nearest-first order = rank of the (unique) sort
# key among all candidates of the program (a BLOCK x BLOCK comparison), so no loop or sort.
# ---------------------------------------------------------------------------------------------


@triton.jit
def _observations_kernel(
    pos_ptr, heading_ptr, speed_ptr, length_ptr, width_ptr, type_ptr, present_ptr,
    goal_ptr, extra_ptr, active_ptr, scenario_ptr,
    seg_ptr, rtype_ptr, grid_ptr, origin_ptr, dims_ptr, out_ptr, rows_ptr,
    cell_size, partner_r2, inv_pr, road_r2, inv_rr, two_inv_rr,
    A: tl.constexpr, C: tl.constexpr, K: tl.constexpr, NC: tl.constexpr, R: tl.constexpr,
    P: tl.constexpr, D: tl.constexpr, EGO_DIM: tl.constexpr, NEXTRA: tl.constexpr,
    PDIM: tl.constexpr, RDIM: tl.constexpr, ABITS: tl.constexpr, RBITS: tl.constexpr,
    BLOCK_A: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_F: tl.constexpr,
    SPEED_S: tl.constexpr, SIZE_S: tl.constexpr, GOAL_S: tl.constexpr, HAS_ROWS: tl.constexpr,
):
    if HAS_ROWS:  # program i computes the listed slot rows[i]
        pid = tl.load(rows_ptr + tl.program_id(0)).to(tl.int64)
    else:
        pid = tl.program_id(0).to(tl.int64)
    w = pid // C
    c = pid % C
    out_base = out_ptr + pid * D
    ego = w * A + c
    ex = tl.load(pos_ptr + ego * 2)
    ey = tl.load(pos_ptr + ego * 2 + 1)
    h = tl.load(heading_ptr + ego)
    ec = tl.cos(h)
    es = tl.sin(h)
    act_i = (tl.load(active_ptr + pid) != 0).to(tl.int32)
    act = act_i != 0

    # ---------------------------------------------------------------- ego block
    gx = tl.load(goal_ptr + pid * 2) - ex
    gy = tl.load(goal_ptr + pid * 2 + 1) - ey
    tl.store(out_base + 0, tl.where(act, tl.load(speed_ptr + ego) / SPEED_S, 0.0))
    tl.store(out_base + 1, tl.where(act, tl.load(length_ptr + ego) / SIZE_S, 0.0))
    tl.store(out_base + 2, tl.where(act, tl.load(width_ptr + ego) / SIZE_S, 0.0))
    tl.store(out_base + 3, tl.where(act, (gx * ec + gy * es) / GOAL_S, 0.0))
    tl.store(out_base + 4, tl.where(act, (gy * ec - gx * es) / GOAL_S, 0.0))
    tl.store(out_base + 5, tl.where(act, tl.sqrt(gx * gx + gy * gy) / GOAL_S, 0.0))
    fo = tl.arange(0, BLOCK_F)
    em = fo < NEXTRA
    extra = tl.load(extra_ptr + pid * NEXTRA + fo, mask=em, other=0.0)
    tl.store(out_base + (EGO_DIM - NEXTRA) + fo, tl.where(act, extra, 0.0), mask=em)

    # ---------------------------------------------------------------- partners
    ao = tl.arange(0, BLOCK_A)
    am = ao < A
    arow = w * A + ao
    px = tl.load(pos_ptr + arow * 2, mask=am, other=0.0)
    py = tl.load(pos_ptr + arow * 2 + 1, mask=am, other=0.0)
    pres = tl.load(present_ptr + arow, mask=am, other=0) != 0
    rx = px - ex
    ry = py - ey
    d2 = rx * rx + ry * ry
    # (vector & scalar-bool gives uint8 in the interpreter: broadcast the flag as a vector)
    ok = am & pres & (ao != c) & ((ao * 0 + act_i) != 0) & (d2 <= partner_r2)
    bits = tl.where(ok, d2, float("inf")).to(tl.int32, bitcast=True)
    key = (bits & ~((1 << ABITS) - 1)) | ao
    key = tl.where(am, key, 0x7FFFFFFF)
    rank = tl.sum((key[None, :] < key[:, None]).to(tl.int32), axis=1)
    put = ok & (rank < P)
    ph = tl.load(heading_ptr + arow, mask=am, other=0.0)
    pc = tl.cos(ph)
    ps = tl.sin(ph)
    ptype = tl.load(type_ptr + arow, mask=am, other=-1).to(tl.int32)
    pdst = out_base + EGO_DIM + rank.to(tl.int64) * PDIM
    tl.store(pdst + 0, (rx * ec + ry * es) * inv_pr, mask=put)
    tl.store(pdst + 1, (ry * ec - rx * es) * inv_pr, mask=put)
    tl.store(pdst + 2, pc * ec + ps * es, mask=put)
    tl.store(pdst + 3, ps * ec - pc * es, mask=put)
    tl.store(pdst + 4, tl.load(speed_ptr + arow, mask=am, other=0.0) / SPEED_S, mask=put)
    tl.store(pdst + 5, tl.load(length_ptr + arow, mask=am, other=0.0) / SIZE_S, mask=put)
    tl.store(pdst + 6, tl.load(width_ptr + arow, mask=am, other=0.0) / SIZE_S, mask=put)
    tl.store(pdst + 7, (ptype == 0).to(tl.float32), mask=put)
    tl.store(pdst + 8, (ptype == 1).to(tl.float32), mask=put)
    tl.store(pdst + 9, (ptype == 2).to(tl.float32), mask=put)
    tl.store(pdst + 10, tl.full([BLOCK_A], 1.0, tl.float32), mask=put)
    n_ok = tl.sum(ok.to(tl.int32), axis=0)
    qo = tl.arange(0, BLOCK_P)
    pad = (qo[:, None] < P) & (qo[:, None] >= n_ok) & (fo[None, :] < PDIM)
    tl.store(out_base + EGO_DIM + qo[:, None] * PDIM + fo[None, :], tl.zeros([BLOCK_P, BLOCK_F], tl.float32), mask=pad)

    # ---------------------------------------------------------------- roads
    s = tl.load(scenario_ptr + w)
    ox = tl.load(origin_ptr + s * 2)
    oy = tl.load(origin_ptr + s * 2 + 1)
    nx = tl.load(dims_ptr + s * 2).to(tl.int64)
    ny = tl.load(dims_ptr + s * 2 + 1).to(tl.int64)
    fx = (ex - ox) / cell_size
    fy = (ey - oy) / cell_size
    fx = tl.where(fx != fx, 0.0, fx)  # NaN -> cell 0 (as gpusim.kernels.grid.cell_index)
    fy = tl.where(fy != fy, 0.0, fy)
    fx = tl.minimum(tl.maximum(fx, -1e9), 1e9)
    fy = tl.minimum(tl.maximum(fy, -1e9), 1e9)
    ix = tl.minimum(tl.maximum(tl.floor(fx).to(tl.int64), 0), nx - 1)
    iy = tl.minimum(tl.maximum(tl.floor(fy).to(tl.int64), 0), ny - 1)
    cell = iy * nx + ix
    ko = tl.arange(0, BLOCK_K)
    km = ko < K
    cand = tl.load(grid_ptr + (s * NC + cell) * K + ko, mask=km, other=-1)
    has = km & (cand >= 0)
    g = s * R + tl.where(has, cand, 0).to(tl.int64)
    x0 = tl.load(seg_ptr + g * 4 + 0, mask=has, other=0.0)
    y0 = tl.load(seg_ptr + g * 4 + 1, mask=has, other=0.0)
    x1 = tl.load(seg_ptr + g * 4 + 2, mask=has, other=0.0)
    y1 = tl.load(seg_ptr + g * 4 + 3, mask=has, other=0.0)
    dx = x1 - x0
    dy = y1 - y0
    seg_len = tl.sqrt(dx * dx + dy * dy)
    nz = seg_len > 0
    inv = 1.0 / tl.where(nz, seg_len, 1.0)
    ux = tl.where(nz, dx * inv, 1.0)
    uy = tl.where(nz, dy * inv, 0.0)
    half = 0.5 * seg_len
    mx = 0.5 * (x0 + x1)
    my = 0.5 * (y0 + y1)
    # point-to-segment distance as _segment_d2: exact endpoint arithmetic outside the segment
    q0x = ex - x0
    q0y = ey - y0
    along = q0x * ux + q0y * uy
    perp = q0x * uy - q0y * ux
    before = along <= 0.0
    cx = tl.where(before, q0x, ex - x1)
    cy = tl.where(before, q0y, ey - y1)
    rd2 = tl.where(before | (along >= seg_len), cx * cx + cy * cy, perp * perp)
    rok = has & ((ko * 0 + act_i) != 0) & (rd2 <= road_r2)
    rbits = tl.where(rok, rd2, float("inf")).to(tl.int32, bitcast=True)
    rkey = (rbits & ~((1 << RBITS) - 1)) | ko
    rkey = tl.where(km, rkey, 0x7FFFFFFF)
    rrank = tl.sum((rkey[None, :] < rkey[:, None]).to(tl.int32), axis=1)
    rt = tl.load(rtype_ptr + g, mask=has, other=-1).to(tl.int32)
    grp = tl.where((rt >= 0) & (rt < 3), rt, 3)
    mrx = mx - ex
    mry = my - ey
    rdst = out_base + (EGO_DIM + P * PDIM) + rrank.to(tl.int64) * RDIM
    tl.store(rdst + 0, (mrx * ec + mry * es) * inv_rr, mask=rok)
    tl.store(rdst + 1, (mry * ec - mrx * es) * inv_rr, mask=rok)
    tl.store(rdst + 2, half * two_inv_rr, mask=rok)
    tl.store(rdst + 3, ux * ec + uy * es, mask=rok)
    tl.store(rdst + 4, uy * ec - ux * es, mask=rok)
    tl.store(rdst + 5, (grp == 0).to(tl.float32), mask=rok)
    tl.store(rdst + 6, (grp == 1).to(tl.float32), mask=rok)
    tl.store(rdst + 7, (grp == 2).to(tl.float32), mask=rok)
    tl.store(rdst + 8, (grp == 3).to(tl.float32), mask=rok)
    tl.store(rdst + 9, tl.full([BLOCK_K], 1.0, tl.float32), mask=rok)
    n_rok = tl.sum(rok.to(tl.int32), axis=0)
    rpad = (ko[:, None] >= n_rok) & km[:, None] & (fo[None, :] < RDIM)
    tl.store(
        out_base + (EGO_DIM + P * PDIM) + ko[:, None] * RDIM + fo[None, :],
        tl.zeros([BLOCK_K, BLOCK_F], tl.float32),
        mask=rpad,
    )


def _observations_triton(
    pos, heading, speed, length, width, agent_type, present, goal, ego_extra, ego_active, scenario,
    road_seg, road_type, grid_road, grid_origin, grid_dims, cell_size, num_partners, partner_radius,
    road_radius, out=None, rows=None,
):
    """Launcher of :func:`_observations_kernel` (same arguments and result as the reference)."""
    lay = _check_inputs(
        pos, heading, speed, length, width, agent_type, present, goal, ego_extra, ego_active, scenario,
        road_seg, road_type, grid_road, grid_origin, grid_dims, cell_size, num_partners, partner_radius,
        road_radius, out, rows,
    )
    W, A = heading.shape
    C = goal.shape[1]
    S, NC, K = grid_road.shape
    R = road_seg.shape[1]
    if lay.partner_dim > 16 or lay.road_dim > 16 or len(EGO_EXTRA) > 16:
        raise ValueError("observations: feature blocks wider than 16 need a larger BLOCK_F")
    obs = out if out is not None else torch.empty(W, C, lay.obs_dim, device=pos.device, dtype=torch.float32)
    n_prog = W * C if rows is None else rows.numel()
    if n_prog == 0:
        return obs
    _observations_kernel[(n_prog,)](
        pos, heading, speed, length, width, agent_type, present.view(torch.uint8),
        goal, ego_extra, ego_active.view(torch.uint8), scenario,
        road_seg, road_type, grid_road, grid_origin, grid_dims, obs, obs if rows is None else rows,
        float(cell_size), float(partner_radius) ** 2, 1.0 / float(partner_radius), float(road_radius) ** 2,
        1.0 / float(road_radius), 2.0 / float(road_radius),
        A=A, C=C, K=K, NC=NC, R=R, P=lay.num_partners, D=lay.obs_dim, EGO_DIM=lay.ego_dim,
        NEXTRA=len(EGO_EXTRA), PDIM=lay.partner_dim, RDIM=lay.road_dim, ABITS=_index_bits(A),
        RBITS=_index_bits(K), BLOCK_A=triton.next_power_of_2(A), BLOCK_K=triton.next_power_of_2(K),
        BLOCK_P=triton.next_power_of_2(lay.num_partners), BLOCK_F=16,
        SPEED_S=SPEED_SCALE, SIZE_S=SIZE_SCALE, GOAL_S=GOAL_SCALE, HAS_ROWS=rows is not None,
        num_warps=4,
    )
    return obs


def observations(
    pos, heading, speed, length, width, agent_type, present, goal, ego_extra, ego_active, scenario,
    road_seg, road_type, grid_road, grid_origin, grid_dims, cell_size, num_partners, partner_radius,
    road_radius, out=None, rows=None,
):
    if backend_for(pos) == "triton":
        return _observations_triton(
            pos, heading, speed, length, width, agent_type, present, goal, ego_extra, ego_active, scenario,
            road_seg, road_type, grid_road, grid_origin, grid_dims, cell_size, num_partners, partner_radius,
            road_radius, out, rows,
        )
    return observations_reference(
        pos, heading, speed, length, width, agent_type, present, goal, ego_extra, ego_active, scenario,
        road_seg, road_type, grid_road, grid_origin, grid_dims, cell_size, num_partners, partner_radius,
        road_radius, out, rows,
    )


observations.__doc__ = observations_reference.__doc__
