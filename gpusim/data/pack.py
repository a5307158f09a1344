"""`ScenarioPack`: padded tensors for many WOMD scenarios, ready to move to a device.

Axes: S scenarios, A = ``DataConfig.max_agents`` agent slots, T = 91 logged steps,
R = road segments (padded to the largest scenario), NC = grid cells (padded), K = ``grid_k``,
KE = ``grid_edge_k``.

Agent slots are ordered: the ``num_controlled[s]`` controlled agents first (self-driving car first
when it is controllable), then the log-replayed experts, then padding (``agent_exists = False``).
So policy slot ``c`` of a world running scenario ``s`` is agent slot ``c``, active when
``c < num_controlled[s]``.

Coordinates are centred per scenario: ``world = local + offset[s]`` (float64 offset), which keeps
float32 at centimetre precision. Units: m, rad, m/s.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import tempfile
from dataclasses import dataclass, field

import torch

from gpusim.config import DataConfig

PACK_FILE = "pack.pt"
META_FILE = "meta.json"
FORMAT_VERSION = 1

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
    "grid_road": torch.int32,  # [S, NC, K] nearest segments to each cell centre, sorted, -1 pad
    "grid_edge": torch.int32,  # [S, NC, KE] nearest road-edge segments to each cell centre, -1 pad
}


@dataclass
class ScenarioPack:
    """Padded tensors of S scenarios (see the module docstring for axes, order and units).

    Attributes:
        scenario_ids: S scenario ids (``scenario_id`` or ``name`` from the JSON, else the file stem).
        source_files: S source file paths.
        config: the :class:`DataConfig` the pack was built with.
        cell_size: grid cell edge (m), equal to ``config.grid_cell_size``.
        stats: conversion counters (ignored objects by type, truncated polylines, ...).
        All other attributes: tensors as listed in ``TENSOR_FIELDS``.
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
        """All tensor fields by name."""
        return {name: getattr(self, name) for name in TENSOR_FIELDS}

    def nbytes(self) -> int:
        """Bytes held by the tensors."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def to(self, device) -> "ScenarioPack":
        """A copy with every tensor on ``device``."""
        moved = {k: v.to(device) for k, v in self.tensors().items()}
        return dataclasses.replace(self, **moved)

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
            "grid_origin": (S, 2), "grid_dims": (S, 2),
        }
        for name, dtype in TENSOR_FIELDS.items():
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"ScenarioPack.{name} is not a tensor")
            if t.dtype != dtype:
                raise ValueError(f"ScenarioPack.{name} has dtype {t.dtype}, expected {dtype}")
            if name in expect and tuple(t.shape) != expect[name]:
                raise ValueError(f"ScenarioPack.{name} has shape {tuple(t.shape)}, expected {expect[name]}")
        R = self.road_seg.shape[1]
        if tuple(self.road_seg.shape) != (S, R, 4) or tuple(self.road_type.shape) != (S, R):
            raise ValueError("ScenarioPack.road_seg / road_type shapes disagree")
        NC = self.grid_road.shape[1]
        if self.grid_road.shape[:2] != (S, NC) or self.grid_edge.shape[:2] != (S, NC):
            raise ValueError("ScenarioPack.grid_road / grid_edge shapes disagree")
        if len(self.source_files) != S:
            raise ValueError("ScenarioPack.source_files length differs from scenario_ids")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_json(cls, paths, config: DataConfig = DataConfig(), *, on_error: str = "collect") -> "ScenarioPack":
        """Convert WOMD JSON scenarios (files, directories or globs) into a pack.

        Delegates to :func:`gpusim.data.build.convert` (see there for the selection rules and the
        ``stats`` keys). Bad files are collected in ``pack.stats["errors"]`` (``{"file",
        "reason"}``) and scenarios without a controllable agent in ``pack.stats["skipped"]``
        while the good files are converted; ``on_error="raise"`` raises on the first bad file.

        Raises:
            ScenarioError: if no scenario is usable (or on the first bad file with ``on_error="raise"``).
        """
        from gpusim.data.build import convert

        return convert(paths, config, on_error=on_error)

    # ------------------------------------------------------------------ persistence
    def save(self, path) -> pathlib.Path:
        """Write the pack to a directory (``pack.pt`` + ``meta.json``) or to a single ``.pt`` file.

        Writes are atomic (temporary file, then rename). Returns the path written.
        """
        path = pathlib.Path(path)
        meta = {
            "format_version": FORMAT_VERSION,
            "scenario_ids": list(self.scenario_ids),
            "source_files": [str(f) for f in self.source_files],
            "config": dataclasses.asdict(self.config),
            "stats": self.stats,
        }
        payload = {"meta": meta, "tensors": {k: v.detach().cpu() for k, v in self.tensors().items()}}
        if path.suffix == ".pt":
            path.parent.mkdir(parents=True, exist_ok=True)
            _atomic_torch_save(payload, path)
            return path
        path.mkdir(parents=True, exist_ok=True)
        _atomic_torch_save(payload, path / PACK_FILE)
        tmp = path / (META_FILE + ".tmp")
        tmp.write_text(json.dumps(meta, indent=1))
        os.replace(tmp, path / META_FILE)
        return path

    @classmethod
    def load(cls, path, device="cpu") -> "ScenarioPack":
        """Load a pack written by :meth:`save` (directory or ``.pt`` file) onto ``device``.

        Raises:
            FileNotFoundError: if nothing is there.
            ValueError: if the file is not a gpusim pack or has another format version.
        """
        path = pathlib.Path(path)
        file = path if path.suffix == ".pt" else path / PACK_FILE
        if not file.exists():
            raise FileNotFoundError(f"no scenario pack at {file}")
        payload = torch.load(file, map_location="cpu", weights_only=True)
        if not isinstance(payload, dict) or "meta" not in payload or "tensors" not in payload:
            raise ValueError(f"{file} is not a gpusim scenario pack")
        meta = payload["meta"]
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{file}: pack format {meta.get('format_version')} != {FORMAT_VERSION}; convert the data again"
            )
        pack = cls(
            scenario_ids=list(meta["scenario_ids"]),
            source_files=list(meta["source_files"]),
            config=DataConfig(**meta["config"]),
            stats=meta.get("stats", {}),
            **{k: payload["tensors"][k].to(device) for k in TENSOR_FIELDS},
        )
        pack.validate()
        return pack


def _atomic_torch_save(obj, path: pathlib.Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
