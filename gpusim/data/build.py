"""Scenario selection: :class:`RawScenario` → :class:`ScenarioData` (one scenario, unpadded).

Padding many of them into a :class:`~gpusim.data.pack.ScenarioPack` is in :mod:`gpusim.data.pack`,
batch conversion of files in :mod:`gpusim.data.convert`; this module imports neither.

Rules (docs/design.md section 4, parameters in :class:`~gpusim.config.DataConfig`):

* Objects of unknown type are ignored by the parser (counted); objects never valid in the log are
  dropped (counted as ``never_valid_objects``).
* Controllable: vehicles valid at ``init_steps``, not ``mark_as_expert``, whose goal is farther
  than ``goal_min_distance`` from their position at ``init_steps``. The self-driving car
  (``metadata.sdc_track_index``) comes first when it is controllable, then file order; at most
  ``max_controlled`` (the rest become experts, counted as ``controllable_over_cap``).
  With ``control="all_valid"`` every object valid at ``init_steps`` is controllable (any type,
  ``mark_as_expert`` or not, goal kept as logged however near), and objects not valid at
  ``init_steps`` are not packed at all (the sim-agents challenge's protocol).
* Experts: every other kept object, up to ``max_agents`` slots in total. When more exist, the ones
  valid at ``init_steps`` and nearest (at ``init_steps``) to the controlled agents' centroid are
  kept first, then the others by the distance of their first valid position; the rest are
  dropped (counted as ``dropped_over_max_agents``). Kept experts stay in file order.
* Slot order: controlled, experts, padding.
* Centring: ``offset`` = mean (float64) of all valid positions of the packed agents; every stored
  coordinate (tracks, goals, segments, grid origin) is relative to it. Invalid steps hold 0.
* Scenarios without a controllable agent raise :class:`NoControllableAgentError` (batch
  conversion skips them with a warning and lists them in ``stats["skipped"]``).
* Traffic signals: every logged signal is kept (sorted by lane id), its stop point centred like
  everything else, with the direction of its lane at the stop point (:func:`lane_directions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from gpusim.config import DataConfig, ObjectType, RoadType
from gpusim.data.errors import NoControllableAgentError, ScenarioError
from gpusim.data.grid_tables import build_grid_tables
from gpusim.data.parse import RawScenario, read_scenario
from gpusim.data.parse_proto import parse_record
from gpusim.data.roads import polylines_to_segments
from gpusim.data.signals import lane_directions
from gpusim.data.tfrecord import is_tfrecord_file, iter_records


@dataclass
class ScenarioData:
    """One converted scenario, unpadded (N agent slots in use, R segments, NC grid cells).

    Tensor attributes have the pack's dtypes and meaning (see :mod:`gpusim.data.pack`) without the
    leading S axis: ``offset`` [2] float64; ``traj_pos`` [N, T, 2], ``traj_heading`` [N, T],
    ``traj_vel`` [N, T, 2] float32, ``traj_valid`` [N, T] bool; ``agent_exists`` [N] bool (all
    true), ``agent_type`` [N] int8, ``agent_length``/``agent_width`` [N] float32, ``agent_goal``
    [N, 2] float32, ``agent_source_index`` [N] int32; ``road_seg`` [R, 4] float32, ``road_type`` [R]
    int8; ``grid_origin`` [2] float32, ``grid_dims`` [2] int32, ``grid_road`` [NC, K] int32,
    ``grid_edge`` [NC, KE] int32; ``agent_interest`` / ``agent_predict`` [N] bool;
    ``signal_lane`` [L] int32, ``signal_pos`` / ``signal_dir`` [L, 2] float32, ``signal_state``
    [T, L] int8, ``signal_valid`` [T, L] bool (L signals).

    Attributes:
        scenario_id, source_file: identification.
        num_controlled: slots ``[0, num_controlled)`` are controlled.
        sdc_index: slot of the self-driving car, -1 if unknown or not packed.
        stats: per-scenario counters (see :func:`build_scenario`).
    """

    scenario_id: str
    source_file: str
    num_controlled: int
    sdc_index: int
    offset: torch.Tensor
    traj_pos: torch.Tensor
    traj_heading: torch.Tensor
    traj_vel: torch.Tensor
    traj_valid: torch.Tensor
    agent_exists: torch.Tensor
    agent_type: torch.Tensor
    agent_length: torch.Tensor
    agent_width: torch.Tensor
    agent_goal: torch.Tensor
    agent_source_index: torch.Tensor
    road_seg: torch.Tensor
    road_type: torch.Tensor
    grid_origin: torch.Tensor
    grid_dims: torch.Tensor
    grid_road: torch.Tensor
    grid_edge: torch.Tensor
    agent_interest: torch.Tensor
    agent_predict: torch.Tensor
    signal_lane: torch.Tensor
    signal_pos: torch.Tensor
    signal_dir: torch.Tensor
    signal_state: torch.Tensor
    signal_valid: torch.Tensor
    stats: dict = field(default_factory=dict)

    @property
    def num_agents(self) -> int:
        """N, the agent slots in use."""
        return int(self.traj_pos.shape[0])

    @property
    def num_segments(self) -> int:
        """R."""
        return int(self.road_seg.shape[0])

    @property
    def num_signals(self) -> int:
        """L."""
        return int(self.signal_lane.shape[0])

    @property
    def num_cells(self) -> int:
        """NC = nx * ny."""
        return int(self.grid_road.shape[0])


def select_agents(raw: RawScenario, config: DataConfig) -> tuple[np.ndarray, int, dict]:
    """Choose and order the agent slots of a scenario.

    Args:
        raw: a parsed scenario. config: selection parameters.

    Returns:
        ``(order, num_controlled, stats)``: ``order`` [N] int64 indices into ``raw``'s objects in
        slot order (controlled first), ``num_controlled``, and counters ``never_valid_objects``,
        ``controllable``, ``controllable_over_cap``, ``dropped_over_max_agents``.
    """
    t0 = config.init_steps
    n = raw.num_objects
    ever = raw.valid.any(axis=1) if n else np.zeros(0, dtype=bool)
    at_init = raw.valid[:, t0] if n else np.zeros(0, dtype=bool)
    start = raw.pos[:, t0] if n else np.zeros((0, 2))
    goal_dist = np.hypot(*(raw.goal - start).T) if n else np.zeros(0)
    all_valid = config.control == "all_valid"
    controllable = at_init if all_valid else (
        (raw.obj_type == int(ObjectType.VEHICLE)) & at_init & ~raw.expert & (goal_dist > config.goal_min_distance)
    )
    cand = list(np.flatnonzero(controllable))
    sdc_local = -1
    if raw.sdc_source_index >= 0:
        hit = np.flatnonzero(raw.source_index == raw.sdc_source_index)
        sdc_local = int(hit[0]) if hit.size else -1
    if sdc_local in cand:
        cand.remove(sdc_local)
        cand.insert(0, sdc_local)
    ctrl = cand[: config.max_controlled]
    stats = {
        "never_valid_objects": int((~ever).sum()),
        "controllable": len(cand),
        "controllable_over_cap": max(0, len(cand) - config.max_controlled),
        "dropped_over_max_agents": 0,
    }
    if not ctrl:
        return np.array([], dtype=np.int64), 0, stats
    is_ctrl = np.zeros(n, dtype=bool)
    is_ctrl[ctrl] = True
    experts = np.flatnonzero((at_init if all_valid else ever) & ~is_ctrl)
    room = config.max_agents - len(ctrl)
    if experts.size > room:
        centroid = start[ctrl].mean(axis=0)
        first_valid = raw.valid.argmax(axis=1)
        ref = np.where(at_init[:, None], start, raw.pos[np.arange(n), first_valid])
        dist = np.hypot(*(ref[experts] - centroid).T)
        rank = np.lexsort((experts, dist, ~at_init[experts]))  # primary: valid at init first
        experts = np.sort(experts[rank[:room]])
        stats["dropped_over_max_agents"] = int(len(rank) - room)
    return np.concatenate([np.array(ctrl, dtype=np.int64), experts.astype(np.int64)]), len(ctrl), stats


def build_scenario(raw: RawScenario, config: DataConfig = DataConfig()) -> ScenarioData:
    """Select agents, centre coordinates, build road segments and grid tables for one scenario.

    Raises:
        NoControllableAgentError: if no agent passes the control rule (field ``objects``).
    """
    order, nc, stats = select_agents(raw, config)
    if nc == 0:
        raise NoControllableAgentError(
            raw.file,
            "objects",
            f"no controllable vehicle (valid at step {config.init_steps}, not mark_as_expert, goal farther "
            f"than {config.goal_min_distance} m) among {raw.num_objects} objects",
        )
    valid = raw.valid[order]
    pos = raw.pos[order]
    offset = pos[valid].mean(axis=0)
    rel = np.where(valid[..., None], pos - offset, 0.0)
    goal = raw.goal[order] - offset
    seg, seg_type, road_stats = polylines_to_segments(
        raw.road_xy - offset if raw.road_xy.size else raw.road_xy, raw.road_start, raw.road_type, config.simplify_area
    )
    stats.update(road_stats)
    cover = torch.from_numpy(np.concatenate([rel[valid], goal]))
    grid = build_grid_tables(
        torch.from_numpy(seg).to(torch.float32),
        torch.from_numpy(seg_type),
        cover,
        config.grid_cell_size,
        config.grid_margin,
        config.grid_k,
        config.grid_edge_k,
        int(RoadType.ROAD_EDGE),
    )
    sdc_slot = -1
    if raw.sdc_source_index >= 0:
        hit = np.flatnonzero(raw.source_index[order] == raw.sdc_source_index)
        sdc_slot = int(hit[0]) if hit.size else -1
    sig = raw.signals
    if sig.num_signals and (sig.lane.min() < 0 or sig.lane.max() >= 2**31):
        raise ScenarioError(raw.file, "signals", "a signal lane id does not fit in int32")
    sig_dir = lane_directions(sig.pos, sig.lane, raw.road_xy, raw.road_start, raw.road_id)
    stats["signals"] = sig.num_signals
    stats["signal_stop_points_moved"] = sig.moved
    stats["unknown_signal_states"] = sig.unknown_names
    stats["signals_without_lane"] = int((np.abs(sig_dir).sum(axis=1) == 0).sum())
    stats["ignored_objects"] = dict(raw.ignored_objects)
    stats["unknown_road_types"] = dict(raw.unknown_road_types)
    n = len(order)
    f32 = torch.float32
    return ScenarioData(
        scenario_id=raw.scenario_id,
        source_file=raw.file,
        num_controlled=nc,
        sdc_index=sdc_slot,
        offset=torch.from_numpy(offset.astype(np.float64)),
        traj_pos=torch.from_numpy(rel).to(f32),
        traj_heading=torch.from_numpy(raw.heading[order]).to(f32),
        traj_vel=torch.from_numpy(raw.vel[order]).to(f32),
        traj_valid=torch.from_numpy(valid.copy()),
        agent_exists=torch.ones(n, dtype=torch.bool),
        agent_type=torch.from_numpy(raw.obj_type[order].copy()),
        agent_length=torch.from_numpy(raw.length[order]).to(f32),
        agent_width=torch.from_numpy(raw.width[order]).to(f32),
        agent_goal=torch.from_numpy(goal).to(f32),
        agent_source_index=torch.from_numpy(raw.source_index[order]).to(torch.int32),
        road_seg=torch.from_numpy(seg).to(f32),
        road_type=torch.from_numpy(seg_type),
        agent_interest=torch.from_numpy(raw.interest[order].copy()),
        agent_predict=torch.from_numpy(raw.predict[order].copy()),
        signal_lane=torch.from_numpy(sig.lane).to(torch.int32),
        signal_pos=torch.from_numpy(sig.pos - offset).to(f32).reshape(-1, 2),
        signal_dir=torch.from_numpy(sig_dir).to(f32).reshape(-1, 2),
        signal_state=torch.from_numpy(sig.state.copy()),
        signal_valid=torch.from_numpy(sig.valid.copy()),
        stats=stats,
        **grid,
    )


def load_scenario(path, config: DataConfig = DataConfig()) -> ScenarioData:
    """Read, validate and convert one scenario: a JSON file (``.json``, ``.json.gz``, ``.json.xz``) or
    the first record of a TFRecord file (all records: :func:`gpusim.data.convert.convert_sources`).

    Raises:
        ScenarioError: naming the file (and record) and the field for any malformed input, or an
            empty TFRecord file; :class:`NoControllableAgentError` (a subclass) when no agent is
            controllable.
    """
    if not is_tfrecord_file(path):
        return build_scenario(read_scenario(path), config)
    for index, item in iter_records(path):
        if isinstance(item, ScenarioError):
            raise item
        return build_scenario(parse_record(item, path, index), config)
    raise ScenarioError(path, "", "the TFRecord file holds no record")
