"""Integrity of scenario packs: checksums, invariants checked at load, one dataset per directory.

Checksums are CRC-32C (the Castagnoli polynomial, as in iSCSI and ext4 metadata; computed by
the ``crc32c`` package, hardware-accelerated where the CPU has the instruction):

* every pack file (format 4, :mod:`gpusim.data.pack`) stores in its meta ``"checksums"``: one
  CRC-32C per tensor (over its bytes in memory order) and one of the meta itself (its JSON with
  sorted keys, the checksums left out), so a mismatch names the tensor that changed;
* a sharded pack's ``index.json`` (version 2, :mod:`gpusim.data.shards`) stores each shard
  file's size and CRC-32C of its bytes, so a truncated, corrupt, missing or stale shard (a file
  left over from another conversion) is found by reading its bytes, without unpickling it.

Invariants (:func:`check_invariants`) are what the kernels index with: agent, segment and
signal counts within their padded axes, grid-table entries in ``[-1, num_segments)`` of their
scenario, type codes within their enums, finite positions. They are computed on the pack's device
with one host read for all of them together.

A directory holds one dataset: a pack (``pack.pt`` + ``meta.json``) or a sharded pack
(``index.json`` + ``shard-*.pt``). :func:`dataset_in` says what a directory holds (or that a
conversion into it was interrupted) and :func:`clear_dataset` removes those files only.
"""

from __future__ import annotations

import json
import pathlib

import torch

from gpusim.config import ObjectType, RoadType
from gpusim.data.errors import PackFileError
from gpusim.data.signals import SignalState

#: Name stored beside every checksum.
ALGORITHM = "crc32c"
#: File names a dataset directory may hold (pack, sharded pack, temporary files of either).
PACK_NAMES = ("pack.pt", "meta.json")
INDEX_NAME = "index.json"
SHARD_GLOB = "shard-*.pt"
_TMP_GLOBS = ("pack.pt*.tmp", "meta.json*.tmp", "index.json*.tmp", "shard-*.pt*.tmp")
#: Read size of :func:`file_crc32c` (4 MiB).
_CHUNK = 1 << 22


def _crc(data, value: int = 0) -> int:
    """``crc32c.crc32c(data, value)`` (the package is imported here, on first use).

    Raises:
        ImportError: the ``crc32c`` package (a declared dependency) is missing, with the fix.
    """
    try:
        import crc32c
    except ImportError:  # pragma: no cover - a declared dependency
        raise ImportError("scenario-pack checksums need the 'crc32c' package: pip install crc32c") from None
    return int(crc32c.crc32c(data, value))


def bytes_crc32c(data) -> int:
    """CRC-32C of a bytes-like object (bytes, memoryview, contiguous NumPy array)."""
    return _crc(data)


def file_crc32c(path) -> tuple[int, int]:
    """``(crc32c, size_in_bytes)`` of a file, read in 4 MiB chunks.

    Raises:
        OSError: the file cannot be read (FileNotFoundError when missing).
    """
    crc, size = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = _crc(chunk, crc)
            size += len(chunk)
    return crc, size


def tensor_crc32c(t: torch.Tensor) -> int:
    """CRC-32C of a tensor's bytes in row-major order (copied to the CPU if it is elsewhere)."""
    flat = t.detach().reshape(-1).contiguous()
    if flat.device.type != "cpu":
        flat = flat.cpu()
    return bytes_crc32c(flat.view(torch.uint8).numpy()) if flat.numel() else 0


def meta_crc32c(meta: dict) -> int:
    """CRC-32C of a pack's meta (JSON, sorted keys) without its ``"checksums"`` entry."""
    plain = {k: v for k, v in meta.items() if k != "checksums"}
    return bytes_crc32c(json.dumps(plain, sort_keys=True, default=str).encode())


def pack_checksums(meta: dict, tensors: dict[str, torch.Tensor]) -> dict:
    """The ``"checksums"`` entry of a pack's meta: ``{"algorithm": "crc32c", "meta": int,
    "tensors": {name: int}}`` for ``tensors`` (CPU tensors as saved)."""
    return {"algorithm": ALGORITHM, "meta": meta_crc32c(meta),
            "tensors": {k: tensor_crc32c(v) for k, v in tensors.items()}}


def checksum_mismatch(meta: dict, tensors: dict[str, torch.Tensor]) -> str | None:
    """The first field whose stored checksum differs from the data (``"meta"`` or a tensor name,
    or ``"checksums"`` when the entry itself is malformed); None when all agree."""
    stored = meta.get("checksums")
    if not isinstance(stored, dict) or not isinstance(stored.get("tensors"), dict):
        return "checksums"
    if stored.get("meta") != meta_crc32c(meta):
        return "meta"
    for name, value in tensors.items():
        if stored["tensors"].get(name) != tensor_crc32c(value):
            return name
    missing = set(stored["tensors"]) - set(tensors)
    return sorted(missing)[0] if missing else None


# ---------------------------------------------------------------------------------- invariants
def _checks(p) -> list[tuple[str, str, torch.Tensor]]:
    """``(field, rule, ok)`` for every invariant of pack ``p``: ``ok`` is a bool mask over the
    field's scenarios (or a 0-dim bool for the large tensors, reduced without temporaries)."""
    S, A, R, L = p.num_scenarios, p.max_agents, p.road_seg.shape[1], p.max_signals
    dev = p.traj_pos.device
    na, nc, ns = p.num_agents.long(), p.num_controlled.long(), p.num_segments.long()  # [S]: cheap
    slot = torch.arange(A, device=dev)
    n_obj, n_road, n_sig = len(ObjectType), len(RoadType), len(SignalState)

    def within(t, lo, hi):  # per scenario: every entry in [lo, hi)
        return ((t >= lo) & (t < hi)).reshape(S, -1).all(1)

    out = [
        ("num_agents", f"in [0, {A}]", within(na, 0, A + 1)),
        ("num_controlled", "in [0, num_agents]", (nc >= 0) & (nc <= na)),
        ("sdc_index", "in [-1, num_agents)", (p.sdc_index >= -1) & (p.sdc_index.long() < na)),
        ("agent_exists", "a prefix of num_agents slots", (p.agent_exists == (slot[None, :] < na[:, None])).all(1)),
        ("agent_type", f"in [-1, {n_obj})", within(p.agent_type, -1, n_obj)),
        ("traj_valid", "only on existing slots", ~(p.traj_valid & ~p.agent_exists[:, :, None]).reshape(S, -1).any(1)),
        ("num_segments", f"in [0, {R}]", within(ns, 0, R + 1)),
        ("road_type", f"in [-1, {n_road})", within(p.road_type, -1, n_road)),
        ("grid_dims", "at least 1 cell each way", (p.grid_dims >= 1).all(1)),
        ("num_signals", f"in [0, {L}]", within(p.num_signals, 0, L + 1)),
        ("signal_state", f"in [0, {n_sig})", within(p.signal_state, 0, n_sig)),
        ("signal_lane", ">= -1", (p.signal_lane >= -1).all(1)),
        ("agent_length", ">= 0", (p.agent_length >= 0).all(1)),
        ("agent_width", ">= 0", (p.agent_width >= 0).all(1)),
    ]
    for name in ("offset", "traj_pos", "traj_heading", "traj_vel", "agent_goal", "agent_length", "agent_width",
                 "road_seg", "grid_origin", "signal_pos", "signal_dir"):
        t = getattr(p, name)  # NaN propagates through amax; +-inf shows at an end (no temporary)
        out.append((name, "finite", torch.isfinite(t.amax()) & torch.isfinite(t.amin()) if t.numel()
                    else torch.ones((), dtype=torch.bool, device=dev)))
    if p.is_compact:  # per-row min / max (no [NCT, K] temporaries): the tables are most of a pack
        rows_seg = torch.repeat_interleave(ns, p.num_cells.to(dev), output_size=p.grid_road.shape[0])
        for name in ("grid_road", "grid_edge"):
            g = getattr(p, name)
            ok = ((g.amin(1) >= -1).all() & (g.amax(1).long() < rows_seg).all() if g.shape[1]
                  else torch.ones((), dtype=torch.bool, device=dev))
            out.append((name, "segment ids in [-1, num_segments) of their scenario", ok))
    return out


def check_invariants(pack) -> None:
    """Check the invariants of a :class:`~gpusim.data.pack.ScenarioPack` (module docstring) on its
    device: one host read for all of them (and a few more to describe the first failure).

    Shapes and dtypes are :meth:`ScenarioPack.validate`'s part (call it first).

    Raises:
        ValueError: ``"<field>: <where and what>, expected <rule>"`` for the first failing
            invariant, naming the scenario (index and id) where it can.
    """
    checks = _checks(pack)
    ok = torch.stack([c[2].all() for c in checks]).tolist()
    for (name, rule, mask), good in zip(checks, ok):
        if not good:
            raise ValueError(f"{name}: {_first_bad(pack, name, mask)}, expected {rule}")


def _first_bad(p, name: str, mask: torch.Tensor) -> str:
    """Where ``name`` first breaks its invariant (for the message; failure path only)."""
    if name in ("grid_road", "grid_edge"):
        g = getattr(p, name).long()
        rows_seg = torch.repeat_interleave(p.num_segments.long(), p.num_cells.to(g.device))
        bad = ((g < -1) | (g >= rows_seg[:, None])).any(1).nonzero()
        row = int(bad[0])
        s = int(torch.searchsorted(p.grid_start.cpu(), torch.tensor([row]), right=True)[0]) - 1
        worst = g[row][(g[row] < -1) | (g[row] >= rows_seg[row])][0]
        return (f"row {row} (scenario {s}, {p.scenario_ids[s]!r}) holds {int(worst)} with "
                f"{int(p.num_segments[s])} segment(s)")
    t = getattr(p, name)
    if mask.dim() == 0:  # a finite check over the whole tensor
        idx = (~torch.isfinite(t)).nonzero()[0].tolist()
        return f"{float(t[tuple(idx)])} at index {idx} (scenario {idx[0]}, {p.scenario_ids[idx[0]]!r})"
    s = int((~mask).nonzero()[0])
    value = t[s].tolist() if t[s].numel() <= 4 else "a value"
    return f"scenario {s} ({p.scenario_ids[s]!r}) holds {value}"


# ---------------------------------------------------------------------------------- file kinds
def file_kind(path) -> str | None:
    """What a file is, from its first bytes, for messages about a file given in the wrong place:
    ``"a JSON file"``, ``"a TFRecord file"`` (a record header whose length CRC matches),
    ``"a gzip-compressed TFRecord file"`` / ``"an xz-compressed JSON file"`` (the name tells what
    was compressed), ``"a torch (zip) file"``, ``"an empty file"``, ``"a directory"``; None when
    unreadable or not recognised."""
    p = pathlib.Path(path)
    if p.is_dir():
        return "a directory"
    try:
        with open(p, "rb") as f:
            head = f.read(64)
    except OSError:
        return None
    if not head:
        return "an empty file"
    if head.startswith(b"PK\x03\x04"):
        return "a torch (zip) file"
    for magic, packer in ((b"\x1f\x8b", "gzip"), (b"\xfd7zXZ\x00", "xz")):
        if head.startswith(magic):
            what = " TFRecord" if ".tfrecord" in p.name else " JSON" if ".json" in p.name else ""
            return f"a{'n' if packer == 'xz' else ''} {packer}-compressed{what} file"
    if head.lstrip()[:1] in (b"{", b"["):
        return "a JSON file"
    if len(head) >= 12:
        from gpusim.data.tfrecord import masked_crc  # lazy: tfrecord is a leaf reader

        if masked_crc(head[:8]) == int.from_bytes(head[8:12], "little"):
            return "a TFRecord file"
    return None


def payload_kind(payload) -> str | None:
    """``"a scenario pack (gpusim.data)"`` when a ``torch.load`` result is a pack's payload, else
    None (for messages of loaders of other torch files)."""
    if isinstance(payload, dict) and isinstance(payload.get("meta"), dict) and "tensors" in payload:
        return "a scenario pack (gpusim.data)"
    return None


# ---------------------------------------------------------------------------------- directories
def dataset_in(path) -> str | None:
    """What dataset files the directory ``path`` holds, in words, or None when it holds none
    (or is not a directory): ``"a sharded pack (index.json, 3 shard file(s))"``, ``"a pack
    (pack.pt)"``, ``"the shards of an interrupted conversion: 2 orphan shard(s), no
    index.json"``, or both kinds."""
    d = pathlib.Path(path)
    if not d.is_dir():
        return None
    shards = sorted(d.glob(SHARD_GLOB))
    has_index = (d / INDEX_NAME).exists()
    kinds = []
    if has_index:
        kinds.append(f"a sharded pack ({INDEX_NAME}, {len(shards)} shard file(s))")
    elif shards:
        kinds.append(f"the shards of an {interrupted(len(shards))}")
    if any((d / n).exists() for n in PACK_NAMES):
        kinds.append(f"a pack ({', '.join(n for n in PACK_NAMES if (d / n).exists())})")
    return " and ".join(kinds) or None


def interrupted(num_orphans: int) -> str:
    """The words for a directory of shards without an index."""
    return f"interrupted conversion: {num_orphans} orphan shard(s), no {INDEX_NAME}"


def orphan_shards(path) -> list[pathlib.Path]:
    """Shard files of a directory without ``index.json`` (an interrupted conversion); [] else."""
    d = pathlib.Path(path)
    if not d.is_dir() or (d / INDEX_NAME).exists():
        return []
    return sorted(d.glob(SHARD_GLOB))


def clear_dataset(path) -> int:
    """Remove the dataset files of directory ``path`` (index first, so that an interruption
    leaves a recognisably unfinished directory; then shards, pack, meta and temporary files;
    other files are kept). Returns how many files were removed."""
    d = pathlib.Path(path)
    if not d.is_dir():
        return 0
    files = [d / INDEX_NAME] + sorted(d.glob(SHARD_GLOB)) + [d / n for n in PACK_NAMES]
    files += [f for g in _TMP_GLOBS for f in sorted(d.glob(g))]
    n = 0
    for f in files:
        if f.is_file():
            f.unlink()
            n += 1
    return n


def check_one_dataset(path) -> None:
    """Refuse a directory that cannot be read as one dataset: a sharded pack and a pack side by
    side (which one is meant?), or shards without an index (an interrupted conversion). A path
    that is not a directory passes.

    Raises:
        PackFileError: naming the directory, what it holds and ``--overwrite``.
    """
    p = pathlib.Path(path)
    orphans = orphan_shards(p)
    has_pack = p.is_dir() and (p / PACK_NAMES[0]).exists()
    if orphans and not has_pack:
        raise PackFileError(p, "", f"{interrupted(len(orphans))} — rerun the conversion with --overwrite")
    if has_pack and ((p / INDEX_NAME).exists() or orphans):
        raise PackFileError(p, "", f"holds two datasets, {dataset_in(p)}; convert again into it with "
                                   f"--overwrite (or into an empty directory)")
