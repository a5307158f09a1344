"""Torch reference of the observations (CPU, and the oracle of the Triton kernel).

:func:`observe_features` computes the feature columns; :func:`observe_block` writes them into a
block of rows (:func:`observations_reference` runs it on the requested rows).
"""

from __future__ import annotations

import torch
from einops import rearrange

from gpusim.kernels.grid import cell_index, grid_table_rows
from gpusim.kernels.obs_layout import GOAL_SCALE, kernel_layout
from gpusim.kernels.observations.tables import (
    AGENT_COLS,
    GEO_COLS,
    INF_BITS,
    ROAD_COLS,
    agent_table,
    check_inputs,
    index_bits,
    live_rows,
    road_table,
    segment_d2,
    sort_key,
)

#: Slot rows per block of the CPU reference: with K = 128 about 64K road candidates, so the
#: per-candidate intermediates of a block stay in the CPU cache.
BLOCK_CANDIDATES = 65536


def observe_features(
    *, rows, agent_tab, geo, feat, pos, present, goal2, extra2, scenario, grid2, grid_start, grid_origin, grid_dims,
    C: int, P: int, R: int, cell_size: float, partner_radius: float, road_radius: float,
) -> tuple[list, list, list]:
    """The one computation of both CPU paths: the feature columns of the in-play slot rows ``rows``
    [n] int64 (flat ``w * C + c``), before they are laid out.

    ``agent_tab`` is :func:`agent_table`, ``(geo, feat)`` is :func:`road_table`; ``goal2`` [W*C, 2],
    ``extra2`` [W*C, 5] are flat views of the inputs of
    :func:`gpusim.kernels.observations.observations`, ``grid2`` [rows, K] the grid table with
    ``grid_start`` [S] int64 the first row of each scenario (``gpusim.kernels.grid.grid_table_rows``); ``P`` partner slots, ``R`` segments per
    scenario, radii and cell size in metres.

    Returns:
        ``(ego, partners, roads)``: lists of float32 columns in feature order, each either one
        feature (``[n]``, ``[n, kp]``, ``[n, K]``) or several (a trailing feature axis): the ego
        block [n, 11], the first ``kp = min(P, A)`` partner slots [n, kp, 11] (the caller pads to
        P with zeros), the road slots [n, K, 10]. :func:`observe_block` writes them into a block.
    """
    W, A = present.shape
    K = grid2.shape[1]
    n = rows.shape[0]
    w = torch.div(rows, C, rounding_mode="floor")
    c = rows - w * C

    # ---------------------------------------------------------------- ego block [n, 11]
    e = agent_tab.index_select(0, w * A + c)  # [n, 12]
    ex, ey, ec, es = e[:, 0:1], e[:, 1:2], e[:, 2:3], e[:, 3:4]  # [n, 1]
    gl = goal2.index_select(0, rows)
    gx, gy = gl[:, 0:1] - ex, gl[:, 1:2] - ey
    ego = [e[:, 4:7], (gx * ec + gy * es) / GOAL_SCALE, (gy * ec - gx * es) / GOAL_SCALE,
           torch.sqrt(gx * gx + gy * gy) / GOAL_SCALE, extra2.index_select(0, rows)]

    # ---------------------------------------------------------------- partners [n, kp, 11]
    pw = rearrange(pos.index_select(0, w), "n a xy -> xy n a")  # [2, n, A]
    rx, ry = pw[0] - ex, pw[1] - ey
    d2 = rx * rx + ry * ry
    ok = (present.index_select(0, w) & (torch.arange(A, device=pos.device)[None, :] != c[:, None])
          & (d2 <= partner_radius * partner_radius))
    kp = min(P, A)
    abits = index_bits(A)
    top = torch.topk(sort_key(d2, ok, abits), kp, dim=-1, largest=False, sorted=True).values  # [n, kp]
    prow = torch.where(top < INF_BITS, (top & ((1 << abits) - 1)) + (w * A)[:, None], agent_tab.shape[0] - 1)
    g = agent_tab.index_select(0, prow.view(-1)).view(n, kp, AGENT_COLS)
    one = g[..., 10]
    px, py = g[..., 0] - ex * one, g[..., 1] - ey * one  # zero on padding rows
    pc, ps = g[..., 2], g[..., 3]
    inv_pr = 1.0 / partner_radius
    partners = [(px * ec + py * es) * inv_pr, (py * ec - px * es) * inv_pr, pc * ec + ps * es, ps * ec - pc * es,
                g[..., 4:11]]

    # ---------------------------------------------------------------- roads [n, K, 10]
    s = scenario.index_select(0, w)  # [n] int64
    cell = cell_index(e[:, None, 0:2], s, grid_origin, grid_dims, cell_size)[:, 0]  # [n]
    cand = grid2.index_select(0, grid_start.index_select(0, s) + cell).to(torch.int32)  # [n, K] int32
    far = geo.shape[0] - 2
    gidx = torch.where(cand >= 0, cand + (s * R).to(torch.int32)[:, None], far)  # [n, K] int32
    g = geo.index_select(0, gidx.view(-1)).view(n, K, GEO_COLS)
    rd2 = segment_d2(ex, ey, g[..., 0], g[..., 1], g[..., 2], g[..., 3], g[..., 4], g[..., 5], g[..., 6])
    rbits = index_bits(K)
    rkey = torch.sort(sort_key(rd2, rd2 <= road_radius * road_radius, rbits), dim=-1).values  # [n, K]
    order = (rkey & ((1 << rbits) - 1)).to(torch.int64)
    srow = torch.where(rkey < INF_BITS, torch.gather(gidx, 1, order), far + 1)  # invalid -> zero row
    g = feat.index_select(0, srow.view(-1)).view(n, K, ROAD_COLS)
    one = g[..., 9]
    mx, my = g[..., 0] - ex * one, g[..., 1] - ey * one  # zero on padding rows
    ux, uy = g[..., 2], g[..., 3]
    inv_rr = 1.0 / road_radius
    roads = [(mx * ec + my * es) * inv_rr, (my * ec - mx * es) * inv_rr, g[..., 4] * (2.0 * inv_rr),
             ux * ec + uy * es, uy * ec - ux * es, g[..., 5:]]
    return ego, partners, roads


def _write_columns(dst: torch.Tensor, cols: list) -> None:
    """Write feature columns (see :func:`observe_features`) side by side into ``dst`` [..., F]."""
    j = 0
    for col in cols:
        if col.dim() == dst.dim():
            dst[..., j : j + col.shape[-1]] = col
            j += col.shape[-1]
        else:
            dst[..., j] = col
            j += 1


def observe_block(**kw) -> torch.Tensor:
    """Eager layout of :func:`observe_features` (same keyword arguments): the [n, D] float32
    observations of ``rows``, written column by column into one block through views (no
    intermediate concatenations, which would copy the road block twice more)."""
    ego, partners, roads = observe_features(**kw)
    n, P, K = kw["rows"].shape[0], kw["P"], kw["grid2"].shape[1]
    lay = kernel_layout(P, K)
    kp = partners[0].shape[1]
    blk = torch.empty(n, lay.obs_dim, device=kw["pos"].device, dtype=torch.float32)
    _write_columns(blk[:, lay.ego], ego)
    part = rearrange(blk[:, lay.partners], "n (p f) -> n p f", p=P)  # a view: writes land in blk
    _write_columns(part[:, :kp], partners)
    if kp < P:
        part[:, kp:] = 0.0
    _write_columns(rearrange(blk[:, lay.roads], "n (k f) -> n k f", k=K), roads)
    return blk


def block_arguments(*, pos, heading, speed, length, width, agent_type, present, goal, ego_extra, scenario,
                    road_seg, road_type, grid_road, grid_origin, grid_dims, cell_size, num_partners,
                    partner_radius, road_radius, grid_start=None) -> dict:
    """The keyword arguments of :func:`observe_block` but ``rows``: the per-agent table, the cached
    road tables and flat views of the inputs."""
    W, C = goal.shape[:2]
    grid2, start = grid_table_rows(grid_road, grid_start, "observations: grid_road")
    geo, feat = road_table(road_seg, road_type)
    return dict(
        agent_tab=agent_table(pos, heading, speed, length, width, agent_type),
        geo=geo,
        feat=feat,
        pos=pos,
        present=present,
        goal2=goal.view(W * C, 2),
        extra2=ego_extra.view(W * C, -1),
        scenario=scenario,
        grid2=grid2,
        grid_start=start,
        grid_origin=grid_origin,
        grid_dims=grid_dims,
        C=C,
        P=int(num_partners),
        R=road_seg.shape[1],
        cell_size=float(cell_size),
        partner_radius=float(partner_radius),
        road_radius=float(road_radius),
    )


def observations_reference(
    pos, heading, speed, length, width, agent_type, present, goal, ego_extra, ego_active, scenario,
    road_seg, road_type, grid_road, grid_origin, grid_dims, cell_size, num_partners, partner_radius,
    road_radius, out=None, rows=None, grid_start=None, written=None,
):
    """Torch reference of :func:`gpusim.kernels.observations.observations` (same arguments, result
    and errors; the full docstring is there). Slot rows are computed in blocks of about
    :data:`BLOCK_CANDIDATES` candidates by :func:`observe_block`."""
    inputs = dict(
        pos=pos, heading=heading, speed=speed, length=length, width=width, agent_type=agent_type,
        present=present, goal=goal, ego_extra=ego_extra, scenario=scenario, road_seg=road_seg,
        road_type=road_type, grid_road=grid_road, grid_origin=grid_origin, grid_dims=grid_dims,
        cell_size=cell_size, num_partners=num_partners, partner_radius=partner_radius,
        road_radius=road_radius, grid_start=grid_start,
    )
    lay = check_inputs(**inputs, ego_active=ego_active, out=out, rows=rows, written=written)
    W, A = heading.shape
    C = goal.shape[1]
    if written is not None:  # the rows that can change: in play now, or written before
        rows = (ego_active.reshape(-1) | written.reshape(-1)).nonzero().squeeze(1)
    obs = out if out is not None else torch.empty(W, C, lay.obs_dim, device=pos.device, dtype=torch.float32)
    obs2d = obs.view(W * C, lay.obs_dim)
    live = live_rows(obs2d, ego_active.view(W * C), rows)
    n_live = live.numel()
    if n_live == 0:
        return obs
    args = block_arguments(**inputs)
    K = grid_road.shape[-1]
    block = n_live if pos.is_cuda else max(1, BLOCK_CANDIDATES // max(K, A, 1))
    for r0 in range(0, n_live, block):
        r = live[r0 : r0 + block]
        obs2d.index_copy_(0, r, observe_block(rows=r, **args))
    return obs
