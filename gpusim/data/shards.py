"""Sharded scenario packs on disk: many compact packs of at most N scenarios each, plus
an index with per-scenario metadata, so that a dataset larger than memory can be converted with
bounded memory and read one shard at a time.

Layout of a sharded pack directory::

    DIR/index.json          {"format": "gpusim-shards", "version": 2, "config": {...DataConfig},
                             "max_segments": R, "max_signals": L, "max_cells": NC,
                             "shards": [{"file": "shard-00000.pt", "scenarios": n, "bytes": b,
                                         "crc32c": c}, ...],
                             "scenarios": [{"id", "source", "shard", "row", "agents", "controlled",
                                            "segments", "cells", "signals"}, ...], "stats": {...}}
    DIR/shard-00000.pt      a ScenarioPack file (gpusim.data.pack), one per shard

Global scenario ``i`` is row ``scenarios[i]["row"]`` of shard ``scenarios[i]["shard"]``, in
conversion (input) order. Shards are written as they fill (memory: one shard of scenarios plus
the conversion's records in flight); the index is written last, atomically, so a directory
without ``index.json`` is an unfinished conversion (named as such when read:
"interrupted conversion: N orphan shard(s), no index.json"). Loading a shard reads only its file
and checks its size and CRC-32C against the index (:mod:`gpusim.data.integrity`); a shard that
differs is corrupt, truncated or left over from another conversion and is refused. Version-1
indexes (no CRC) still load, with a one-line note to convert again. A directory holds one dataset:
converting into one that holds another refuses unless ``overwrite`` (which removes it first).

:func:`concat_packs` joins packs of one dataset with common R and L (the index maxima), which is
how a streaming pool (:mod:`gpusim.data.pool`) and :meth:`ShardedPack.load_all` assemble scenarios
from several shards.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import warnings

import torch

from gpusim.config import DataConfig
from gpusim.data.build import ScenarioData
from gpusim.data.convert import convert_sources
from gpusim.data.errors import PackFileError, ScenarioError
from gpusim.data.integrity import check_one_dataset, clear_dataset, dataset_in, file_crc32c
from gpusim.data.layout import grid_dtype, starts_of
from gpusim.data.pack import TENSOR_FIELDS, ScenarioPack, pack_scenarios
from gpusim.data.pack_file import note_once
from gpusim.fileio import write_text

INDEX_FILE = "index.json"
SHARD_FORMAT = "gpusim-shards"
SHARD_VERSION = 2
#: Index versions read (1: no shard checksums).
_READABLE_INDEX = (1, 2)

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
                sharded-pack index (one line naming the file); the directory also holds a pack,
                or holds shards without an index (:func:`check_one_dataset`).
        """
        path = pathlib.Path(path)
        file = path / INDEX_FILE
        check_one_dataset(path)
        if not file.exists():
            raise FileNotFoundError(f"no sharded pack index at {file}")
        try:
            idx = json.loads(file.read_text())
            if idx.get("format") != SHARD_FORMAT or idx.get("version") not in _READABLE_INDEX:
                raise ValueError(f"not a {SHARD_FORMAT} index of version {_READABLE_INDEX}")
            if idx["version"] < 2:  # once per directory (its format-3 shards are not noted again)
                note_once(str(path), f"{path}: sharded pack written before checksums (index version 1; "
                                     f"corruption cannot be detected); convert the data again to add them")
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

    def load_shard(self, i: int, device="cpu", *, verify: bool = True) -> ScenarioPack:
        """Shard ``i`` as a pack (reads only its file; its size, and with ``verify`` its CRC-32C,
        are checked against the index, then the pack's invariants on ``device``).

        Raises:
            IndexError: no shard ``i``. PackFileError: the file is missing, truncated, corrupt,
                from another conversion or does not match the index (the message names the file).
        """
        if not 0 <= i < self.num_shards:
            raise IndexError(f"{self.path}: no shard {i} (0..{self.num_shards - 1})")
        file, entry = self.shard_file(i), self.shards[i]
        try:
            pack = ScenarioPack.load(file, device=device, verify=verify, expect_crc32c=entry.get("crc32c"),
                                     expect_bytes=entry.get("bytes"))
        except FileNotFoundError:
            raise PackFileError(file, "", "shard file missing; convert the data again") from None
        if pack.num_scenarios != entry["scenarios"] or pack.config != self.config:
            raise PackFileError(file, "", "shard does not match index.json; convert the data again")
        return pack

    def lost_message(self, bad: list[int]) -> str:
        """``"3 of 10 scenarios lost (7 left)"`` for the shards ``bad``."""
        lost = sum(self.shards[i]["scenarios"] for i in set(bad))
        return f"{lost} of {self.num_scenarios} scenarios lost ({self.num_scenarios - lost} left)"

    def check_files(self, verify: bool = True) -> list[tuple[int, str]]:
        """Check every shard file against the index without unpickling it: present, the recorded
        size and (with ``verify`` and a version-2 index) CRC-32C, one read of each file.

        Returns:
            ``[(shard, reason)]`` for the shards that differ (empty when all agree).
        """
        bad = []
        for i, entry in enumerate(self.shards):
            file = self.shard_file(i)
            if not file.is_file():
                bad.append((i, "missing"))
                continue
            size = file.stat().st_size
            if entry.get("bytes") is not None and size != entry["bytes"]:
                bad.append((i, f"{size} bytes where the index records {entry['bytes']} (truncated or replaced)"))
            elif verify and entry.get("crc32c") is not None and file_crc32c(file)[0] != entry["crc32c"]:
                bad.append((i, "checksum mismatch with the index (corrupt or from another conversion)"))
        return bad

    def load_all(self, device="cpu", *, verify: bool = True) -> ScenarioPack:
        """Every readable shard joined into one pack; a corrupt shard is left out with a
        ``UserWarning`` naming it and saying how many scenarios were lost.

        Raises:
            PackFileError: no shard could be read.
        """
        packs, bad = [], []
        for i in range(self.num_shards):
            try:
                packs.append(self.load_shard(i, verify=verify))
            except ScenarioError as exc:
                bad.append(i)
                warnings.warn(f"skipping {exc}; {self.lost_message(bad[-1:])}", stacklevel=2)
        if not packs:
            raise PackFileError(self.path, "", f"no readable shard ({self.lost_message(bad)}); convert the data again")
        pack = concat_packs(packs, self.max_segments, self.max_signals)
        stats = dict(self.stats)
        if bad:
            stats["bad_shards"] = [{"file": self.shards[i]["file"], "scenarios": self.shards[i]["scenarios"]}
                                   for i in bad]
        return dataclasses.replace(pack, path=str(self.path), stats=stats).to(device)


def _scenario_meta(sc: ScenarioData, shard: int, row: int) -> dict:
    return {"id": sc.scenario_id, "source": str(sc.source_file), "shard": shard, "row": row,
            "agents": int(sc.num_agents), "controlled": int(sc.num_controlled), "segments": int(sc.num_segments),
            "cells": int(sc.num_cells), "signals": int(sc.num_signals)}


def convert_sharded(paths, out_dir, config: DataConfig = DataConfig(), *, shard_size: int, on_error: str = "collect",
                    limit: int | None = None, workers: int = 1, progress=None,
                    overwrite: bool = False) -> tuple[ShardedPack, dict]:
    """Convert sources into a sharded pack directory (layout in the module docstring).

    Arguments as :func:`gpusim.data.convert.convert_sources`; ``shard_size`` scenarios per shard
    (the last one may hold fewer). Memory: one shard of scenarios plus the records in flight.
    Each shard's size and CRC-32C go into the index, which is written last and atomically.
    ``overwrite``: a directory that already holds a dataset (pack, sharded pack or the shards of
    an interrupted conversion) has those files removed first; without it, it is refused.

    Returns:
        ``(sharded, stats)``.

    Raises:
        ScenarioError: nothing usable (no index written). ValueError: ``shard_size < 1``.
        FileExistsError: ``out_dir`` holds a dataset and ``overwrite`` is False.
    """
    if int(shard_size) < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    out_dir = pathlib.Path(out_dir)
    held = dataset_in(out_dir)
    if held and not overwrite:
        raise FileExistsError(f"{out_dir} already holds {held}; pass overwrite=True (--overwrite) to replace it, "
                              f"or choose another directory")
    clear_dataset(out_dir)  # the index goes first: an interrupted rewrite must not look finished
    out_dir.mkdir(parents=True, exist_ok=True)
    buf: list[ScenarioData] = []
    shards, metas = [], []

    def flush():
        if not buf:
            return
        i = len(shards)
        pack = pack_scenarios(buf, config)
        name = f"shard-{i:05d}.pt"
        pack.save(out_dir / name)
        crc, size = file_crc32c(out_dir / name)
        shards.append({"file": name, "scenarios": len(buf), "bytes": size, "crc32c": crc})
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
    write_text(out_dir / INDEX_FILE, json.dumps(index, indent=1))
    return ShardedPack.open(out_dir), stats


def load_any(path, device="cpu", *, verify: bool = True) -> ScenarioPack:
    """A whole pack from a sharded directory (:meth:`ShardedPack.load_all`) or a pack file /
    directory (:meth:`ScenarioPack.load`), checksums verified unless ``verify`` is False.

    Raises:
        FileNotFoundError: nothing there. PackFileError: as the two loaders, and for a directory
            of two datasets or of an interrupted conversion (:func:`check_one_dataset`).
    """
    check_one_dataset(path)
    if is_sharded(path):
        return ShardedPack.open(path).load_all(device, verify=verify)
    return ScenarioPack.load(path, device=device, verify=verify)
