"""Shared pieces of the observation backends: argument checks, sort keys, the cached road tables
and the per-agent table.

Used by the torch reference (:mod:`.naive`), the compiled CPU path (:mod:`.compiled`) and the
Triton launcher (:mod:`.launcher`); the semantics are documented in :mod:`gpusim.kernels.observations`.
"""

from __future__ import annotations

import weakref

import torch

from gpusim.kernels.grid import grid_table_rows
from gpusim.kernels.obs_layout import (
    EGO_EXTRA,
    NUM_OBJECT_TYPES,
    NUM_ROAD_OBS_TYPES,
    SIZE_SCALE,
    SPEED_SCALE,
    ObsLayout,
    kernel_layout,
)

#: The inputs the ego extras are built from, by name: ``name -> (shape kind, dtype, state field)``.
#: Shape kinds (W worlds, A agent slots, C policy slots): ``"WA"`` per agent slot (the first C
#: columns are read), ``"WC"`` per policy slot, ``"W"`` per world. ``state field``: the
#: :class:`~gpusim.state.EnvState` field the observe stage passes (:func:`ego_inputs`); None: an
#: input the stage computes (the trial clock), which may be None (read as 0). The torch builder
#: (:func:`ego_extra`) and the C kernel's state entry (``cpu.c``: its struct field of the same name,
#: ``cpu.OBSERVATIONS_STATE_ARGS``; argument checks ``cpu._check_state_inputs``) both take them by
#: name, so an ego feature of another state field is its ``EGO_EXTRA`` name, its entry here with its
#: column in :func:`ego_extra`, and its line in ``cpu.c``.
EGO_INPUTS = {
    "collided": ("WA", torch.bool, "collided_now"),
    "offroad": ("WA", torch.bool, "offroad_now"),
    "t_index": ("W", torch.float32, None),
    "t_time": ("W", torch.float32, None),
    "last_reward": ("WC", torch.float32, "last_reward"),
}


def ego_inputs(state, **computed) -> dict:
    """The :data:`EGO_INPUTS` of ``state`` (an :class:`~gpusim.state.EnvState`): each state field by
    its input name, the stage-computed ones from ``computed`` (``t_index``, ``t_time``: [W] float32
    or None).

    Raises:
        ValueError: ``computed`` names an input that is not stage-computed, or lacks one.
    """
    own = {n for n, (_, _, field) in EGO_INPUTS.items() if field is None}
    if set(computed) != own:
        raise ValueError(f"ego_inputs: the stage computes {sorted(own)}, got {sorted(computed)}")
    return {n: computed[n] if field is None else getattr(state, field) for n, (_, _, field) in EGO_INPUTS.items()}


def ego_extra(inputs: dict, num_slots: int) -> torch.Tensor:
    """The ego extras [W, C, len(EGO_EXTRA)] float32 from the :data:`EGO_INPUTS` ``inputs`` (by
    name), in the order of :data:`~gpusim.kernels.obs_layout.EGO_EXTRA` (the torch paths' one
    builder; ``cpu.c`` reads the same inputs in its state entry). ``num_slots``: C.

    Inputs (W worlds, A agents, C slots): ``collided``, ``offroad``: [W, A] bool (the state's
    ``*_now``; the first C columns are read); ``t_index``, ``t_time``: [W] float32 trial index and
    time in trial, or None (0); ``last_reward``: [W, C] float32.
    """
    C = int(num_slots)
    ref = next(t for n, t in inputs.items() if t is not None and EGO_INPUTS[n][0] != "W")
    zeros = torch.zeros(ref.shape[0], C, dtype=torch.float32, device=ref.device)

    def slot(name: str) -> torch.Tensor:  # input `name` per policy slot, [W, C] float32
        t, kind = inputs[name], EGO_INPUTS[name][0]
        if t is None:
            return zeros
        return t[:, None] + zeros if kind == "W" else t[:, :C].float()

    cols = {"collided": slot("collided"), "offroad": slot("offroad"), "trial_index": slot("t_index"),
            "time_in_trial": slot("t_time"), "last_reward": slot("last_reward")}
    return torch.stack([cols[name] for name in EGO_EXTRA], dim=-1)


#: int32 bit pattern of float32 +inf: sort keys at or above it are invalid candidates.
INF_BITS = 0x7F800000
#: Midpoint of the "far" padding row of the road table: any ego is farther than any road radius
#: from it (finite, so the distance arithmetic stays finite: (1e18)^2 < float32 max).
FAR = 1.0e18
#: Columns of the per-segment road feature table (see :func:`road_table`).
ROAD_COLS = 10
#: Columns of the per-segment road geometry table (see :func:`road_table`).
GEO_COLS = 8
#: Columns of the per-agent table (see :func:`agent_table`).
AGENT_COLS = 12

_road_table_cache: list = []  # [(weakref road_seg, weakref road_type, versions, (geo, feat))]


def index_bits(n: int) -> int:
    """Low mantissa bits that hold a candidate index in the sort key (``ceil(log2(n))``, >= 1)."""
    return max(1, (int(n) - 1).bit_length())


def sort_key(d2: torch.Tensor, ok: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 sort key [..., n]: float bits of ``d2 >= 0`` (float32 [..., n], m^2) with the low
    ``bits`` replaced by the last-axis index; invalid candidates (``ok`` false) get the bits of
    +inf (sorted last, still by index)."""
    n = d2.shape[-1]
    raw = torch.where(ok, d2, float("inf")).view(torch.int32)
    ar = torch.arange(n, dtype=torch.int32, device=d2.device)
    return (raw & ~((1 << bits) - 1)) | ar


def road_table(road_seg: torch.Tensor, road_type: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-segment road tables, computed once per pack and cached (CPU reference).

    Args:
        road_seg: [S, R, 4] float32 segments (x0, y0, x1, y1) (m).
        road_type: [S, R] int8 ``RoadType`` codes.

    Returns:
        ``(geo, feat)`` for global segment ``s * R + r``:

        * ``geo`` [S*R + 2, 8] float32 rows ``(x0, y0, x1, y1, dir_x, dir_y, length, 0)``: what the
          point-to-segment distance needs (:func:`segment_d2`);
        * ``feat`` [S*R + 2, 10] float32 rows ``(mid_x, mid_y, dir_x, dir_y, half_length, is_lane,
          is_road_line, is_road_edge, is_other, 1)``: what an observation slot shows.

        Row ``S*R`` is a "far" row (both endpoints at 1e18 m: never within a road radius) that grid
        padding points to; row ``S*R + 1`` is all zero (what padding observation slots gather).
        Zero-length segments get direction (1, 0), which keeps the distance formula exact.

    The tables are cached for the last few (road_seg, road_type) tensor objects (weak references
    plus the tensors' in-place version counters, so an edited or freed tensor is never served a
    stale table).
    """
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
    onehot = (group[..., None] == torch.arange(NUM_ROAD_OBS_TYPES, device=road_seg.device)).to(torch.float32)
    mid = 0.5 * (p0 + p1)
    feat = road_seg.new_zeros(S * R + 2, ROAD_COLS)
    feat[: S * R] = torch.cat(
        [mid, torch.stack([ux, uy, 0.5 * seg_len], dim=-1), onehot, torch.ones_like(ux)[..., None]], dim=-1
    ).reshape(S * R, ROAD_COLS)
    feat[S * R, 0:2] = FAR
    feat[S * R, 2] = 1.0
    geo = road_seg.new_zeros(S * R + 2, GEO_COLS)
    geo[: S * R] = torch.cat(
        [road_seg, torch.stack([ux, uy, seg_len, torch.zeros_like(ux)], dim=-1)], dim=-1
    ).reshape(S * R, GEO_COLS)
    geo[S * R, 0:4] = FAR
    geo[S * R, 4] = 1.0
    tabs = (geo, feat)
    _road_table_cache.insert(0, (weakref.ref(road_seg), weakref.ref(road_type), key, tabs))
    del _road_table_cache[4:]
    return tabs


def segment_d2(ex, ey, x0, y0, x1, y1, ux, uy, seg_len):
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


def agent_table(pos, heading, speed, length, width, agent_type) -> torch.Tensor:
    """[W*A + 1, 12] float32 per-agent rows x, y (m), cos h, sin h, speed/20, length/5, width/5,
    3 type one-hots, 1, 0 — and a final all-zero row that padding partner slots gather.
    Inputs as :func:`gpusim.kernels.observations.observations`."""
    W, A = speed.shape
    n = W * A
    tab = pos.new_empty(n + 1, AGENT_COLS)
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
    for k in range(NUM_OBJECT_TYPES):
        torch.eq(at, k, out=t[:, 7 + k])
    t[:, 10] = 1.0
    t[:, 11] = 0.0
    return tab


def live_rows(obs2d: torch.Tensor, act: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
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


def check_inputs(
    pos, heading, speed, length, width, agent_type, present, goal, ego_extra, ego_active, scenario,
    road_seg, road_type, grid_road, grid_origin, grid_dims, cell_size, num_partners, partner_radius,
    road_radius, out, rows=None, grid_start=None, written=None,
) -> ObsLayout:
    """Validate the arguments of :func:`gpusim.kernels.observations.observations` (host-side
    metadata only, no device sync) and return the :class:`ObsLayout`. One check per argument, in
    signature order (the outputs' in :func:`_check_outputs`).

    Raises:
        ValueError: as documented there, naming the argument.
    """
    if pos.dim() != 3 or pos.shape[-1] != 2:
        raise ValueError(f"observations: pos must be [W, A, 2], got {tuple(pos.shape)}")
    W, A = pos.shape[:2]
    if goal.dim() != 3 or goal.shape[0] != W or goal.shape[2] != 2:
        raise ValueError(f"observations: goal must be [W={W}, C, 2], got {tuple(goal.shape)}")
    C = goal.shape[1]
    if C > A:
        raise ValueError(f"observations: C = goal.shape[1] = {C} exceeds A = {A}")
    if not isinstance(grid_road, torch.Tensor) or grid_road.dim() not in (2, 3):
        raise ValueError(f"observations: grid_road must be [S, NC, K] or [NCT, K], got {tuple(grid_road.shape)}")
    if road_seg.dim() != 3 or road_seg.shape[-1] != 4:
        raise ValueError(f"observations: road_seg must be [S, R, 4], got {tuple(road_seg.shape)}")
    S, R = road_seg.shape[:2]
    K = grid_road.shape[-1]
    _, start = grid_table_rows(grid_road, grid_start, "observations: grid_road")
    if start.shape[0] != S or (grid_road.dim() == 3 and grid_road.dtype != torch.int32):
        raise ValueError(f"observations: grid_road has {start.shape[0]} scenarios (road_seg {S}), or a padded "
                         f"table that is not int32")
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
        "grid_road": (grid_road, tuple(grid_road.shape), grid_road.dtype),
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
    lay = kernel_layout(num_partners, K)
    _check_outputs(out, rows, written, W, C, lay.obs_dim, pos.device)
    return lay


def _check_outputs(out, rows, written, W: int, C: int, D: int, device) -> None:
    """The ``out`` / ``rows`` / ``written`` checks of :func:`check_inputs` (``D``: the layout's
    observation width). Raises ValueError as documented there."""
    if out is not None:
        if tuple(out.shape) != (W, C, D) or out.dtype != torch.float32 or out.device != device:
            raise ValueError(
                f"observations: out must be float32 [W, C, D] = {(W, C, D)} on {device}, "
                f"got {out.dtype} {tuple(out.shape)} on {out.device}"
            )
        if out.numel() and (out.stride(-1) != 1 or out.stride(0) != C * out.stride(1)):
            raise ValueError("observations: out must be contiguous, or a column slice out[..., :D] of a "
                             "contiguous [W, C, D'] buffer (rows equally strided)")
    if rows is not None:
        if out is None:
            raise ValueError("observations: rows needs out (the slots not listed are left as they are in out)")
        if not isinstance(rows, torch.Tensor) or rows.dim() != 1 or rows.dtype != torch.int64:
            raise ValueError("observations: rows must be a 1-D int64 tensor of flat slot indices w * C + c")
        if rows.device != device:
            raise ValueError(f"observations: rows is on {rows.device}, pos on {device}")
    if written is not None:
        if out is None or rows is not None:
            raise ValueError("observations: written needs out and excludes rows (it selects the rows itself)")
        if (not isinstance(written, torch.Tensor) or written.dtype != torch.bool or written.numel() != W * C
                or written.device != device or not written.is_contiguous()):
            raise ValueError(f"observations: written must be a contiguous bool tensor of W * C = {W * C} "
                             f"elements on {device}")
