"""Sharded scenario packs on disk (issue 21): many compact packs of at most N scenarios each, plus
an index with per-scenario metadata, so that a dataset larger than memory can be converted with
bounded memory and read one shard at a time.

Layout of a sharded pack directory::

    DIR/index.json          {"format": "gpusim-shards", "version": 1, "config": {...DataConfig},
                             "max_segments": R, "max_signals": L, "max_cells": NC,
                             "shards": [{"file": "shard-00000.pt", "scenarios": n, "bytes": b}, ...],
                             "scenarios": [{"id", "source", "shard", "row", "agents", "controlled",
                                            "segments", "cells", "signals"}, ...], "stats": {...}}
    DIR/shard-00000.pt      a format-3 ScenarioPack file (gpusim.data.pack), one per shard

Global scenario ``i`` is row ``scenarios[i]["row"]`` of shard ``scenarios[i]["shard"]``, in
conversion (input) order. Shards are written as they fill (memory: one shard of scenarios plus
the conversion's records in flight); the index is written last, atomically, so a directory
without ``index.json`` is an unfinished conversion. Loading a shard reads only its file.

:func:`concat_packs` joins packs of one dataset with common R and L (the index maxima), which is
how a streaming pool (:mod:`gpusim.data.pool`) and :meth:`ShardedPack.load_all` assemble scenarios
from several shards.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import warnings

import torch

from gpusim.config import DataConfig
from gpusim.data.build import ScenarioData
from gpusim.data.convert import convert_sources
from gpusim.data.errors import PackFileError, ScenarioError
from gpusim.data.layout import grid_dtype, starts_of
from gpusim.data.pack import TENSOR_FIELDS, ScenarioPack, pack_scenarios

INDEX_FILE = "index.json"
SHARD_FORMAT = "gpusim-shards"
SHARD_VERSION = 1

#: Padding values of the per-scenario tensors with an R or L axis (concat_packs).
_SEG_PAD = {"road_seg": 0.0, "road_type": -1}
_SIG_PAD = {"signal_lane": -1, "signal_pos": 0.0, "signal_dir": 0.0, "signal_state": 0, "signal_valid": False}


def is_sharded(path) -> bool:
    """``path`` is a directory holding a sharded pack's ``index.json``."""
    p = pathlib.Path(path)
    return p.is_dir() and (p / INDEX_FILE).exists()


def _pad_axis(t: torch.Tensor, axis: int, size: int, value) -> torch.Tensor:
    if t.shape[axis] >= size:
        return t
    shape = list(t.shape)
    shape[axis] = size - t.shape[axis]
    return torch.cat([t, torch.full(shape, value, dtype=t.dtype, device=t.device)], dim=axis)


def concat_packs(packs: list[ScenarioPack], min_segments: int = 1, min_signals: int = 1) -> ScenarioPack:
    """One compact pack of the scenarios of ``packs`` in order (same ``DataConfig``), R and L
    padded to the largest of the packs and at least ``min_segments`` / ``min_signals``.

    Raises:
        ValueError: no pack, or packs converted with different configs / agent slots.
    """
    if not packs:
        raise ValueError("concat_packs: no pack")
    packs = [p.compact() for p in packs]
    first = packs[0]
    for p in packs[1:]:
        if p.config != first.config or p.max_agents != first.max_agents or p.num_steps != first.num_steps:
            raise ValueError(f"concat_packs: {p.path or 'a pack'} was converted with another config than "
                             f"{first.path or 'the first pack'}")
    R = max([int(min_segments)] + [p.road_seg.shape[1] for p in packs])
    L = max([int(min_signals)] + [p.max_signals for p in packs])
    gd = grid_dtype(R)
    out = {}
    for name in TENSOR_FIELDS:
        parts = [getattr(p, name) for p in packs]
        if name in _SEG_PAD:
            parts = [_pad_axis(t, 1, R, _SEG_PAD[name]) for t in parts]
        elif name in _SIG_PAD:
            axis = 2 if name in ("signal_state", "signal_valid") else 1
            parts = [_pad_axis(t, axis, L, _SIG_PAD[name]) for t in parts]
        elif name in ("grid_road", "grid_edge"):
            parts = [t.to(gd) for t in parts]
        if name != "grid_start":
            out[name] = torch.cat(parts, 0)
    out["grid_start"] = starts_of((out["grid_dims"].to(torch.int64)).prod(1))
    return ScenarioPack(
        scenario_ids=[i for p in packs for i in p.scenario_ids],
        source_files=[f for p in packs for f in p.source_files],
        config=first.config, stats={}, **out)


@dataclasses.dataclass
class ShardedPack:
    """A sharded pack directory, opened from its index (no shard is read until asked for).

    Attributes:
        path: the directory. config: the :class:`DataConfig` of every shard.
        shards: ``[{"file", "scenarios", "bytes"}]``. scenarios: per-scenario metadata (module
            docstring). max_segments / max_signals / max_cells: maxima over the dataset (R, L, NC).
        stats: the conversion's counters.
    """

    path: pathlib.Path
    config: DataConfig
    shards: list
    scenarios: list
    max_segments: int
    max_signals: int
    max_cells: int
    stats: dict

    @classmethod
    def open(cls, path) -> "ShardedPack":
        """Read ``DIR/index.json``.

        Raises:
            FileNotFoundError: no index. PackFileError: the index is not valid JSON or not a
                sharded-pack index (one line naming the file).
        """
        path = pathlib.Path(path)
        file = path / INDEX_FILE
        if not file.exists():
            raise FileNotFoundError(f"no sharded pack index at {file}")
        try:
            idx = json.loads(file.read_text())
            if idx.get("format") != SHARD_FORMAT or idx.get("version") != SHARD_VERSION:
                raise ValueError(f"not a {SHARD_FORMAT} v{SHARD_VERSION} index")
            return cls(path=path, config=DataConfig(**idx["config"]), shards=list(idx["shards"]),
                       scenarios=list(idx["scenarios"]), max_segments=int(idx["max_segments"]),
                       max_signals=int(idx["max_signals"]), max_cells=int(idx["max_cells"]),
                       stats=dict(idx.get("stats", {})))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PackFileError(file, "", f"bad sharded-pack index ({exc}); convert the data again") from None

    @property
    def num_scenarios(self) -> int:
        return len(self.scenarios)

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def scenario_ids(self) -> list[str]:
        return [s["id"] for s in self.scenarios]

    def shard_file(self, i: int) -> pathlib.Path:
        return self.path / self.shards[i]["file"]

    def shard_scenarios(self, i: int) -> list[int]:
        """Global indices of the scenarios of shard ``i``, in row order."""
        return [g for g, s in enumerate(self.scenarios) if s["shard"] == i]

    def load_shard(self, i: int, device="cpu") -> ScenarioPack:
        """Shard ``i`` as a pack (reads only its file).

        Raises:
            IndexError: no shard ``i``. PackFileError: the file is missing, corrupt or does not
                match the index (the message names the file).
        """
        if not 0 <= i < self.num_shards:
            raise IndexError(f"{self.path}: no shard {i} (0..{self.num_shards - 1})")
        file = self.shard_file(i)
        try:
            pack = ScenarioPack.load(file, device=device)
        except FileNotFoundError:
            raise PackFileError(file, "", "shard file missing; convert the data again") from None
        if pack.num_scenarios != self.shards[i]["scenarios"] or pack.config != self.config:
            raise PackFileError(file, "", "shard does not match index.json; convert the data again")
        return pack

    def load_all(self, device="cpu") -> ScenarioPack:
        """Every readable shard joined into one pack (a corrupt shard is named in a warning and
        left out).

        Raises:
            PackFileError: no shard could be read.
        """
        packs = []
        for i in range(self.num_shards):
            try:
                packs.append(self.load_shard(i))
            except ScenarioError as exc:
                warnings.warn(f"skipping {exc}", stacklevel=2)
        if not packs:
            raise PackFileError(self.path, "", "no readable shard")
        pack = concat_packs(packs, self.max_segments, self.max_signals)
        return dataclasses.replace(pack, path=str(self.path), stats=self.stats).to(device)


def _scenario_meta(sc: ScenarioData, shard: int, row: int) -> dict:
    return {"id": sc.scenario_id, "source": str(sc.source_file), "shard": shard, "row": row,
            "agents": int(sc.num_agents), "controlled": int(sc.num_controlled), "segments": int(sc.num_segments),
            "cells": int(sc.num_cells), "signals": int(sc.num_signals)}


def convert_sharded(paths, out_dir, config: DataConfig = DataConfig(), *, shard_size: int, on_error: str = "collect",
                    limit: int | None = None, workers: int = 1, progress=None) -> tuple[ShardedPack, dict]:
    """Convert sources into a sharded pack directory (layout in the module docstring).

    Arguments as :func:`gpusim.data.convert.convert_sources`; ``shard_size`` scenarios per shard
    (the last one may hold fewer). Memory: one shard of scenarios plus the records in flight.

    Returns:
        ``(sharded, stats)``.

    Raises:
        ScenarioError: nothing usable (no index written). ValueError: ``shard_size < 1``.
    """
    if int(shard_size) < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if (out_dir / INDEX_FILE).exists():
        (out_dir / INDEX_FILE).unlink()  # an interrupted rewrite must not look finished
    buf: list[ScenarioData] = []
    shards, metas = [], []

    def flush():
        if not buf:
            return
        i = len(shards)
        pack = pack_scenarios(buf, config)
        name = f"shard-{i:05d}.pt"
        pack.save(out_dir / name)
        shards.append({"file": name, "scenarios": len(buf), "bytes": (out_dir / name).stat().st_size})
        metas.extend(_scenario_meta(sc, i, r) for r, sc in enumerate(buf))
        buf.clear()

    def take(sc):
        buf.append(sc)
        if len(buf) >= shard_size:
            flush()

    _, stats = convert_sources(paths, config, on_error=on_error, limit=limit, workers=workers, progress=progress,
                               on_scenario=take)
    flush()
    if not shards:
        problems = stats["errors"] + stats["skipped"]
        listed = "; ".join(f"{p['file']}: {p['reason']}" for p in problems[:5])
        raise ScenarioError("", "", f"no usable scenario among {stats['files']} file(s): {listed or 'no input'}")
    index = {"format": SHARD_FORMAT, "version": SHARD_VERSION, "config": dataclasses.asdict(config),
             "max_segments": max(m["segments"] for m in metas), "max_signals": max(m["signals"] for m in metas),
             "max_cells": max(m["cells"] for m in metas), "shards": shards, "scenarios": metas, "stats": stats}
    tmp = out_dir / (INDEX_FILE + ".tmp")
    tmp.write_text(json.dumps(index, indent=1))
    os.replace(tmp, out_dir / INDEX_FILE)
    return ShardedPack.open(out_dir), stats


def load_any(path, device="cpu") -> ScenarioPack:
    """A whole pack from a sharded directory (:meth:`ShardedPack.load_all`) or a pack file /
    directory (:meth:`ScenarioPack.load`)."""
    if is_sharded(path):
        return ShardedPack.open(path).load_all(device)
    return ScenarioPack.load(path, device=device)
