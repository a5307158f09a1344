"""Launcher of the observation Triton kernel (:mod:`.kernel`): checks, allocation, grid."""

from __future__ import annotations

import torch
import triton

from gpusim.kernels.grid import grid_table_rows
from gpusim.kernels.obs_layout import EGO_EXTRA, GOAL_SCALE, SIZE_SCALE, SPEED_SCALE
from gpusim.kernels.observations.kernel import observations_kernel
from gpusim.kernels.observations.tables import check_inputs, index_bits

#: Feature lanes per program (partner, road and extra-ego blocks must fit).
BLOCK_F = 16


def observations_triton(
    pos, heading, speed, length, width, agent_type, present, goal, ego_extra, ego_active, scenario,
    road_seg, road_type, grid_road, grid_origin, grid_dims, cell_size, num_partners, partner_radius,
    road_radius, out=None, rows=None, grid_start=None, written=None,
):
    """Triton implementation of :func:`gpusim.kernels.observations.observations` (same arguments,
    result and errors; one program per slot, or per listed row with ``rows``)."""
    lay = check_inputs(
        pos=pos, heading=heading, speed=speed, length=length, width=width, agent_type=agent_type,
        present=present, goal=goal, ego_extra=ego_extra, ego_active=ego_active, scenario=scenario,
        road_seg=road_seg, road_type=road_type, grid_road=grid_road, grid_origin=grid_origin,
        grid_dims=grid_dims, cell_size=cell_size, num_partners=num_partners,
        partner_radius=partner_radius, road_radius=road_radius, out=out, rows=rows, grid_start=grid_start,
        written=written,
    )
    grid2, start = grid_table_rows(grid_road, grid_start, "observations: grid_road")
    W, A = heading.shape
    C = goal.shape[1]
    K = grid_road.shape[-1]
    R = road_seg.shape[1]
    if max(lay.partner_dim, lay.road_dim, len(EGO_EXTRA)) > BLOCK_F:
        raise ValueError(f"observations: feature blocks wider than {BLOCK_F} need a larger BLOCK_F")
    obs = out if out is not None else torch.empty(W, C, lay.obs_dim, device=pos.device, dtype=torch.float32)
    n_prog = W * C if rows is None else rows.numel()
    if n_prog == 0:
        return obs
    observations_kernel[(n_prog,)](
        pos_ptr=pos,
        heading_ptr=heading,
        speed_ptr=speed,
        length_ptr=length,
        width_ptr=width,
        type_ptr=agent_type,
        present_ptr=present.view(torch.uint8),
        goal_ptr=goal,
        extra_ptr=ego_extra,
        active_ptr=ego_active.view(torch.uint8),
        scenario_ptr=scenario,
        seg_ptr=road_seg,
        rtype_ptr=road_type,
        grid_ptr=grid2,
        start_ptr=start,
        origin_ptr=grid_origin,
        dims_ptr=grid_dims,
        out_ptr=obs,
        rows_ptr=obs if rows is None else rows,  # unused without rows
        written_ptr=obs if written is None else written.view(torch.uint8),  # unused without written
        out_stride=obs.stride(1),  # row stride: out may be a column slice of a wider buffer
        cell_size=float(cell_size),
        partner_r2=float(partner_radius) ** 2,
        inv_pr=1.0 / float(partner_radius),
        road_r2=float(road_radius) ** 2,
        inv_rr=1.0 / float(road_radius),
        two_inv_rr=2.0 / float(road_radius),
        A=A,
        C=C,
        K=K,
        R=R,
        P=lay.num_partners,
        D=lay.obs_dim,
        EGO_DIM=lay.ego_dim,
        NEXTRA=len(EGO_EXTRA),
        PDIM=lay.partner_dim,
        RDIM=lay.road_dim,
        ABITS=index_bits(A),
        RBITS=index_bits(K),
        BLOCK_A=triton.next_power_of_2(A),
        BLOCK_K=triton.next_power_of_2(K),
        BLOCK_P=triton.next_power_of_2(lay.num_partners),
        BLOCK_F=BLOCK_F,
        SPEED_S=SPEED_SCALE,
        SIZE_S=SIZE_SCALE,
        GOAL_S=GOAL_SCALE,
        HAS_ROWS=rows is not None,
        HAS_WRITTEN=written is not None,
        num_warps=4,
    )
    return obs
