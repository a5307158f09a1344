"""`ScenarioPack`: padded tensors for many WOMD scenarios, ready to move to a device.

Axes: S scenarios, A = ``DataConfig.max_agents`` agent slots, T = 91 logged steps,
R = road segments (padded to the largest scenario), NCT = grid cells of all scenarios (not padded:
the rows of scenario ``s`` start at ``grid_start[s]``, see :mod:`gpusim.data.layout`), K =
``grid_k``, KE = ``grid_edge_k``.

Agent slots are ordered: the ``num_controlled[s]`` controlled agents first (self-driving car first
when it is controllable), then the log-replayed experts, then padding (``agent_exists = False``).
So policy slot ``c`` of a world running scenario ``s`` is agent slot ``c``, active when
``c < num_controlled[s]``.

Coordinates are centred per scenario: ``world = local + offset[s]`` (float64 offset), which keeps
float32 at centimetre precision. Units: m, rad, m/s.

Traffic signals (L = the most signals of any scenario in the pack, at least 1): signal ``l`` of
scenario ``s`` controls lane ``signal_lane[s, l]`` (map-feature id, -1 padding); its stop point is
``signal_pos[s, l]`` and ``signal_dir[s, l]`` is the unit direction of travel of the lane there
(the stop line is perpendicular to it through the stop point; (0, 0) when the lane is not in the
map). ``signal_state[s, t, l]`` is the :class:`~gpusim.data.signals.SignalState` code at log step
``t``, valid where ``signal_valid[s, t, l]`` (UNKNOWN = 0 elsewhere). Signals are a prefix of
``num_signals[s]`` slots.

This module pads :class:`~gpusim.data.build.ScenarioData` into packs (:func:`pack_scenarios`) and
drives batch conversion (:func:`convert`, via :mod:`gpusim.data.convert`); neither of those
modules imports this one.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from dataclasses import dataclass, field

import torch

from gpusim.config import DataConfig
from gpusim.data.build import ScenarioData
from gpusim.data.convert import convert_sources
from gpusim.data.errors import PackFileError, ScenarioError
from gpusim.data.integrity import (INDEX_NAME, SHARD_GLOB, check_invariants, check_one_dataset, checksum_mismatch,
                                   clear_dataset, dataset_in, pack_checksums)
from gpusim.data.pack_file import FORMAT_VERSION, atomic_torch_save, note_once, read_payload
from gpusim.fileio import write_text

from gpusim.data.layout import cell_counts, flatten_grid, grid_dtype, grid_rows, padded_grid, starts_of

PACK_FILE = "pack.pt"
META_FILE = "meta.json"
#: Allowed dtypes of the grid tables (int16 unless a scenario has more than 32768 segments).
GRID_DTYPES = (torch.int16, torch.int32)

#: Tensor fields with their dtypes, in the order they are documented.
TENSOR_FIELDS: dict[str, torch.dtype] = {
    "offset": torch.float64,  # [S, 2] centring offset (world = local + offset)
    "traj_pos": torch.float32,  # [S, A, T, 2] logged centre position (m)
    "traj_heading": torch.float32,  # [S, A, T] logged heading (rad, CCW from +x)
    "traj_vel": torch.float32,  # [S, A, T, 2] logged velocity (m/s)
    "traj_valid": torch.bool,  # [S, A, T] log valid flag (trust it, not the coordinates)
    "agent_exists": torch.bool,  # [S, A] slot holds an object
    "agent_type": torch.int8,  # [S, A] ObjectType code, -1 for padding
    "agent_length": torch.float32,  # [S, A] box length (m), 0 for padding
    "agent_width": torch.float32,  # [S, A] box width (m), 0 for padding
    "agent_goal": torch.float32,  # [S, A, 2] goal position (m)
    "agent_source_index": torch.int32,  # [S, A] index in the file's `objects` list, -1 padding
    "num_agents": torch.int32,  # [S] slots in use (agent_exists is a prefix)
    "num_controlled": torch.int32,  # [S] controlled agents (slots [0, num_controlled))
    "sdc_index": torch.int32,  # [S] slot of the self-driving car, -1 if unknown / not packed
    "road_seg": torch.float32,  # [S, R, 4] segments (x0, y0, x1, y1) (m)
    "road_type": torch.int8,  # [S, R] RoadType code, -1 for padding
    "num_segments": torch.int32,  # [S] segments in use (prefix)
    "grid_origin": torch.float32,  # [S, 2] lower-left corner of cell (0, 0) (m)
    "grid_dims": torch.int32,  # [S, 2] cells along x, along y (nx, ny); cell id = iy * nx + ix
    "grid_road": torch.int16,  # [NCT, K] nearest segments to each cell centre, sorted, -1 pad (or int32)
    "grid_edge": torch.int16,  # [NCT, KE] nearest road-edge segments to each cell centre, -1 pad (or int32)
    "grid_start": torch.int64,  # [S] first row of scenario s in grid_road / grid_edge
    "agent_interest": torch.bool,  # [S, A] object is in the scenario's objects_of_interest
    "agent_predict": torch.bool,  # [S, A] object is in the scenario's tracks_to_predict
    "signal_lane": torch.int32,  # [S, L] map id of the lane the signal controls, -1 padding
    "signal_pos": torch.float32,  # [S, L, 2] stop point (m)
    "signal_dir": torch.float32,  # [S, L, 2] unit lane direction at the stop point, (0, 0) unknown
    "signal_state": torch.int8,  # [S, T, L] SignalState code per log step (0 = unknown)
    "signal_valid": torch.bool,  # [S, T, L] the log has a state for this signal at this step
    "num_signals": torch.int32,  # [S] signal slots in use (prefix)
}

#: Fields added in format 2, with their padding value; absent from version-1 files and optional
#: in the constructor (filled with "no signal" / False).
_OPTIONAL_FIELDS = {"agent_interest": False, "agent_predict": False, "signal_lane": -1, "signal_pos": 0.0,
                    "signal_dir": 0.0, "signal_state": 0, "signal_valid": False, "num_signals": 0}


@dataclass
class ScenarioPack:
    """Padded tensors of S scenarios (see the module docstring for axes, order and units).

    Attributes:
        scenario_ids: S scenario ids (``scenario_id`` from the JSON / proto, else ``name``, else the
            file stem).
        source_files: S source file paths.
        config: the :class:`DataConfig` the pack was built with.
        cell_size: grid cell edge (m), equal to ``config.grid_cell_size``.
        stats: conversion counters (ignored objects by type, truncated polylines, ...).
        path: the file it was loaded from ("" when built in memory); used in messages.
        All other attributes: tensors as listed in ``TENSOR_FIELDS`` (the format-2 ones may be
        omitted when constructing: they default to "no signal" / False).

    Grid layouts: *compact* (the default, format 3): ``grid_road`` [NCT, K] / ``grid_edge``
    [NCT, KE] int16 (int32 past 32768 segments) with ``grid_start`` [S] int64; *padded* (format 2,
    what :meth:`padded` returns, kept for comparisons): [S, NC, K] int32 and ``grid_start = None``.
    The kernels accept both (:mod:`gpusim.data.layout`).
    """

    scenario_ids: list[str]
    source_files: list[str]
    config: DataConfig
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
    num_agents: torch.Tensor
    num_controlled: torch.Tensor
    sdc_index: torch.Tensor
    road_seg: torch.Tensor
    road_type: torch.Tensor
    num_segments: torch.Tensor
    grid_origin: torch.Tensor
    grid_dims: torch.Tensor
    grid_road: torch.Tensor
    grid_edge: torch.Tensor
    stats: dict = field(default_factory=dict)
    agent_interest: torch.Tensor | None = None
    agent_predict: torch.Tensor | None = None
    signal_lane: torch.Tensor | None = None
    signal_pos: torch.Tensor | None = None
    signal_dir: torch.Tensor | None = None
    signal_state: torch.Tensor | None = None
    signal_valid: torch.Tensor | None = None
    num_signals: torch.Tensor | None = None
    grid_start: torch.Tensor | None = None
    path: str = ""

    def __post_init__(self):
        S, A, T = self.traj_pos.shape[:3]
        L = self.signal_lane.shape[1] if self.signal_lane is not None else 1
        shapes = {"agent_interest": (S, A), "agent_predict": (S, A), "signal_lane": (S, L), "signal_pos": (S, L, 2),
                  "signal_dir": (S, L, 2), "signal_state": (S, T, L), "signal_valid": (S, T, L), "num_signals": (S,)}
        for name, value in _OPTIONAL_FIELDS.items():
            if getattr(self, name) is None:
                setattr(self, name, torch.full(shapes[name], value, dtype=TENSOR_FIELDS[name],
                                               device=self.traj_pos.device))

    # ------------------------------------------------------------------ shape helpers
    @property
    def num_scenarios(self) -> int:
        """S."""
        return len(self.scenario_ids)

    @property
    def max_agents(self) -> int:
        """A."""
        return self.traj_pos.shape[1]

    @property
    def num_steps(self) -> int:
        """T (91 for WOMD)."""
        return self.traj_pos.shape[2]

    @property
    def cell_size(self) -> float:
        """Grid cell edge in metres."""
        return float(self.config.grid_cell_size)

    @property
    def controlled(self) -> torch.Tensor:
        """[S, A] bool: slot ``a`` is controlled (``a < num_controlled[s]``)."""
        a = torch.arange(self.max_agents, device=self.num_controlled.device)
        return a[None, :] < self.num_controlled[:, None]

    @property
    def device(self) -> torch.device:
        return self.traj_pos.device

    def tensors(self) -> dict[str, torch.Tensor]:
        """All tensor fields by name (``grid_start`` left out in the padded layout)."""
        return {name: getattr(self, name) for name in TENSOR_FIELDS if getattr(self, name) is not None}

    def nbytes(self) -> int:
        """Bytes held by the tensors."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def nbytes_by_tensor(self) -> dict[str, int]:
        """Bytes held by each tensor, by name."""
        return {k: t.numel() * t.element_size() for k, t in self.tensors().items()}

    def to(self, device, non_blocking: bool = False) -> "ScenarioPack":
        """A copy with every tensor on ``device`` (``non_blocking`` as in ``Tensor.to``)."""
        moved = {k: v.to(device, non_blocking=non_blocking) for k, v in self.tensors().items()}
        return dataclasses.replace(self, **moved)

    def pin_memory(self) -> "ScenarioPack":
        """A copy in page-locked host memory (for asynchronous copies to a CUDA device); the pack
        itself when no CUDA is available."""
        if not torch.cuda.is_available():
            return self
        return dataclasses.replace(self, **{k: v.pin_memory() for k, v in self.tensors().items()})

    @property
    def is_compact(self) -> bool:
        """The grid tables are in the compact layout (``grid_start`` set)."""
        return self.grid_start is not None

    @property
    def num_cells(self) -> torch.Tensor:
        """[S] int64 grid cells per scenario."""
        return cell_counts(self.grid_dims)

    def padded(self) -> "ScenarioPack":
        """The same pack with format-2 grid tables ([S, NC, K] int32, padded to the largest grid,
        ``grid_start = None``): the pack format before the compact layout, for comparisons."""
        if not self.is_compact:
            return self
        return dataclasses.replace(
            self, grid_road=padded_grid(self.grid_road, self.grid_start, self.grid_dims),
            grid_edge=padded_grid(self.grid_edge, self.grid_start, self.grid_dims), grid_start=None)

    def compact(self) -> "ScenarioPack":
        """The same pack with compact grid tables (itself when already compact)."""
        if self.is_compact:
            return self
        dtype = grid_dtype(self.road_seg.shape[1])
        road, start = flatten_grid(self.grid_road, self.grid_dims, dtype)
        edge, _ = flatten_grid(self.grid_edge, self.grid_dims, dtype)
        return dataclasses.replace(self, grid_road=road, grid_edge=edge, grid_start=start)

    def select(self, index) -> "ScenarioPack":
        """A pack of the scenarios ``index`` (list or [n] int tensor, in that order, repeats
        allowed), with the same padded sizes (A, R, L) and the grid rows gathered (compact layout).

        Raises:
            IndexError: an index out of range.
        """
        p = self.compact()
        idx = torch.as_tensor(index, dtype=torch.int64).reshape(-1)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= p.num_scenarios):
            raise IndexError(f"select: scenario index out of range [0, {p.num_scenarios})")
        dev = p.offset.device
        idx_d = idx.to(dev)
        rows, start = grid_rows(p.grid_start, p.grid_dims, idx_d)
        out = {k: v.index_select(0, idx_d) for k, v in p.tensors().items()
               if k not in ("grid_road", "grid_edge", "grid_start")}
        il = idx.tolist()
        return dataclasses.replace(
            p, scenario_ids=[p.scenario_ids[i] for i in il], source_files=[p.source_files[i] for i in il],
            grid_road=p.grid_road.index_select(0, rows), grid_edge=p.grid_edge.index_select(0, rows),
            grid_start=start, **out)

    def validate(self) -> None:
        """Check dtypes and mutually consistent shapes.

        Raises:
            ValueError: naming the first inconsistent field.
        """
        S, A, T = len(self.scenario_ids), self.traj_pos.shape[1], self.traj_pos.shape[2]
        expect = {
            "offset": (S, 2), "traj_pos": (S, A, T, 2), "traj_heading": (S, A, T),
            "traj_vel": (S, A, T, 2), "traj_valid": (S, A, T), "agent_exists": (S, A),
            "agent_type": (S, A), "agent_length": (S, A), "agent_width": (S, A),
            "agent_goal": (S, A, 2), "agent_source_index": (S, A), "num_agents": (S,),
            "num_controlled": (S,), "sdc_index": (S,), "num_segments": (S,),
            "grid_origin": (S, 2), "grid_dims": (S, 2), "agent_interest": (S, A), "agent_predict": (S, A),
            "num_signals": (S,),
        }
        if self.is_compact:
            expect["grid_start"] = (S,)
        for name, dtype in TENSOR_FIELDS.items():
            t = getattr(self, name)
            if name == "grid_start" and t is None:
                continue
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"ScenarioPack.{name} is not a tensor")
            if name in ("grid_road", "grid_edge"):
                if t.dtype not in (GRID_DTYPES if self.is_compact else (torch.int32,)):
                    raise ValueError(f"ScenarioPack.{name} has dtype {t.dtype}")
            elif t.dtype != dtype:
                raise ValueError(f"ScenarioPack.{name} has dtype {t.dtype}, expected {dtype}")
            if name in expect and tuple(t.shape) != expect[name]:
                raise ValueError(f"ScenarioPack.{name} has shape {tuple(t.shape)}, expected {expect[name]}")
        R = self.road_seg.shape[1]
        if tuple(self.road_seg.shape) != (S, R, 4) or tuple(self.road_type.shape) != (S, R):
            raise ValueError("ScenarioPack.road_seg / road_type shapes disagree")
        if self.is_compact:
            nct = int(self.num_cells.sum())
            if (self.grid_road.dim() != 2 or self.grid_edge.dim() != 2 or self.grid_road.shape[0] != nct
                    or self.grid_edge.shape[0] != nct or self.grid_road.dtype != self.grid_edge.dtype):
                raise ValueError(f"ScenarioPack.grid_road / grid_edge must be [{nct}, K] / [{nct}, KE] of one dtype")
            if not torch.equal(self.grid_start.cpu(), starts_of(self.num_cells).cpu()):
                raise ValueError("ScenarioPack.grid_start is not the prefix sum of the grid cells")
        else:
            NC = self.grid_road.shape[1]
            if self.grid_road.dim() != 3 or self.grid_road.shape[:2] != (S, NC) or self.grid_edge.shape[:2] != (S, NC):
                raise ValueError("ScenarioPack.grid_road / grid_edge shapes disagree")
        L = self.signal_lane.shape[1] if self.signal_lane.dim() == 2 else -1
        for name, shape in (("signal_lane", (S, L)), ("signal_pos", (S, L, 2)), ("signal_dir", (S, L, 2)),
                            ("signal_state", (S, T, L)), ("signal_valid", (S, T, L))):
            if tuple(getattr(self, name).shape) != shape:
                raise ValueError(f"ScenarioPack.{name} has shape {tuple(getattr(self, name).shape)}, expected {shape}")
        if len(self.source_files) != S:
            raise ValueError("ScenarioPack.source_files length differs from scenario_ids")

    @property
    def max_signals(self) -> int:
        """L, the signal slots per scenario."""
        return self.signal_lane.shape[1]

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_json(cls, paths, config: DataConfig = DataConfig(), *, on_error: str = "collect", **kwargs) -> "ScenarioPack":
        """Convert WOMD scenarios (JSON or TFRecord files, directories or globs) into a pack.

        The same as :func:`convert` (see there and :func:`gpusim.data.convert.convert_sources`
        for ``limit``, ``workers``, ``progress`` and the ``stats`` keys; the selection rules are in
        :mod:`gpusim.data.build`). Bad files / records are collected in ``pack.stats["errors"]``
        and scenarios without a controllable agent in ``pack.stats["skipped"]`` while the good
        ones are converted; ``on_error="raise"`` raises on the first problem.

        Raises:
            ScenarioError: if no scenario is usable (or on the first problem with ``on_error="raise"``).
        """
        return convert(paths, config, on_error=on_error, **kwargs)

    from_sources = from_json

    def check_compatible(self, env_config) -> None:
        """Check that an env config (anything with ``max_agents``, ``max_controlled``, ``init_steps``,
        ``num_roads``, like :class:`~gpusim.config.EnvConfig`) can run on this pack.

        Raises:
            ValueError: one line per mismatch, naming this pack and both ways out: the env flag
                (``--env.max-controlled N``, the pack's value) and the conversion flag
                (``convert --max-controlled M``, the env's value).
        """
        pc = self.config
        where = self.path or "the scenario pack"
        problems = []
        for env_name, data_name in (("max_agents", "max_agents"), ("max_controlled", "max_controlled"),
                                    ("init_steps", "init_steps"), ("num_roads", "grid_k")):
            want, have = getattr(env_config, env_name, None), getattr(pc, data_name)
            if want is not None and want != have:
                problems.append(
                    f"{where} was converted with {data_name}={have} but the env asks for {env_name}={want}: "
                    f"pass --env.{env_name.replace('_', '-')} {have}, or convert again with "
                    f"`python -m gpusim.data convert ... --{data_name.replace('_', '-')} {want}`"
                )
        if problems:
            raise ValueError("; ".join(problems))

    # ------------------------------------------------------------------ persistence
    def save(self, path, *, overwrite: bool = False) -> pathlib.Path:
        """Write the pack to a directory (``pack.pt`` + ``meta.json``) or to a single ``.pt`` file,
        with a CRC-32C of every tensor and of the meta (format 4, :mod:`gpusim.data.integrity`).

        Writes are atomic (temporary file, then rename). Returns the path written.

        Raises:
            FileExistsError: the directory holds a sharded pack or the shards of an interrupted
                conversion (one dataset per directory) and ``overwrite`` is False; with
                ``overwrite`` those files are removed first.
        """
        path = pathlib.Path(path)
        meta = {
            "format_version": FORMAT_VERSION,
            "scenario_ids": list(self.scenario_ids),
            "source_files": [str(f) for f in self.source_files],
            "config": dataclasses.asdict(self.config),
            "stats": self.stats,
        }
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.compact().tensors().items()}
        meta["checksums"] = pack_checksums(meta, tensors)
        payload = {"meta": meta, "tensors": tensors}
        if path.suffix == ".pt":
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_torch_save(payload, path)
            return path
        if (path / INDEX_NAME).exists() or any(path.glob(SHARD_GLOB)):
            held = dataset_in(path)
            if not overwrite:
                raise FileExistsError(f"{path} already holds {held}; pass overwrite=True (--overwrite) to "
                                      f"replace it, or choose another directory")
            clear_dataset(path)
        path.mkdir(parents=True, exist_ok=True)
        atomic_torch_save(payload, path / PACK_FILE)
        write_text(path / META_FILE, json.dumps(meta, indent=1))
        return path

    @classmethod
    def load(cls, path, device="cpu", *, verify: bool = True, check: bool = True, expect_crc32c: int | None = None,
             expect_bytes: int | None = None) -> "ScenarioPack":
        """Load a pack written by :meth:`save` (directory or ``.pt`` file) onto ``device``.

        Only tensors and plain containers are unpickled (``torch.load(weights_only=True)``).
        Version-1 packs (before signals) load with no signal; packs before format 4 (no
        checksums) load with a one-line ``UserWarning`` to convert them again. The invariants
        (:func:`gpusim.data.integrity.check_invariants`) are checked on ``device`` unless
        ``check`` is False (costs are measured in docs/data.md).

        Args:
            verify: check the checksums (format 4: every tensor and the meta; with
                ``expect_crc32c``: the file's bytes instead, which covers them all).
            expect_crc32c / expect_bytes: the file's CRC-32C / size recorded elsewhere (a sharded
                pack's index); a file that differs is refused (corrupt, truncated or replaced).

        Raises:
            FileNotFoundError: if nothing is there.
            PackFileError: (a ``ScenarioError`` / ``ValueError``) one line naming the file and what
                is wrong: empty, truncated or not a torch file, not a gpusim pack, another format
                version, a checksum mismatch (naming the tensor), a missing or inconsistent tensor,
                a broken invariant (naming the field).
        """
        path = pathlib.Path(path)
        file = path if path.suffix == ".pt" else path / PACK_FILE
        check_one_dataset(path)
        payload = read_payload(file, verify, expect_crc32c, expect_bytes)
        meta, tensors = payload["meta"], payload["tensors"]
        version = meta.get("format_version")
        again = "convert the data again (python -m gpusim.data convert ...)"
        optional = set(_OPTIONAL_FIELDS) if version == 1 else set()
        if version < 3:
            optional.add("grid_start")
        for k in TENSOR_FIELDS:
            if k not in optional and not isinstance(tensors.get(k), torch.Tensor):
                raise PackFileError(file, k, f"missing tensor; {again}")
        if version >= 4 and verify and expect_crc32c is None:
            bad = checksum_mismatch(meta, tensors)
            if bad is not None:
                raise PackFileError(file, bad, f"checksum mismatch: the file is corrupt; {again}")
        elif version < 4:  # noted once per file, once per directory for the shards of a dataset
            note_once(str(file.parent if file.name.startswith("shard-") else file),
                      f"{file}: pack format {version} has no checksums (corruption cannot be detected); "
                      f"convert the data again to add them")
        try:
            pack = cls(
                scenario_ids=list(meta["scenario_ids"]),
                source_files=list(meta["source_files"]),
                config=DataConfig(**meta["config"]),
                stats=meta.get("stats", {}),
                path=str(path),
                **{k: tensors[k].to(device) for k in TENSOR_FIELDS if k in tensors},
            )
            pack.validate()
            pack = pack.compact()
            if check:
                check_invariants(pack)
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as exc:
            raise PackFileError(file, "", f"inconsistent pack ({type(exc).__name__}: {exc}); {again}") from None
        return pack


def pack_scenarios(scenarios: list[ScenarioData], config: DataConfig, stats: dict | None = None, *,
                   min_segments: int = 1, min_signals: int = 1) -> ScenarioPack:
    """Pad scenarios to common sizes (A = ``config.max_agents``; R and L = maxima, at least
    ``min_segments`` / ``min_signals``, so that packs of one dataset can share R and L) and stack
    them; the grid tables are concatenated without padding (compact layout).

    Raises:
        ScenarioError: if ``scenarios`` is empty.
    """
    if not scenarios:
        raise ScenarioError("", "", "no usable scenario to pack")
    S, A = len(scenarios), config.max_agents
    T = scenarios[0].traj_pos.shape[1]
    R = max(1, int(min_segments), max(s.num_segments for s in scenarios))
    NC = sum(s.num_cells for s in scenarios)
    L = max(1, int(min_signals), max(s.num_signals for s in scenarios))
    K, KE = config.grid_k, config.grid_edge_k
    shapes = {
        "offset": (S, 2), "traj_pos": (S, A, T, 2), "traj_heading": (S, A, T), "traj_vel": (S, A, T, 2),
        "traj_valid": (S, A, T), "agent_exists": (S, A), "agent_type": (S, A), "agent_length": (S, A),
        "agent_width": (S, A), "agent_goal": (S, A, 2), "agent_source_index": (S, A), "num_agents": (S,),
        "num_controlled": (S,), "sdc_index": (S,), "road_seg": (S, R, 4), "road_type": (S, R),
        "num_segments": (S,), "grid_origin": (S, 2), "grid_dims": (S, 2), "grid_road": (NC, K),
        "grid_edge": (NC, KE), "grid_start": (S,), "agent_interest": (S, A), "agent_predict": (S, A), "signal_lane": (S, L),
        "signal_pos": (S, L, 2), "signal_dir": (S, L, 2), "signal_state": (S, T, L), "signal_valid": (S, T, L),
        "num_signals": (S,),
    }
    pad = {"agent_type": -1, "agent_source_index": -1, "sdc_index": -1, "road_type": -1, "grid_road": -1,
           "grid_edge": -1, "signal_lane": -1}
    dtypes = dict(TENSOR_FIELDS, grid_road=grid_dtype(R), grid_edge=grid_dtype(R))
    out = {k: torch.full(shape, pad.get(k, 0), dtype=dtypes[k]) for k, shape in shapes.items()}
    row = 0
    per_agent = ("traj_pos", "traj_heading", "traj_vel", "traj_valid", "agent_exists", "agent_type", "agent_length",
                 "agent_width", "agent_goal", "agent_source_index", "agent_interest", "agent_predict")
    for i, sc in enumerate(scenarios):
        n, r, nc, nl = sc.num_agents, sc.num_segments, sc.num_cells, sc.num_signals
        for name in per_agent:
            out[name][i, :n] = getattr(sc, name)
        for name, v in (("offset", sc.offset), ("num_agents", n), ("num_controlled", sc.num_controlled),
                        ("sdc_index", sc.sdc_index), ("num_segments", r), ("grid_origin", sc.grid_origin),
                        ("grid_dims", sc.grid_dims), ("num_signals", nl)):
            out[name][i] = v
        out["road_seg"][i, :r] = sc.road_seg
        out["road_type"][i, :r] = sc.road_type
        out["grid_road"][row : row + nc] = sc.grid_road
        out["grid_edge"][row : row + nc] = sc.grid_edge
        out["grid_start"][i] = row
        row += nc
        for name in ("signal_lane", "signal_pos", "signal_dir"):
            out[name][i, :nl] = getattr(sc, name)
        out["signal_state"][i, :, :nl] = sc.signal_state
        out["signal_valid"][i, :, :nl] = sc.signal_valid
    pack = ScenarioPack(
        scenario_ids=[s.scenario_id for s in scenarios],
        source_files=[s.source_file for s in scenarios],
        config=config,
        stats=stats if stats is not None else {},
        **out,
    )
    pack.validate()
    return pack


def convert(paths, config: DataConfig = DataConfig(), *, on_error: str = "collect", limit: int | None = None,
            workers: int = 1, progress=None) -> ScenarioPack:
    """Convert scenario sources (JSON / TFRecord files, directories, globs) into one pack.

    Arguments and ``stats`` as :func:`gpusim.data.convert.convert_sources`; the pack's ``stats``
    are those, ``seconds`` included (padding too).

    Raises:
        ScenarioError: if no scenario is usable (the message lists the first reasons), or the
            first problem with ``on_error="raise"``. ValueError: bad arguments.
    """
    t0 = time.perf_counter()
    scenarios, stats = convert_sources(paths, config, on_error=on_error, limit=limit, workers=workers,
                                       progress=progress)
    if not scenarios:
        problems = stats["errors"] + stats["skipped"]
        listed = "; ".join(f"{p['file']}: {p['reason']}" for p in problems[:5])
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ScenarioError("", "", f"no usable scenario among {stats['files']} file(s): "
                                    f"{listed or 'no input'}{more}")
    pack = pack_scenarios(scenarios, config, stats)
    stats["seconds"] = round(time.perf_counter() - t0, 3)
    return pack
