"""Cell lookup in the per-scenario nearest-segment grid, written once for both backends: the torch
:func:`cell_index_reference` and the ``@triton.jit`` device function :func:`cell_index_jit` that
the observation, offroad and new-goal Triton kernels call (so no kernel repeats the arithmetic).

The grid of scenario ``s`` has ``grid_dims[s] = (nx, ny)`` square cells of edge ``cell_size``
metres whose lower-left corner is ``grid_origin[s]``. Cell ``(ix, iy)`` has id ``iy * nx + ix``.
Positions outside the grid are clamped to the nearest border cell.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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


@triton.jit
def cell_index_jit(x, y, s, origin_ptr, dims_ptr, cell_size, mask):
    """Device-side :func:`cell_index_reference`, called from other ``@triton.jit`` kernels.

    Args:
        x, y: float32 position (m), a scalar or a block.
        s: int64 scenario index (same shape as ``x`` or broadcastable).
        origin_ptr: pointer to the [S, 2] float32 grid origins; dims_ptr: to the [S, 2] int32
            cell counts.
        cell_size: cell edge (m), a float32 scalar.
        mask: bool, lanes whose grid row is loaded (others behave as a 1 x 1 grid at the origin).

    Returns:
        int64 cell id ``iy * nx + ix`` (clamped to the border cells; NaN maps to cell 0), with the
        same float32 operations, in the same order, as the reference.
    """
    ox = tl.load(origin_ptr + 2 * s, mask=mask, other=0.0)
    oy = tl.load(origin_ptr + 2 * s + 1, mask=mask, other=0.0)
    nx = tl.load(dims_ptr + 2 * s, mask=mask, other=1).to(tl.int64)
    ny = tl.load(dims_ptr + 2 * s + 1, mask=mask, other=1).to(tl.int64)
    fx = (x - ox) / cell_size
    fy = (y - oy) / cell_size
    fx = tl.where(fx != fx, 0.0, fx)  # NaN -> 0 (nan_to_num)
    fy = tl.where(fy != fy, 0.0, fy)
    fx = tl.minimum(tl.maximum(fx, -1e9), 1e9)
    fy = tl.minimum(tl.maximum(fy, -1e9), 1e9)
    ix = tl.minimum(tl.maximum(tl.floor(fx).to(tl.int64), 0), nx - 1)
    iy = tl.minimum(tl.maximum(tl.floor(fy).to(tl.int64), 0), ny - 1)
    return iy * nx + ix


def cell_index(pos, scenario, grid_origin, grid_dims, cell_size):
    """Public entry: see :func:`cell_index_reference` (a gather helper used inside other kernels,
    with no launch of its own; Triton kernels call :func:`cell_index_jit`)."""
    return cell_index_reference(pos, scenario, grid_origin, grid_dims, cell_size)


def grid_table_rows(table: torch.Tensor, grid_start: torch.Tensor | None, name: str = "grid table"):
    """Flat view of a nearest-segment table and the first row of each scenario in it.

    Two layouts (``gpusim.data.layout``): padded ``[S, NC, K]`` int32 with ``grid_start=None``
    (row of cell ``c`` of scenario ``s``: ``s * NC + c``), or compact ``[NCT, K]`` int16/int32
    with ``grid_start`` [S] int64 (row ``grid_start[s] + c``).

    Returns:
        ``(table2d [rows, K], start [S] int64)`` on the table's device (``start`` is allocated for
        the padded layout).

    Raises:
        ValueError: naming ``name``: wrong rank or dtype, a 2-D table without ``grid_start``.
    """
    if table.dtype not in (torch.int16, torch.int32):
        raise ValueError(f"{name} must be int16 or int32, got {table.dtype}")
    if table.dim() == 3:
        if grid_start is not None:
            raise ValueError(f"{name}: a padded [S, NC, K] table takes no grid_start")
        S, NC, K = table.shape
        return table.reshape(S * NC, K), torch.arange(S, device=table.device, dtype=torch.int64) * NC
    if table.dim() != 2 or grid_start is None:
        raise ValueError(f"{name} must be [S, NC, K], or [NCT, K] with grid_start [S]; got {tuple(table.shape)}")
    if grid_start.dtype != torch.int64 or grid_start.dim() != 1 or grid_start.device != table.device:
        raise ValueError(f"{name}: grid_start must be a 1-D int64 tensor on {table.device}")
    return table, grid_start
