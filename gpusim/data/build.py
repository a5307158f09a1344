"""Scenario selection and packing: :class:`RawScenario` → :class:`ScenarioData` → :class:`ScenarioPack`.

Rules (DESIGN.md section 3, parameters in :class:`~gpusim.config.DataConfig`):

* Objects of unknown type are ignored by the parser (counted); objects never valid in the log are
  dropped (counted as ``never_valid_objects``).
* Controllable: vehicles valid at ``init_steps``, not ``mark_as_expert``, whose goal is farther
  than ``goal_min_distance`` from their position at ``init_steps``. The self-driving car
  (``metadata.sdc_track_index``) comes first when it is controllable, then file order; at most
  ``max_controlled`` (the rest become experts, counted as ``controllable_over_cap``).
* Experts: every other kept object, up to ``max_agents`` slots in total. When more exist, the ones
  valid at ``init_steps`` and nearest (at ``init_steps``) to the controlled agents' centroid are
  kept first, then the others by the distance of their first valid position; the rest are
  dropped (counted as ``dropped_over_max_agents``). Kept experts stay in file order.
* Slot order: controlled, experts, padding.
* Centring: ``offset`` = mean (float64) of all valid positions of the packed agents; every stored
  coordinate (tracks, goals, segments, grid origin) is relative to it. Invalid steps hold 0.
* Scenarios without a controllable agent raise :class:`NoControllableAgentError` (batch
  conversion skips them with a warning and lists them in ``stats["skipped"]``).
"""

from __future__ import annotations

import glob as _glob
import os
import pathlib
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from gpusim.config import DataConfig, ObjectType, RoadType
from gpusim.data.errors import NoControllableAgentError, ScenarioError
from gpusim.data.grid_tables import build_grid_tables
from gpusim.data.pack import ScenarioPack
from gpusim.data.parse import RawScenario, is_scenario_file, read_scenario
from gpusim.data.roads import polylines_to_segments


@dataclass
class ScenarioData:
    """One converted scenario, unpadded (N agent slots in use, R segments, NC grid cells).

    Tensor attributes have the pack's dtypes and meaning (see :mod:`gpusim.data.pack`) without the
    leading S axis: ``offset`` [2] float64; ``traj_pos`` [N, T, 2], ``traj_heading`` [N, T],
    ``traj_vel`` [N, T, 2] float32, ``traj_valid`` [N, T] bool; ``agent_exists`` [N] bool (all
    true), ``agent_type`` [N] int8, ``agent_length``/``agent_width`` [N] float32, ``agent_goal``
    [N, 2] float32, ``agent_source_index`` [N] int32; ``road_seg`` [R, 4] float32, ``road_type`` [R]
    int8; ``grid_origin`` [2] float32, ``grid_dims`` [2] int32, ``grid_road`` [NC, K] int32,
    ``grid_edge`` [NC, KE] int32.

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
    controllable = (
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
    experts = np.flatnonzero(ever & ~is_ctrl)
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
        stats=stats,
        **grid,
    )


def load_scenario(path, config: DataConfig = DataConfig()) -> ScenarioData:
    """Read, validate and convert one scenario file (``.json``, ``.json.gz`` or ``.json.xz``).

    Raises:
        ScenarioError: naming the file and the field for any malformed input;
            :class:`NoControllableAgentError` (a subclass) when no agent is controllable.
    """
    return build_scenario(read_scenario(path), config)


def expand_sources(paths) -> tuple[list[str], list[dict]]:
    """Expand files, directories (their ``*.json``, ``*.json.gz``, ``*.json.xz``, not recursive)
    and glob patterns into a sorted, de-duplicated file list.

    Args:
        paths: one path-like / string or a sequence of them.

    Returns:
        ``(files, errors)``: errors are ``{"file", "reason"}`` for sources that match nothing.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files, errors, seen = [], [], set()

    def add(p):
        key = os.path.abspath(p)
        if key not in seen:
            seen.add(key)
            files.append(str(p))

    for src in paths:
        src = str(src)
        p = pathlib.Path(src)
        if p.is_dir():
            found = sorted(str(c) for c in p.iterdir() if c.is_file() and is_scenario_file(c))
            if not found:
                errors.append({"file": src, "reason": "directory holds no .json/.json.gz/.json.xz file"})
            for c in found:
                add(c)
        elif p.is_file():
            add(src)
        elif any(ch in src for ch in "*?["):
            found = sorted(_glob.glob(src))
            found = [c for c in found if os.path.isfile(c)]
            if not found:
                errors.append({"file": src, "reason": "pattern matches no file"})
            for c in found:
                add(c)
        else:
            errors.append({"file": src, "reason": "no such file or directory"})
    return files, errors


def _merge_counts(into: dict, key: str, counts: dict) -> None:
    d = into.setdefault(key, {})
    for k, v in counts.items():
        d[k] = d.get(k, 0) + int(v)


def pack_scenarios(scenarios: list[ScenarioData], config: DataConfig, stats: dict | None = None) -> ScenarioPack:
    """Pad scenarios to common sizes (A = ``config.max_agents``, R and NC = maxima) and stack them.

    Raises:
        ScenarioError: if ``scenarios`` is empty.
    """
    if not scenarios:
        raise ScenarioError("", "", "no usable scenario to pack")
    S, A = len(scenarios), config.max_agents
    T = scenarios[0].traj_pos.shape[1]
    R = max(1, max(s.num_segments for s in scenarios))
    NC = max(s.num_cells for s in scenarios)
    K, KE = config.grid_k, config.grid_edge_k

    def full(shape, dtype, value=0):
        return torch.full(shape, value, dtype=dtype)

    out = {
        "offset": full((S, 2), torch.float64),
        "traj_pos": full((S, A, T, 2), torch.float32),
        "traj_heading": full((S, A, T), torch.float32),
        "traj_vel": full((S, A, T, 2), torch.float32),
        "traj_valid": full((S, A, T), torch.bool, False),
        "agent_exists": full((S, A), torch.bool, False),
        "agent_type": full((S, A), torch.int8, -1),
        "agent_length": full((S, A), torch.float32),
        "agent_width": full((S, A), torch.float32),
        "agent_goal": full((S, A, 2), torch.float32),
        "agent_source_index": full((S, A), torch.int32, -1),
        "num_agents": full((S,), torch.int32),
        "num_controlled": full((S,), torch.int32),
        "sdc_index": full((S,), torch.int32, -1),
        "road_seg": full((S, R, 4), torch.float32),
        "road_type": full((S, R), torch.int8, -1),
        "num_segments": full((S,), torch.int32),
        "grid_origin": full((S, 2), torch.float32),
        "grid_dims": full((S, 2), torch.int32),
        "grid_road": full((S, NC, K), torch.int32, -1),
        "grid_edge": full((S, NC, KE), torch.int32, -1),
    }
    for i, sc in enumerate(scenarios):
        n, r, nc = sc.num_agents, sc.num_segments, sc.num_cells
        for name in ("traj_pos", "traj_heading", "traj_vel", "traj_valid", "agent_exists", "agent_type",
                     "agent_length", "agent_width", "agent_goal", "agent_source_index"):
            out[name][i, :n] = getattr(sc, name)
        out["offset"][i] = sc.offset
        out["num_agents"][i] = n
        out["num_controlled"][i] = sc.num_controlled
        out["sdc_index"][i] = sc.sdc_index
        out["road_seg"][i, :r] = sc.road_seg
        out["road_type"][i, :r] = sc.road_type
        out["num_segments"][i] = r
        out["grid_origin"][i] = sc.grid_origin
        out["grid_dims"][i] = sc.grid_dims
        out["grid_road"][i, :nc] = sc.grid_road
        out["grid_edge"][i, :nc] = sc.grid_edge
    pack = ScenarioPack(
        scenario_ids=[s.scenario_id for s in scenarios],
        source_files=[s.source_file for s in scenarios],
        config=config,
        stats=stats if stats is not None else {},
        **out,
    )
    pack.validate()
    return pack


def convert(paths, config: DataConfig = DataConfig(), *, on_error: str = "collect", progress=None) -> ScenarioPack:
    """Convert many scenario files into one :class:`ScenarioPack` (``ScenarioPack.from_json``).

    Args:
        paths: files, directories or glob patterns (one or a sequence).
        config: conversion parameters.
        on_error: ``"collect"`` (default): bad files are listed in ``pack.stats["errors"]`` as
            ``{"file", "reason"}`` and the good ones are converted; ``"raise"``: the first bad
            file raises its :class:`ScenarioError`.
        progress: optional callable ``progress(file, error_or_None)`` called after each file.

    Returns:
        The pack, with ``stats``: ``files`` (files tried), ``converted``, ``errors`` (list of
        ``{file, reason}``; the reason does not repeat the file and reads ``"<field>: <problem>"``
        for malformed files), ``skipped`` (list of ``{file, reason}``: no controllable agent),
        ``ignored_objects`` / ``unknown_road_types`` (counts by type name), and summed counters
        ``never_valid_objects``, ``controllable``, ``controllable_over_cap``,
        ``dropped_over_max_agents``, ``road_points_in``, ``road_points_kept``,
        ``single_point_polylines``, ``zero_length_segments``; ``seconds`` (conversion time).

    Raises:
        ScenarioError: if no scenario is usable (the message lists the first reasons), or the
            first bad file when ``on_error="raise"``.
        ValueError: for an unknown ``on_error``.
    """
    if on_error not in ("collect", "raise"):
        raise ValueError(f"on_error must be 'collect' or 'raise', got {on_error!r}")
    t_start = time.perf_counter()
    threads = torch.get_num_threads()
    # The per-scenario tensors are small: intra-op threads only add synchronisation, which is
    # very costly on a shared machine (measured 12.8 s with 1 thread vs 159 s with 2 for the 72
    # shared scenarios on a loaded 2-core box). Restored on exit.
    torch.set_num_threads(1)
    try:
        return _convert(paths, config, on_error, progress, t_start)
    finally:
        torch.set_num_threads(threads)


def _convert(paths, config, on_error, progress, t_start) -> ScenarioPack:
    files, errors = expand_sources(paths)
    if errors and on_error == "raise":
        raise ScenarioError(errors[0]["file"], "", errors[0]["reason"])
    stats: dict = {"files": len(files), "converted": 0, "errors": list(errors), "skipped": []}
    counters = ("never_valid_objects", "controllable", "controllable_over_cap", "dropped_over_max_agents",
                "road_points_in", "road_points_kept", "single_point_polylines", "zero_length_segments")
    for c in counters:
        stats[c] = 0
    stats["ignored_objects"] = {}
    stats["unknown_road_types"] = {}
    scenarios: list[ScenarioData] = []
    for f in files:
        err = None
        try:
            sc = load_scenario(f, config)
        except NoControllableAgentError as exc:
            if on_error == "raise":
                raise
            warnings.warn(f"skipping scenario {exc}", stacklevel=2)
            stats["skipped"].append({"file": f, "reason": exc.reason})
            err = exc
        except ScenarioError as exc:
            if on_error == "raise":
                raise
            stats["errors"].append({"file": f, "reason": f"{exc.field}: {exc.reason}" if exc.field else exc.reason})
            err = exc
        else:
            scenarios.append(sc)
            for c in counters:
                stats[c] += int(sc.stats.get(c, 0))
            _merge_counts(stats, "ignored_objects", sc.stats.get("ignored_objects", {}))
            _merge_counts(stats, "unknown_road_types", sc.stats.get("unknown_road_types", {}))
        if progress is not None:
            progress(f, err)
    stats["converted"] = len(scenarios)
    if not scenarios:
        problems = stats["errors"] + stats["skipped"]
        listed = "; ".join(f"{p['file']}: {p['reason']}" for p in problems[:5])
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ScenarioError("", "", f"no usable scenario among {len(files)} file(s): {listed or 'no input'}{more}")
    pack = pack_scenarios(scenarios, config, stats)
    stats["seconds"] = round(time.perf_counter() - t_start, 3)
    return pack

