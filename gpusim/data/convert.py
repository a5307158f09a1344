"""Batch conversion: expand sources, stream scenarios from JSON files and TFRecord shards, build
each into a :class:`~gpusim.data.build.ScenarioData` (optionally in worker processes), collect
errors and counters. Padding into a pack is done by :mod:`gpusim.data.pack` (which imports this
module; this module does not import the pack).

Inputs: ``.json`` / ``.json.gz`` / ``.json.xz`` (one scenario per file, GPUDrive layout) and
TFRecord files of WOMD ``Scenario`` protos: names ending in ``.tfrecord`` or ``.tfrecord.gz``, or
shards like ``training.tfrecord-00000-of-01000`` (plain or gzip-compressed; compression is
detected from the content). TFRecords are read one record at a time; with ``workers > 1`` at most
``2 * workers`` records are in flight, so memory stays bounded by the scenarios kept plus a few
records, whatever the shard size.

A split's scenes from a WOMD download (``convert --split``): :func:`read_split_entries` reads a
split file's entries, :func:`select_split` finds each scene by WOMD record or scenario id and
checks it against the entry's fingerprint, :func:`build_selected` builds the scenes found.
"""

from __future__ import annotations

import collections
import glob as _glob
import json
import math
import multiprocessing
import os
import pathlib
import pickle
import re
import time
import warnings

import torch

from gpusim.config import DataConfig
from gpusim.data.build import ScenarioData, build_scenario
from gpusim.data.errors import NoControllableAgentError, ScenarioError
from gpusim.data.integrity import dataset_in, interrupted, orphan_shards
from gpusim.data.parse import is_scenario_file, read_scenario
from gpusim.data.parse_proto import decode_scenario, parse_record, proto_to_raw, track_fingerprint
from gpusim.data.tfrecord import is_tfrecord_file, iter_records


#: The reason given for a file of 0 bytes (counted in ``stats["empty_files"]``).
EMPTY_FILE = "empty file (0 bytes)"

#: Summed per-scenario counters reported in ``stats`` (``bad_size_objects``: objects dropped for a
#: box size that is not a finite number > 0, each also listed in ``stats["dropped_objects"]``).
COUNTERS = ("bad_size_objects", "never_valid_objects", "controllable", "controllable_over_cap",
            "dropped_over_max_agents",
            "road_points_in", "road_points_kept", "single_point_polylines", "zero_length_segments",
            "signals", "signal_stop_points_moved", "unknown_signal_states", "signals_without_lane")


#: Name endings of documentation files that data folders carry next to their scenarios.
DOC_SUFFIXES = (".md", ".txt", ".rst", ".html", ".pdf")


def is_source_file(path) -> bool:
    """A JSON scenario file or a TFRecord file (by name)."""
    return is_scenario_file(path) or is_tfrecord_file(path)


def is_documentation_file(path) -> bool:
    """True for a file that documents a data folder rather than holding scenarios: a name starting
    with ``README`` or ``LICENSE`` (any case) or ending in one of :data:`DOC_SUFFIXES`, and not a
    scenario or TFRecord name. A shell glob such as ``convert data/womd_tfrecord/*`` passes such
    files along with the data; :func:`expand_sources` leaves them out without an error."""
    name = pathlib.Path(path).name.lower()
    if is_source_file(path):
        return False
    return name.startswith(("readme", "license")) or name.endswith(DOC_SUFFIXES)


def expand_sources(paths, ignored: list | None = None) -> tuple[list[str], list[dict]]:
    """Expand files, directories (their JSON and TFRecord files, not recursive) and glob patterns
    into a sorted, de-duplicated file list. Documentation files named directly or matched by a
    pattern (:func:`is_documentation_file`: ``README*``, ``*.md``, ...) are left out quietly; other
    files named directly are kept whatever their name (read as JSON unless TFRecord-named).

    Args:
        paths: one path-like / string or a sequence of them.
        ignored: optional list that receives the documentation files left out (as given); when
            nothing but documentation was given, each is an error instead.

    Returns:
        ``(files, errors)``: errors are ``{"file", "reason"}`` for sources that match nothing.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files, errors, seen, docs = [], [], set(), []

    def add(p):
        if is_documentation_file(p):
            docs.append(str(p))
            return
        key = os.path.abspath(p)
        if key not in seen:
            seen.add(key)
            files.append(str(p))

    for src in paths:
        src = str(src)
        p = pathlib.Path(src)
        if p.is_dir():
            found = sorted(str(c) for c in p.iterdir() if c.is_file() and is_source_file(c))
            if not found:
                errors.append({"file": src, "reason": _no_sources_reason(p)})
            for c in found:
                add(c)
        elif p.is_file():
            add(src)
        elif any(ch in src for ch in "*?["):
            found = [c for c in sorted(_glob.glob(src)) if os.path.isfile(c)]
            if not any(not is_documentation_file(c) for c in found):
                errors.append({"file": src, "reason": "pattern matches no scenario file"})
            for c in found:
                add(c)
        else:
            errors.append({"file": src, "reason": "no such file or directory"})
    if not files and not errors:  # only documentation was given: say so rather than convert nothing
        errors = [{"file": d, "reason": "a documentation file, not a scenario (.json*, .tfrecord*)"} for d in docs]
    elif ignored is not None:
        ignored.extend(docs)
    return files, errors


def _no_sources_reason(d: pathlib.Path) -> str:
    """Why directory ``d`` gives no scenario source: it holds a dataset (a pack, a sharded pack,
    the shards of an interrupted conversion) or nothing readable."""
    held, orphans = dataset_in(d), orphan_shards(d)
    if orphans and not (d / "pack.pt").exists():
        return f"{interrupted(len(orphans))} — rerun the conversion with --overwrite"
    if held:
        return f"holds {held}, not scenario sources: load it as a pack"
    return "directory holds no .json/.json.gz/.json.xz/.tfrecord file"


def _tasks(files):
    """Yield ``(file, record_or_None, payload_or_error_or_None, bytes_done)`` in order: one per JSON
    file, one per TFRecord record (payload bytes, or the framing error); an empty file, or a
    TFRecord file without a record, gives one error naming it."""
    done = 0
    for f in files:
        size = os.path.getsize(f) if os.path.exists(f) else 0
        if size == 0 and os.path.exists(f):
            yield f, None, ScenarioError(f, "", EMPTY_FILE), done
        elif is_tfrecord_file(f):
            records = 0
            try:
                for index, item, pos in iter_records(f, positions=True):
                    records += 1
                    yield f, index, item, done + pos
            except ScenarioError as exc:
                yield f, None, exc, done + size
            else:
                if records == 0:
                    yield f, None, ScenarioError(f, "", "the TFRecord file holds no record"), done + size
        else:
            yield f, None, None, done + size
        done += size


def _build(file, record, payload, config):
    """Build one scenario. Returns ``("ok", ScenarioData)``, ``("skipped", exc)`` or ``("error", exc)``."""
    try:
        if isinstance(payload, ScenarioError):
            raise payload
        raw = read_scenario(file) if payload is None else parse_record(payload, file, record)
        return "ok", _build_raw(raw, file, record, config)
    except NoControllableAgentError as exc:
        return "skipped", exc
    except ScenarioError as exc:
        return "error", exc


def _build_raw(raw, file, record, config) -> ScenarioData:
    """:func:`build_scenario`, with the objects the reader dropped for their box size counted in
    the scenario's ``stats`` (``bad_size_objects``) and listed (``dropped_objects``: ``{"file",
    "field", "reason"[, "record"]}``)."""
    sc = build_scenario(raw, config)
    sc.stats["bad_size_objects"] = len(raw.dropped_objects)
    sc.stats["dropped_objects"] = [{"file": str(file), **({"record": record} if record is not None else {}), **d}
                                   for d in raw.dropped_objects]
    return sc


def _build_in_worker(file, record, payload, config):
    status, out = _build(file, record, payload, config)
    # plain pickle: tensors travel by value (no shared-memory file descriptors piling up)
    return status, pickle.dumps(out) if status == "ok" else out


def _init_worker():
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")


def _results(files, config, workers):
    """Yield ``(file, record, status, result, bytes_done)`` in input order."""
    if workers <= 1:
        for f, rec, payload, done in _tasks(files):
            yield (f, rec, *_build(f, rec, payload, config), done)
        return
    ctx = multiprocessing.get_context("spawn" if os.name == "nt" else "forkserver")
    with ctx.Pool(workers, initializer=_init_worker) as pool:
        window: collections.deque = collections.deque()
        for f, rec, payload, done in _tasks(files):
            window.append((f, rec, done, pool.apply_async(_build_in_worker, (f, rec, payload, config))))
            while len(window) >= 2 * workers:
                yield _collect(window.popleft())
        while window:
            yield _collect(window.popleft())


def _collect(item):
    f, rec, done, res = item
    status, out = res.get()
    return f, rec, status, pickle.loads(out) if status == "ok" else out, done


def _entry(file, record, exc) -> dict:
    reason = f"{exc.field}: {exc.reason}" if exc.field else exc.reason
    e = {"file": file, "reason": reason}
    if record is not None:
        e["record"] = record
    return e


def convert_sources(paths, config: DataConfig = DataConfig(), *, on_error: str = "collect", limit: int | None = None,
                    workers: int = 1, progress=None, on_scenario=None) -> tuple[list[ScenarioData], dict]:
    """Read and build every scenario of ``paths`` (JSON files, TFRecord files, directories, globs).

    Args:
        paths: one source or a sequence. config: conversion parameters.
        on_error: ``"collect"`` (bad records/files go to ``stats``) or ``"raise"`` (first problem raises).
        limit: stop after this many scenarios are converted (``None``: all).
        workers: processes building scenarios (1 = in this process). Results keep input order.
        progress: optional ``progress(bytes_done, bytes_total, stats)`` called after each scenario.
        on_scenario: optional ``on_scenario(scenario)`` called with each converted scenario, in
            input order, which is then *not* kept (the returned list is empty): memory stays
            bounded by what the callback keeps (sharded conversion, :mod:`gpusim.data.shards`).

    Returns:
        ``(scenarios, stats)`` with ``stats``: ``files``, ``records`` (TFRecord records met, bad
        ones included),
        ``converted``, ``empty_files`` (files of 0 bytes, also listed in ``errors``),
        ``ignored_files`` (documentation files left out, see :func:`expand_sources`), ``errors`` /
        ``skipped`` (lists of ``{"file", "reason"[, "record"]}``; the reason reads
        ``"<field>: <problem>"``), ``dropped_objects`` (``{"file", "field", "reason"[, "record"]}``
        per object dropped for its box size, its scenario kept), summed :data:`COUNTERS`, ``ignored_objects`` /
        ``unknown_road_types`` (counts by name), ``limit_reached`` and ``seconds``.

    Raises:
        ScenarioError: the first problem with ``on_error="raise"``. ValueError: bad arguments.
    """
    if on_error not in ("collect", "raise"):
        raise ValueError(f"on_error must be 'collect' or 'raise', got {on_error!r}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    t_start = time.perf_counter()
    ignored_files: list[str] = []
    files, errors = expand_sources(paths, ignored_files)
    if errors and on_error == "raise":
        raise ScenarioError(errors[0]["file"], "", errors[0]["reason"])
    stats: dict = {"files": len(files), "records": 0, "converted": 0, "errors": list(errors), "skipped": [],
                   "ignored_files": ignored_files, "dropped_objects": [],
                   **{c: 0 for c in COUNTERS}, "ignored_objects": {}, "unknown_road_types": {},
                   "limit_reached": False}
    total = sum(os.path.getsize(f) for f in files if os.path.exists(f))
    scenarios: list[ScenarioData] = []
    converted = 0
    threads = torch.get_num_threads()
    # The per-scenario tensors are small: intra-op threads only add synchronisation, which is very
    # costly on a shared machine (12.8 s with 1 thread vs 159 s with 2 for the 72 shared
    # scenarios on a loaded 2-core box). Restored on exit.
    torch.set_num_threads(1)
    try:
        for f, rec, status, out, done in _results(files, config, workers):
            if limit is not None and converted >= limit:
                stats["limit_reached"] = True
                break
            stats["records"] += rec is not None
            if status == "ok":
                _add(stats, scenarios, out)
                converted += 1
                if on_scenario is not None:
                    scenarios.clear()
                    on_scenario(out)
            elif on_error == "raise":
                raise out
            elif status == "skipped":
                warnings.warn(f"skipping scenario {out}", stacklevel=2)
                stats["skipped"].append(_entry(f, rec, out))
            else:
                stats["errors"].append(_entry(f, rec, out))
            if progress is not None:
                progress(done, total, stats)
    finally:
        torch.set_num_threads(threads)
    stats["converted"] = converted
    stats["empty_files"] = sum(e["reason"] == EMPTY_FILE for e in stats["errors"])
    stats["seconds"] = round(time.perf_counter() - t_start, 3)
    return scenarios, stats


def _add(stats, scenarios, sc: ScenarioData) -> None:
    scenarios.append(sc)
    for c in COUNTERS:
        stats[c] += int(sc.stats.get(c, 0))
    stats.setdefault("dropped_objects", []).extend(sc.stats.get("dropped_objects", []))
    for key in ("ignored_objects", "unknown_road_types"):
        d = stats[key]
        for k, v in sc.stats.get(key, {}).items():
            d[k] = d.get(k, 0) + int(v)


# --------------------------------------------------------------------------- a split from a WOMD download

#: The split file the ``--split`` option of ``python -m gpusim.data convert`` reads by default
#: (the project's pool split, written by ``train/splits.py``).
DEFAULT_SPLITS_FILE = pathlib.Path(__file__).resolve().parents[2] / "data" / "splits_v2.json"
#: WOMD's split names as they begin its scenario shard files' names (``training/training.tfrecord-
#: 00000-of-01000``, ``validation/validation.tfrecord-00000-of-00150``, ``testing/...``).
WOMD_SPLITS = ("training", "validation", "testing")
#: A recorded first position matches a record's when each coordinate is within this distance (m):
#: a split file stores them rounded to 1 cm.
FINGERPRINT_TOLERANCE_M = 0.01
_SHARD_NAME = re.compile(r"^(?:(?P<prefix>.+)\.)?tfrecord-(?P<shard>\d{5})-of-(?P<n>\d{5})(?:\.gz)?$")


#: A scenario's file stem as a split file may name it (scenario id or WOMD record name): no path
#: separators, so an edited split file cannot reach files outside the given directories.
_SPLIT_STEM = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def split_doc_problem(doc) -> str | None:
    """What makes a parsed split file (``data/splits.json``, ``data/splits_v2.json``) unusable, in
    words, or None: ``splits`` not an object of lists; a scenario id that is not a plain file stem
    (letters, digits, ``_ - .``; no path separator); a scenario twice in one split or in two
    splits (a held-out scene trained on); ``scenes`` (when present) not an object of objects, or
    an entry's ``scenario_id`` / ``record_name`` not a plain stem. The one structural check of
    both readers (:func:`read_split_entries`, ``train.splits.read_splits``)."""
    splits = doc.get("splits") if isinstance(doc, dict) else None
    if not isinstance(splits, dict):
        return "no \"splits\" object"
    seen: dict = {}
    for name, ids in splits.items():
        if not isinstance(ids, list):
            return f"split {name!r} is {type(ids).__name__}, not a list of scenario ids"
        for sid in ids:
            if not isinstance(sid, str) or not _SPLIT_STEM.match(sid):
                return f"split {name!r} holds {sid!r}, not a scenario file stem (letters, digits, '_', '-', '.')"
            if sid in seen:
                where = f"twice in split {name!r}" if seen[sid] == name else f"in splits {seen[sid]!r} and {name!r}"
                return f"scenario {sid} is {where}"
            seen[sid] = name
    scenes = doc.get("scenes", {})
    if not isinstance(scenes, dict):
        return f"\"scenes\" is {type(scenes).__name__}, not an object"
    for stem, e in scenes.items():
        if not isinstance(e, dict):
            return f"scene {stem}: its entry is {type(e).__name__}, not an object"
        for key in ("scenario_id", "record_name"):
            v = e.get(key)
            if v is not None and not (isinstance(v, str) and _SPLIT_STEM.match(v)):
                return f"scene {stem}: {key} {v!r} is not a scenario file stem"
    return None


def split_entry_problem(e: dict) -> str | None:
    """What makes a split file's scene entry unusable as a fingerprint or a record address, in
    words, or None: ``objects`` not an int >= 0 (a bool is not a count); ``first_xy`` empty while
    the scene has objects (it would check nothing), longer than ``objects``, or holding an item
    that is neither None nor two finite numbers (a NaN would match any position); ``womd`` (when
    present) without ints ``0 <= shard < num_shards`` and ``record >= 0``."""
    n, xy = e.get("objects"), e.get("first_xy")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        return f"\"objects\" {n!r} is not a count (an int >= 0)"
    if not isinstance(xy, list) or (n > 0 and not xy) or len(xy) > n:
        return f"\"first_xy\" has {len(xy) if isinstance(xy, list) else xy!r} positions for {n} objects"
    for k, p in enumerate(xy):
        if p is not None and not (isinstance(p, list) and len(p) == 2 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in p)):
            return f"\"first_xy\" item {k} is {p!r}, not None or two finite numbers (m)"
    w = e.get("womd")
    if w is not None:
        ints = all(isinstance(w.get(k), int) and not isinstance(w.get(k), bool) for k in ("shard", "num_shards", "record")) \
            if isinstance(w, dict) else False
        if not ints or not (0 <= w["shard"] < w["num_shards"]) or w["record"] < 0 or not isinstance(w.get("split"), str):
            return f"\"womd\" {w!r} is not a record address (split, 0 <= shard < num_shards, record >= 0)"
    return None


def read_split_entries(path, name: str) -> tuple[list[tuple[str, dict]], dict]:
    """The scenes of split ``name`` of a split file (``data/splits_v2.json`` layout: ``splits``
    ``{name: [stem, ...]}`` and ``scenes`` ``{stem: entry}``), in the split's order.

    An entry must carry a fingerprint (``objects``: int, ``first_xy``: list of ``[x, y]`` m or
    None) and a way to find it: ``scenario_id`` and/or ``womd`` (``{"split", "shard",
    "num_shards", "record"}``).

    Returns:
        ``([(stem, entry), ...], the parsed document)``.

    Raises:
        ValueError: one line naming the file: unreadable, not JSON, no such split (the names
            listed), or a scene without an entry, a fingerprint or a way to find it.
    """
    path = pathlib.Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"--splits-file {path}: cannot read ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"--splits-file {path}: not valid JSON ({exc})") from None
    splits = doc.get("splits") if isinstance(doc, dict) else None
    scenes = doc.get("scenes") if isinstance(doc, dict) else None
    if not isinstance(splits, dict) or not isinstance(scenes, dict):
        raise ValueError(f"--splits-file {path}: no \"splits\" and \"scenes\" objects (a split file written by "
                         f"`python train/splits.py build`, like data/splits_v2.json)")
    problem = split_doc_problem(doc)
    if problem:
        raise ValueError(f"--splits-file {path}: {problem}; restore the file or rebuild it with "
                         f"`python train/splits.py build`")
    if name not in splits:
        raise ValueError(f"--split {name}: no such split in {path}; use one of: {', '.join(splits)}")
    out = []
    for stem in splits[name]:
        e = scenes.get(stem)
        if not isinstance(e, dict) or not isinstance(e.get("objects"), int) or not isinstance(e.get("first_xy"), list):
            raise ValueError(f"--splits-file {path}: scene {stem} of split {name!r} has no entry with a fingerprint "
                             f"(\"objects\", \"first_xy\"); rebuild the file with `python train/splits.py build`")
        if not e.get("scenario_id") and not isinstance(e.get("womd"), dict):
            raise ValueError(f"--splits-file {path}: scene {stem} of split {name!r} has neither a \"scenario_id\" nor "
                             f"a \"womd\" record to find it by")
        problem = split_entry_problem(e)
        if problem:
            raise ValueError(f"--splits-file {path}: scene {stem} of split {name!r}: {problem}; restore the file or "
                             f"rebuild it with `python train/splits.py build`")
        out.append((stem, e))
    return out, doc


def womd_shard_key(path) -> tuple[str | None, int, int] | None:
    """``(split, shard, num_shards)`` of a WOMD scenario shard file, from its name
    (``training.tfrecord-00012-of-01000``; ``.gz`` allowed), or None for another name. ``split`` is
    the name's prefix; without one, the parent folder's name when it is a WOMD split
    (:data:`WOMD_SPLITS`), else None (any split)."""
    p = pathlib.Path(path)
    m = _SHARD_NAME.match(p.name)
    if not m:
        return None
    split = m["prefix"] or (p.parent.name if p.parent.name in WOMD_SPLITS else None)
    return split, int(m["shard"]), int(m["n"])


def shard_file_name(womd: dict) -> str:
    """The name of the WOMD shard file holding a split entry's record (``womd``: ``{"split",
    "shard", "num_shards"[, "record"]}``), e.g. ``training.tfrecord-00012-of-01000``."""
    return f"{womd['split']}.tfrecord-{womd['shard']:05d}-of-{womd['num_shards']:05d}"


def tfrecord_files(paths) -> list[str]:
    """The TFRecord files of ``paths`` (files as given; folders searched recursively, as a WOMD
    download nests ``training/``, ``validation/``, ...; glob patterns), sorted, de-duplicated.

    Raises:
        ValueError: one line naming a path that does not exist or matches nothing, or when no
            TFRecord file is found at all.
    """
    found = set()
    for src in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        p = pathlib.Path(src)
        if p.is_dir():
            found.update(str(c) for c in p.rglob("*") if c.is_file() and is_tfrecord_file(c))
        elif p.is_file():
            found.add(str(p))
        elif any(ch in str(src) for ch in "*?[") and _glob.glob(str(src)):
            found.update(c for c in _glob.glob(str(src)) if os.path.isfile(c))
        else:
            raise ValueError(f"{src}: no such file or directory; pass the folder of the WOMD download "
                             f"(its scenario TFRecord shards) or shard files")
    if not found:
        raise ValueError(f"{', '.join(map(str, [paths] if isinstance(paths, (str, os.PathLike)) else paths))}: "
                         f"no TFRecord file (*.tfrecord*, WOMD shards such as "
                         f"training/training.tfrecord-00000-of-01000)")
    return sorted(found)


def fingerprint_mismatch(entry: dict, count: int, first: list) -> str | None:
    """Why a record does not match a split entry's fingerprint, or None when it does: the object
    count must be equal and each recorded first valid position (m) within
    :data:`FINGERPRINT_TOLERANCE_M` per coordinate of the record's (``count`` / ``first`` as
    :func:`gpusim.data.parse_proto.track_fingerprint` gives them for ``len(entry["first_xy"])``
    tracks)."""
    if count != entry["objects"]:
        return f"{count} objects, the split file records {entry['objects']}"
    for k, (want, got) in enumerate(zip(entry["first_xy"], first)):
        if (want is None) != (got is None):
            return (f"object {k} is never valid in the record, valid in the split file" if got is None
                    else f"object {k} is valid in the record, never valid in the split file")
        if want is not None:
            d = max(abs(got[0] - want[0]), abs(got[1] - want[1]))
            if d > FINGERPRINT_TOLERANCE_M + 1e-9:
                return (f"object {k}'s first valid position ({got[0]:.2f}, {got[1]:.2f}) is {d:.2f} m from the "
                        f"recorded ({want[0]:.2f}, {want[1]:.2f})")
    return None


def select_split(paths, entries) -> tuple[list[tuple], dict]:
    """Find a split's scenes in WOMD TFRecord files and check each against its fingerprint.

    A scene whose entry names a WOMD record (``womd``: split, shard, record index) is taken from
    that record of its shard file (:func:`womd_shard_key` matches file names); when the entry also
    has a ``scenario_id``, the record's id must equal it, else (or when its shard file is not
    given, or holds fewer records) the scene is looked up by id. Scenes found by id need a scan of
    the files: the shard files named by record are read first (only up to their last wanted record
    when no scene is looked up by id), the other given files only when a scene is still looked up
    by id. Each record found is decoded and compared with the entry's fingerprint
    (:func:`fingerprint_mismatch`), then mapped to a :class:`~gpusim.data.parse.RawScenario`.

    Args:
        paths: TFRecord files, folders (searched recursively) or glob patterns.
        entries: ``[(stem, entry)]`` (:func:`read_split_entries`).

    Returns:
        ``(raws, report)``: ``raws`` = ``[(stem, RawScenario, record index)]`` in the split's order; ``report``:
        ``found`` (``{stem: {"file", "record", "by"}}``, ``by`` = ``"record"`` or ``"id"``),
        ``missing`` / ``mismatched`` / ``refused`` (``[{"scene", "reason"[, "file", "record"]}]``:
        not found; found but not matching the fingerprint; matching but refused by the reader),
        ``errors`` (``[{"file", "reason"[, "record"]}]``: unreadable records met on the way),
        ``files`` (TFRecord files given), ``files_read`` (files opened) and ``records`` (read).

    Raises:
        ValueError: a path that does not exist, or no TFRecord file (:func:`tfrecord_files`).
    """
    files = tfrecord_files(paths)
    entry = dict(entries)
    keys: dict = {}
    for f in files:
        k = womd_shard_key(f)
        if k is not None:
            keys.setdefault(k, f)

    def shard_file(w):
        return keys.get((w["split"], w["shard"], w["num_shards"])) or keys.get((None, w["shard"], w["num_shards"]))

    wanted: dict[str, dict[int, str]] = {}  # file -> {record index: stem}
    by_id: dict[str, str] = {}  # scenario id -> stem, still looked up
    report: dict = {"found": {}, "missing": [], "mismatched": [], "refused": [], "errors": [], "files": len(files),
                    "files_read": [], "records": 0}
    raws: dict = {}
    why_not: dict[str, str] = {}
    for stem, e in entries:
        w = e.get("womd") if isinstance(e.get("womd"), dict) else None
        f = shard_file(w) if w else None
        if f is not None:
            wanted.setdefault(f, {})[int(w["record"])] = stem
        elif e.get("scenario_id"):
            by_id[e["scenario_id"]] = stem
            if w:
                why_not[stem] = f"its shard file {shard_file_name(w)} is not among the given files"
        else:
            report["missing"].append({"scene": stem, "reason": f"record {w['record']} of {shard_file_name(w)}: that "
                                      f"shard file is not among the given files (the entry has no scenario id)"})

    def take(stem, f, rec, msg, by):
        e = entry[stem]
        count, first = track_fingerprint(msg, len(e["first_xy"]))
        why = fingerprint_mismatch(e, count, first)
        where = {"file": f, "record": rec}
        if why is not None:
            report["mismatched"].append({"scene": stem, **where, "reason": why})
            return
        try:
            raws[stem] = (proto_to_raw(msg, f, rec), rec)
        except ScenarioError as exc:
            report["refused"].append({"scene": stem, **where, "reason": f"{exc.field}: {exc.reason}"})
            return
        report["found"][stem] = {**where, "by": by}

    def records(f):
        report["files_read"].append(f)
        for rec, item in iter_records(f):
            report["records"] += 1
            if isinstance(item, ScenarioError):
                report["errors"].append(_entry(f, rec, item))
                continue
            try:
                yield rec, decode_scenario(item, f, rec)
            except ScenarioError as exc:
                report["errors"].append(_entry(f, rec, exc))

    def scan(f, targets):
        """Read ``f``: its wanted records by index, any record whose id is looked up. True when read to the end."""
        last = max(targets, default=-1)
        seen = -1
        try:
            for rec, msg in records(f):
                seen = rec
                stem = targets.pop(rec, None)
                want = entry[stem].get("scenario_id") if stem else None
                if stem is not None and want and msg.scenario_id != want:
                    by_id[want] = stem
                    why_not[stem] = f"record {rec} of {f} holds scenario {msg.scenario_id or '(no id)'}"
                    stem = None
                if stem is not None:
                    take(stem, f, rec, msg, "record")
                elif msg.scenario_id in by_id:
                    take(by_id.pop(msg.scenario_id), f, rec, msg, "id")
                if rec >= last and not by_id:
                    return False
        except ScenarioError as exc:  # the file cannot be opened
            report["errors"].append(_entry(f, None, exc))
        for rec, stem in targets.items():  # past the file's end
            want = entry[stem].get("scenario_id")
            if want:
                by_id[want] = stem
                why_not[stem] = f"{f} holds {seen + 1} record(s), not record {rec}"
            else:
                report["missing"].append({"scene": stem, "reason": f"record {rec} of {f}: the file holds "
                                          f"{seen + 1} record(s) (the entry has no scenario id)"})
        return True

    whole = set()
    ids_before = set(by_id)
    for f in sorted(wanted):
        if scan(f, dict(wanted[f])):
            whole.add(f)
    added = set(by_id) - ids_before  # looked up by id after their own record did not hold them
    for f in files:
        if not by_id:
            break
        if f not in whole or added:
            scan(f, {})
    for sid, stem in by_id.items():
        n = len(set(report["files_read"]))
        report["missing"].append({"scene": stem, "reason": f"scenario id {sid} not in the {n} TFRecord file(s) read"
                                  + (f" ({why_not[stem]})" if stem in why_not else "")})
    report["files_read"] = sorted(set(report["files_read"]))
    order = [s for s, _ in entries]
    for key in ("missing", "mismatched", "refused"):
        report[key].sort(key=lambda d: order.index(d["scene"]))
    return [(s, *raws[s]) for s in order if s in raws], report


def build_selected(raws, config: DataConfig = DataConfig()) -> tuple[list[ScenarioData], dict]:
    """Build the scenarios :func:`select_split` found (``[(stem, RawScenario, record index)]``, in
    its order), with the ``stats`` of :func:`convert_sources` (``files``: the TFRecord files they
    come from, ``records``: the scenes given; ``errors`` / ``skipped`` name the file and record).

    Raises:
        ValueError: bad ``config`` values (as :class:`~gpusim.config.DataConfig`).
    """
    t0 = time.perf_counter()
    stats: dict = {"files": len({raw.file for _, raw, _ in raws}), "records": len(raws), "converted": 0,
                   "errors": [], "skipped": [],
                   "ignored_files": [], "dropped_objects": [], **{c: 0 for c in COUNTERS}, "ignored_objects": {},
                   "unknown_road_types": {}, "limit_reached": False}
    scenarios: list[ScenarioData] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as convert_sources: small tensors, threads only add synchronisation
    try:
        for _, raw, rec in raws:
            try:
                _add(stats, scenarios, _build_raw(raw, raw.file, rec, config))
            except NoControllableAgentError as exc:
                stats["skipped"].append(_entry(raw.file, rec, exc))
            except ScenarioError as exc:
                stats["errors"].append(_entry(raw.file, rec, exc))
    finally:
        torch.set_num_threads(threads)
    stats["converted"] = len(scenarios)
    stats["empty_files"] = 0
    stats["seconds"] = round(time.perf_counter() - t0, 3)
    return scenarios, stats
