"""Compiled CPU path of the observations (opt-in, ``EnvConfig.compile``).

The same feature computation as the eager reference (:func:`.naive.observe_features`), laid out
functionally (:func:`.naive.observe_block_functional`) and handed to
``torch.compile`` (inductor) over blocks of a FIXED number of slot rows, so every shape is static
(``dynamic=False``) and one compiled graph serves every step of an env.
"""

from __future__ import annotations

import torch

from gpusim.kernels.observations.naive import block_arguments, observe_block_functional, padded_blocks
from gpusim.kernels.observations.tables import check_inputs, live_rows

#: Slot rows per compiled block: full blocks of the first size while that many rows remain, the
#: rest in blocks of the second size; a short last block is padded with copies of its last row
#: (their identical values are written twice). So there are two graphs, never a new shape.
COMPILED_BLOCK_ROWS = (512, 64)
_compiled_fn: list = []  # [torch.compile(_observe_block_into)], built on first use


def _observe_block_into(obs2d, rows, args):
    """:func:`observe_block_functional` scattered into ``obs2d`` [W*C, D] at ``rows`` (inside the
    compiled graph, so the block is written once, straight into the buffer)."""
    obs2d.index_copy_(0, rows, observe_block_functional(rows=rows, **args))


def observations_compiled(
    pos, heading, speed, length, width, agent_type, present, goal, ego_extra, ego_active, scenario,
    road_seg, road_type, grid_road, grid_origin, grid_dims, cell_size, num_partners, partner_radius,
    road_radius, out=None, rows=None, grid_start=None,
):
    """``torch.compile`` (inductor, CPU) version of :func:`gpusim.kernels.observations.observations`:
    same arguments, result within float32 rounding (a few 1e-7) and the same slot order.

    The in-play rows are processed in blocks of :data:`COMPILED_BLOCK_ROWS` (512, then 64 for the
    rest) with static shapes (``dynamic=False``; the last block is padded), so two graphs are
    compiled per set of input shapes and scalar arguments: the first call of a new env size
    compiles for about 10-30 s on the 2-core development machine (docs/performance.md). The sort
    and top-k stay ATen calls inside the graph; the gathers, distances, transforms and the scatter
    into ``out`` are fused. The per-agent table is built eagerly, the road tables come from the
    :func:`~gpusim.kernels.observations.road_table` cache.

    Raises:
        ValueError: as :func:`gpusim.kernels.observations.observations`.
    """
    inputs = dict(
        pos=pos, heading=heading, speed=speed, length=length, width=width, agent_type=agent_type,
        present=present, goal=goal, ego_extra=ego_extra, scenario=scenario, road_seg=road_seg,
        road_type=road_type, grid_road=grid_road, grid_origin=grid_origin, grid_dims=grid_dims,
        cell_size=cell_size, num_partners=num_partners, partner_radius=partner_radius,
        road_radius=road_radius, grid_start=grid_start,
    )
    lay = check_inputs(**inputs, ego_active=ego_active, out=out, rows=rows)
    W, C = goal.shape[:2]
    obs = out if out is not None else torch.empty(W, C, lay.obs_dim, device=pos.device, dtype=torch.float32)
    obs2d = obs.view(W * C, lay.obs_dim)
    live = live_rows(obs2d, ego_active.view(W * C), rows)
    n_live = live.numel()
    if n_live == 0:
        return obs
    if not _compiled_fn:
        _compiled_fn.append(torch.compile(_observe_block_into, dynamic=False))
    fn = _compiled_fn[0]
    args = block_arguments(**inputs)
    for r in padded_blocks(live, COMPILED_BLOCK_ROWS):
        fn(obs2d, r, args)
    return obs
