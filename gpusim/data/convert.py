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
"""

from __future__ import annotations

import collections
import glob as _glob
import multiprocessing
import os
import pathlib
import pickle
import time
import warnings

import torch

from gpusim.config import DataConfig
from gpusim.data.build import ScenarioData, build_scenario
from gpusim.data.errors import NoControllableAgentError, ScenarioError
from gpusim.data.integrity import dataset_in, interrupted, orphan_shards
from gpusim.data.parse import is_scenario_file, read_scenario
from gpusim.data.parse_proto import parse_record
from gpusim.data.tfrecord import is_tfrecord_file, iter_records


#: The reason given for a file of 0 bytes (counted in ``stats["empty_files"]``).
EMPTY_FILE = "empty file (0 bytes)"

#: Summed per-scenario counters reported in ``stats``.
COUNTERS = ("never_valid_objects", "controllable", "controllable_over_cap", "dropped_over_max_agents",
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
        return "ok", build_scenario(raw, config)
    except NoControllableAgentError as exc:
        return "skipped", exc
    except ScenarioError as exc:
        return "error", exc


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
        ``"<field>: <problem>"``), summed :data:`COUNTERS`, ``ignored_objects`` /
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
                   "ignored_files": ignored_files,
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
    for key in ("ignored_objects", "unknown_road_types"):
        d = stats[key]
        for k, v in sc.stats.get(key, {}).items():
            d[k] = d.get(k, 0) + int(v)
