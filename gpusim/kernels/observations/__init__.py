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
endpoint coordinates (:func:`tables.segment_d2 <gpusim.kernels.observations.tables.segment_d2>`), so segments sharing their nearest vertex tie exactly
and are ordered by grid position in both backends, whatever the last bits of the ego position.

Implementations (one file each, flash-linear-attention style):

* ``naive.py``: the torch reference :func:`observations_reference` (CPU; the oracle) and
  ``observe_features``, its feature computation.
* ``cpu.c`` / ``cpu.py``: :func:`observations_cpu`, a hand-written C kernel (OpenMP over slot
  rows) built with the system compiler at first use and loaded through ctypes: the torch
  backend's default in the env (``EnvConfig.cpu_kernels``), bit-identical to the reference but for
  the goal distance's last bit (torch's ``sqrt`` is not correctly rounded on every CPU).
* ``kernel.py``: the Triton kernel ``_observations_kernel``; ``launcher.py``:
  :func:`observations_triton`, its checks and launch.
* ``state.py``: :func:`observations_state`, the env's call from the state's own fields on every
  backend (the C kernel's state entry, Triton with ``written``, the reference on the in-play rows).
* ``tables.py``: argument checks, sort keys, the cached road tables, the per-agent table.

:func:`observations` (below) dispatches by backend (``gpusim.backend``).

Normalisation constants (:data:`SPEED_SCALE`, :data:`SIZE_SCALE`, :data:`GOAL_SCALE`) are chosen so
typical urban values are O(1); they are not taken from another project.
"""

from __future__ import annotations

import torch

from gpusim.backend import op_backend
from gpusim.kernels.obs_layout import (  # noqa: F401  (re-exported: the layout is part of this API)
    EGO_EXTRA,
    EGO_FEATURES,
    GOAL_SCALE,
    PARTNER_FEATURES,
    ROAD_FEATURES,
    SIZE_SCALE,
    SPEED_SCALE,
    ObsLayout,
    obs_layout,
)
from gpusim.kernels.observations.cpu import cpu_kernel_available, cpu_kernel_status, observations_cpu
from gpusim.kernels.observations.launcher import observations_triton
from gpusim.kernels.observations.naive import observations_reference
from gpusim.kernels.observations.state import observations_state
from gpusim.kernels.observations.tables import road_table  # noqa: F401

__all__ = [
    "EGO_EXTRA",
    "EGO_FEATURES",
    "GOAL_SCALE",
    "ObsLayout",
    "PARTNER_FEATURES",
    "ROAD_FEATURES",
    "cpu_kernel_available",
    "cpu_kernel_status",
    "SIZE_SCALE",
    "SPEED_SCALE",
    "obs_layout",
    "observations",
    "observations_cpu",
    "observations_reference",
    "observations_state",
    "observations_triton",
    "road_table",
]


def observations(
    pos: torch.Tensor, heading: torch.Tensor, speed: torch.Tensor, length: torch.Tensor, width: torch.Tensor,
    agent_type: torch.Tensor, present: torch.Tensor, goal: torch.Tensor, ego_extra: torch.Tensor,
    ego_active: torch.Tensor, scenario: torch.Tensor, road_seg: torch.Tensor, road_type: torch.Tensor,
    grid_road: torch.Tensor, grid_origin: torch.Tensor, grid_dims: torch.Tensor, cell_size: float,
    num_partners: int, partner_radius: float, road_radius: float, out: torch.Tensor | None = None,
    rows: torch.Tensor | None = None, grid_start: torch.Tensor | None = None, written: torch.Tensor | None = None,
    *, backend: str | None = None,
) -> torch.Tensor:
    """Ego-centric observation of every policy slot (layout: :func:`obs_layout`, module docstring).

    ``backend`` (:func:`gpusim.backend.op_backend`; default from ``pos``): the Triton kernel under
    ``"triton"`` / ``"cupy"``, else the torch reference (the env's C kernel is
    :func:`~gpusim.kernels.observations.state.observations_state`'s).

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
        grid_road: [S, NC, K] int32 candidate segment indices per cell, -1 padding (padded
            layout), or [NCT, K] int16/int32 with ``grid_start`` (compact layout,
            ``gpusim.data.layout``).
        grid_origin: [S, 2] float32, grid_dims: [S, 2] int32, cell_size: float (m) — the grid
            (see ``gpusim.kernels.grid``).
        num_partners: P partner slots.
        partner_radius: partners farther than this (centre distance, m) are not observed.
        road_radius: segments farther than this (point-to-segment distance, m) are invalid.
        out: optional preallocated [W, C, D] float32 output, contiguous or a column slice
            ``buf[..., :D]`` of a contiguous [W, C, D'] buffer (the env writes the first D columns
            of its observation buffer in place; the signal block follows); reusing one buffer
            avoids re-faulting a large fresh allocation each step. Without ``rows`` / ``written``
            every element is written.
        rows: optional [N] int64 flat slot indices ``w * C + c`` (unique, any order; requires
            ``out``): only these slots are written (an inactive listed slot gets zeros), every
            other element of ``out`` is left as it is. The env uses it to rewrite only the slots
            whose content can change and keep the rest of a zeroed buffer (see docs/performance.md).
        grid_start: [S] int64 first row of each scenario in a compact ``grid_road`` (None for
            the padded layout).
        written: optional [W, C] or [W*C] bool (requires ``out``, excludes ``rows``): the slots
            whose row in ``out`` may be non-zero. A slot neither active nor written is left as it
            is (its row is already zero); the others are written as without it. The GPU path's
            way to skip empty slots with no host sync (``rows`` needs ``nonzero``): at 16,384
            worlds on an H100 the kernel wrote all 32 slots' rows although 4.3 per world are in
            play.

    Returns:
        [W, C, D] float32 observations, D = ``obs_layout(num_partners, K).obs_dim``
        (``out`` itself when given).

    Raises:
        ValueError: on inconsistent shapes, wrong dtypes or devices, non-contiguous tensors,
            C > A, num_partners < 1, non-positive radii / cell size, or ``rows`` that is not a
            1-D int64 tensor on the same device, or is given without ``out``; ``written`` that
            is not a contiguous bool tensor of W*C elements on the same device, or is given
            without ``out`` or with ``rows``.
    """
    impl = observations_triton if op_backend(backend, pos) == "triton" else observations_reference
    return impl(pos=pos, heading=heading, speed=speed, length=length, width=width, agent_type=agent_type,
                present=present, goal=goal, ego_extra=ego_extra, ego_active=ego_active, scenario=scenario,
                road_seg=road_seg, road_type=road_type, grid_road=grid_road, grid_origin=grid_origin,
                grid_dims=grid_dims, cell_size=cell_size, num_partners=num_partners, partner_radius=partner_radius,
                road_radius=road_radius, out=out, rows=rows, grid_start=grid_start, written=written)
