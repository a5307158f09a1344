"""Mirror-image scenes: a scenario reflected across the y axis (``x -> -x``), a training randomisation.

:func:`mirror_pack` reflects every scenario of a :class:`~gpusim.data.pack.ScenarioPack`:

* positions (logged trajectories, goals, road-segment end points, signal stop points, the
  centring offset): ``(x, y) -> (-x, y)``;
* headings ``theta -> pi - theta`` (wrapped to ``(-pi, pi]``), velocities and the signals' lane
  directions ``(vx, vy) -> (-vx, vy)``; box sizes, types, validity and signal states unchanged;
* the road grid: the reflected grid covers the reflected box (origin
  ``x0 -> -(x0 + nx * cell_size)``) and cell ``(ix, iy)`` takes the segment list of cell
  ``(nx - 1 - ix, iy)`` (a reflection keeps every distance, so the nearest segments of a cell
  centre are those of its image). Segments keep their index and their point order.

Consequences (docs/training.md "Generalisation options"): a reflection turns left into right, so
every turn and every yaw rate changes sign and **traffic drives on the left**. A lane keeps its
point order, so its direction of travel is reflected with it (a lane that went +x goes -x);
a signal keeps its lane, its states and its stop line (perpendicular to the reflected lane
direction through the reflected stop point). Road edges are tested without orientation
(``gpusim/kernels/offroad.py``), so nothing else changes. Mirroring twice gives back the scene
(positions and velocities bit for bit, headings and the grid origin to float32 rounding).

:func:`with_mirrored_copies` appends the mirrored copy of every scenario (ids suffixed with
:data:`MIRROR_SUFFIX`), so a uniform scenario draw runs a mirrored scene with probability 1/2
per world per episode; :func:`training_pack` is the env's hook (``EnvConfig.mirror``). It is a
training randomisation only: evaluation drops it (``train/settings.py``), and behaviour
cloning and WOSAC data never use it (WOSAC scores traffic against the real, right-hand log).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from gpusim.data.layout import cell_counts
from gpusim.data.pack import ScenarioPack

#: Suffix of the scenario id of a mirrored copy (``with_mirrored_copies``).
MIRROR_SUFFIX = "#mirror"


def mirror_heading(theta: torch.Tensor) -> torch.Tensor:
    """``pi - theta`` wrapped to ``(-pi, pi]`` (the heading of the reflected direction): any shape,
    float, radians."""
    out = torch.remainder(math.pi - theta + math.pi, 2 * math.pi) - math.pi
    return torch.where(out == -math.pi, torch.full_like(out, math.pi), out)


def _flip_x(t: torch.Tensor) -> torch.Tensor:
    """``t`` [..., 2k] with every even column (an x) negated."""
    sign = torch.ones(t.shape[-1], dtype=t.dtype, device=t.device)
    sign[0::2] = -1
    return t * sign


def _mirrored_grid_rows(pack: ScenarioPack) -> torch.Tensor:
    """[NCT] int64: row ``r`` of the mirrored compact grid tables is row ``index[r]`` of ``pack``'s
    (cell ``(ix, iy)`` of a scenario takes cell ``(nx - 1 - ix, iy)``)."""
    counts = cell_counts(pack.grid_dims)
    dev = pack.grid_start.device
    owner = torch.repeat_interleave(torch.arange(counts.numel(), device=dev), counts)
    start = pack.grid_start.to(torch.int64).index_select(0, owner)
    nx = pack.grid_dims[:, 0].to(torch.int64).index_select(0, owner)
    cell = torch.arange(owner.numel(), device=dev) - start
    iy, ix = cell // nx, cell % nx
    return start + iy * nx + (nx - 1 - ix)


def mirror_pack(pack: ScenarioPack) -> ScenarioPack:
    """Every scenario of ``pack`` reflected across the y axis (module docstring): a new compact
    pack on ``pack``'s device, same shapes, dtypes, ids and config.

    Raises:
        ValueError: what :meth:`ScenarioPack.compact` raises for a broken grid table.
    """
    p = pack.compact()
    rows = _mirrored_grid_rows(p)
    cs = float(p.cell_size)
    origin = p.grid_origin.clone()
    x0 = p.grid_origin[:, 0].to(torch.float64)
    origin[:, 0] = (-(x0 + p.grid_dims[:, 0].to(torch.float64) * cs)).to(origin.dtype)
    changes = {
        "offset": _flip_x(p.offset),
        "traj_pos": _flip_x(p.traj_pos),
        "traj_heading": mirror_heading(p.traj_heading),
        "traj_vel": _flip_x(p.traj_vel),
        "agent_goal": _flip_x(p.agent_goal),
        "road_seg": _flip_x(p.road_seg),
        "grid_origin": origin,
        "grid_road": p.grid_road.index_select(0, rows),
        "grid_edge": p.grid_edge.index_select(0, rows),
        "signal_pos": _flip_x(p.signal_pos),
        "signal_dir": _flip_x(p.signal_dir),
    }
    return dataclasses.replace(p, stats=dict(p.stats), **changes)


def with_mirrored_copies(pack: ScenarioPack) -> ScenarioPack:
    """``pack``'s S scenarios followed by their S mirrored copies (ids ``<id>`` + :data:`MIRROR_SUFFIX`):
    a compact pack of 2S scenarios on ``pack``'s device.

    Raises:
        ValueError: as :func:`mirror_pack`.
    """
    from gpusim.data.shards import concat_packs

    mirrored = mirror_pack(pack)
    mirrored.scenario_ids = [f"{i}{MIRROR_SUFFIX}" for i in mirrored.scenario_ids]
    both = concat_packs([pack, mirrored])
    both.path = pack.path
    return both


def training_pack(pack: ScenarioPack, config) -> ScenarioPack:
    """The pack an env with ``config`` (an :class:`~gpusim.config.EnvConfig`) draws its scenes
    from: :func:`with_mirrored_copies` when ``config.mirror`` is set, else ``pack`` itself."""
    return with_mirrored_copies(pack) if getattr(config, "mirror", False) else pack
