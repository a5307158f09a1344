"""Cell lookup in the per-scenario nearest-segment grid (shared by the observation and offroad
kernels).

The grid of scenario ``s`` has ``grid_dims[s] = (nx, ny)`` square cells of edge ``cell_size``
metres whose lower-left corner is ``grid_origin[s]``. Cell ``(ix, iy)`` has id ``iy * nx + ix``.
Positions outside the grid are clamped to the nearest border cell.
"""

from __future__ import annotations

import torch


def cell_index_reference(
    pos: torch.Tensor,
    scenario: torch.Tensor,
    grid_origin: torch.Tensor,
    grid_dims: torch.Tensor,
    cell_size: float,
) -> torch.Tensor:
    """Cell id of each position.

    Args:
        pos: [W, A, 2] float32 positions (m, scenario-centred frame).
        scenario: [W] int64 scenario index of each world.
        grid_origin: [S, 2] float32 lower-left corner of cell (0, 0) (m).
        grid_dims: [S, 2] int32 cells along x and y.
        cell_size: cell edge (m).

    Returns:
        [W, A] int64 cell ids in ``[0, nx * ny)`` of each world's scenario (clamped at borders;
        NaN positions map to cell 0).
    """
    origin = grid_origin[scenario][:, None, :]  # [W, 1, 2]
    dims = grid_dims[scenario].to(torch.int64)[:, None, :]  # [W, 1, 2]
    rel = torch.nan_to_num((pos - origin) / cell_size, nan=0.0, posinf=1e9, neginf=-1e9)
    ij = torch.floor(rel.clamp(-1e9, 1e9)).to(torch.int64)
    ij = torch.minimum(ij.clamp_min(0), dims - 1)
    return ij[..., 1] * dims[..., 0] + ij[..., 0]


def cell_index(pos, scenario, grid_origin, grid_dims, cell_size):
    """Public entry: see :func:`cell_index_reference` (a gather helper used inside other kernels;
    it has no kernel of its own — the Triton observation and offroad kernels inline the same
    arithmetic)."""
    return cell_index_reference(pos, scenario, grid_origin, grid_dims, cell_size)
