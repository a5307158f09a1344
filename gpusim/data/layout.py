"""Compact grid-table layout of a :class:`~gpusim.data.pack.ScenarioPack`.

Format 2 stored the nearest-segment tables as ``[S, NC, K]`` int32, every scenario padded to the
largest grid of the pack: 75% of a pack's bytes on the 72 shared scenarios were that padding and
the upper 16 bits of every index. The compact layout (format 3) stores the cells of all scenarios
one after the other:

* ``grid_road`` [NCT, K] and ``grid_edge`` [NCT, KE] with ``NCT = sum_s nx_s * ny_s``; the rows of
  scenario ``s`` start at ``grid_start[s]`` (int64), so cell ``c`` of ``s`` is row
  ``grid_start[s] + c``. Entries are segment indices (-1 padding), **int16** when every scenario
  has fewer than 32768 segments (always so in WOMD: at most a few thousand after simplification),
  else int32.

The kernels read ``grid_start[s] + cell`` instead of ``s * NC + cell``; the padded layout is the
special case ``grid_start[s] = s * NC`` and is still accepted by the kernels (3-D tables, no
``grid_start``), which is how tests compare the two (:func:`padded_grid`).

Functions here work on plain tensors so that :mod:`gpusim.data.pack` (and the streaming pool)
share them.
"""

from __future__ import annotations

import torch

#: Largest segment index an int16 table can hold.
INT16_MAX = 32767


def grid_dtype(max_segments: int) -> torch.dtype:
    """int16 when every segment index (< ``max_segments``) fits, else int32."""
    return torch.int16 if int(max_segments) <= INT16_MAX + 1 else torch.int32


def cell_counts(grid_dims: torch.Tensor) -> torch.Tensor:
    """[S] int64 cells per scenario (``nx * ny``) from ``grid_dims`` [S, 2] int32."""
    d = grid_dims.to(torch.int64)
    return d[:, 0] * d[:, 1]


def starts_of(counts: torch.Tensor) -> torch.Tensor:
    """[S] int64 exclusive prefix sum of ``counts`` [S] (the first row of each scenario)."""
    c = counts.to(torch.int64)
    return torch.cumsum(c, 0) - c


def flatten_grid(grid: torch.Tensor, grid_dims: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded ``[S, NC, K]`` table -> compact ``([NCT, K] dtype, grid_start [S] int64)``.

    Raises:
        ValueError: an index does not fit ``dtype``.
    """
    S, NC, K = grid.shape
    counts = cell_counts(grid_dims)
    keep = torch.arange(NC, device=grid.device)[None, :] < counts[:, None]  # [S, NC]
    flat = grid[keep]
    if flat.numel() and int(flat.max()) > torch.iinfo(dtype).max:
        raise ValueError(f"grid table index {int(flat.max())} does not fit {dtype}")
    return flat.to(dtype), starts_of(counts)


def padded_grid(flat: torch.Tensor, grid_start: torch.Tensor, grid_dims: torch.Tensor) -> torch.Tensor:
    """Compact ``[NCT, K]`` table -> the format-2 layout ``[S, NC, K]`` int32 (NC = most cells of
    any scenario, -1 padding)."""
    counts = cell_counts(grid_dims)
    S, K = counts.shape[0], flat.shape[1]
    NC = max(1, int(counts.max())) if S else 1
    out = torch.full((S, NC, K), -1, dtype=torch.int32, device=flat.device)
    keep = torch.arange(NC, device=flat.device)[None, :] < counts[:, None]
    rows = (grid_start[:, None] + torch.arange(NC, device=flat.device)[None, :])[keep]
    out[keep] = flat.index_select(0, rows).to(torch.int32)
    return out


def grid_rows(grid_start: torch.Tensor, grid_dims: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the compact tables that scenarios ``index`` [n] occupy, in that order, and their
    new ``grid_start`` [n] int64 once gathered: ``(rows [sum cells] int64, new_start [n])``."""
    counts = cell_counts(grid_dims).index_select(0, index)
    new_start = starts_of(counts)
    total = int(counts.sum())
    owner = torch.repeat_interleave(torch.arange(index.numel(), device=index.device), counts)
    within = torch.arange(total, device=index.device) - new_start.index_select(0, owner)
    rows = grid_start.index_select(0, index).index_select(0, owner) + within
    return rows, new_start
