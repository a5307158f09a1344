"""Command line: convert WOMD scenarios (GPUDrive JSON or Waymo TFRecord) into a pack, describe a pack.

    python -m gpusim.data convert SRC... --out DIR_OR_FILE.pt [--overwrite] [--limit N] [--workers N]
                                  [--no-progress] [--shard-size N] [--max-agents N] [--max-controlled N]
                                  [--init-steps N] [--grid-cell-size M] [--control all_valid] [...]
    python -m gpusim.data convert PATH/TO/WOMD... --split NAME [--splits-file F] [--allow-missing] --out DIR_OR_FILE.pt
    python -m gpusim.data info PACK_DIR_OR_PT_OR_SHARDED_DIR_OR_SOURCES... [--no-verify | --verify]

``--shard-size N`` writes a sharded pack directory (``gpusim.data.shards``: shards of N scenarios
plus ``index.json``), converting with bounded memory; ``info`` on such a directory summarises it
from the index and each shard file's real size without unpickling any shard, and checks each
shard's CRC-32C against the index (by default when the shards hold at most 1 GiB; ``--verify``
always, ``--no-verify`` never); it exits with 1 when a shard is missing, truncated or corrupt.
``--out`` must not hold another dataset (a pack, a sharded pack, the shards of an interrupted
conversion, an existing ``.pt``): ``--overwrite`` removes those files before converting.

``convert`` prints one line per bad file or record (``error: <file>: <field>: <reason>``, the
field starting with ``record[i]`` for TFRecords), per skipped scenario and per object dropped for a
box size that is not a finite number > 0 (``dropped: <file>: <field>: <reason>``, the scenario
kept; counted per scenario and in all in the summary), then a summary, writes
the pack of the good scenarios and exits with 0 if at least one scenario was converted, 1 if none
was, 2 for bad usage. Empty files are named (``empty file (0 bytes)``) and counted in the
summary. A progress bar (rich, on stderr) follows the bytes read.

``convert --split NAME`` converts only the scenes of split NAME of a split file (default
``data/splits_v2.json``) from WOMD TFRecord files (a download folder, searched recursively, or
shard files): each scene is taken by its WOMD record (shard file and record index) or by its
scenario id, reading only the shard files the split names unless a scene must be looked up by id,
and checked against the split file's fingerprint (:func:`gpusim.data.convert.select_split`). One
line per scene missing, not matching or refused, then a summary that repeats the WOMD version the
split file records (unknown for ``data/splits_v2.json``). Any scene lost: exit 2 and no pack,
unless ``--allow-missing``. ``info`` loads a pack
(directory or ``.pt``; checksums and invariants checked, a pack written before checksums noted on
stderr) or converts sources in memory and prints totals (signals included) and a per-scenario
table.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import pathlib
import sys
import time
import warnings

from gpusim.config import DataConfig, ObjectType, RoadType
from gpusim.data.errors import ScenarioError
from gpusim.data.pack import META_FILE, PACK_FILE, ScenarioPack
from gpusim.data.integrity import check_one_dataset, clear_dataset, dataset_in
from gpusim.data.shards import ShardedPack, convert_sharded, is_sharded
from gpusim.data.signals import SignalState
from gpusim.fileio import OutputError, check_output_path

#: ``info`` verifies shard checksums by default up to this many bytes of shards (1 GiB).
VERIFY_LIMIT = 1 << 30

_CONFIG_FLAGS = {
    "max_agents": int,
    "max_controlled": int,
    "init_steps": int,
    "goal_min_distance": float,
    "simplify_area": float,
    "grid_cell_size": float,
    "grid_margin": float,
    "grid_k": int,
    "grid_edge_k": int,
    "control": str,  # vehicles_with_goal or all_valid (pedestrians and cyclists controlled too)
}


def _add_config_flags(p: argparse.ArgumentParser) -> None:
    defaults = DataConfig()
    for name, typ in _CONFIG_FLAGS.items():
        flags = ["--" + name.replace("_", "-")]
        if name == "grid_cell_size":
            flags.append("--cell-size")
        if name == "grid_margin":
            flags.append("--margin")
        p.add_argument(*flags, dest=name, type=typ, default=None,
                       help=f"DataConfig.{name} (default {getattr(defaults, name)})")


def _config_from(args) -> DataConfig:
    given = {k: getattr(args, k) for k in _CONFIG_FLAGS if getattr(args, k) is not None}
    return DataConfig(**given)


def _progress_bar(enabled: bool):
    """A rich progress bar over bytes read (on stderr), or a no-op context when disabled."""
    import contextlib

    if not enabled:
        return contextlib.nullcontext(None)
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("converting"), BarColumn(), DownloadColumn(), TextColumn("{task.fields[info]}"),
                    TimeRemainingColumn(), console=Console(stderr=True), transient=True)


def _convert_with_report(sources, config, out=None, *, limit=None, workers=1, progress=False, shard_dir=None,
                         shard_size=None) -> ScenarioPack | ShardedPack | None:
    """Convert, printing one line per bad / skipped file or record and a summary. None if nothing
    usable. With ``shard_dir`` / ``shard_size``: a sharded conversion (returns the ShardedPack)."""
    out = out if out is not None else sys.stdout

    t0 = time.perf_counter()
    with warnings.catch_warnings(), _progress_bar(progress) as bar:
        warnings.simplefilter("ignore")
        task = bar.add_task("convert", total=None, info="") if bar is not None else None

        def tick(done, total, stats):
            bar.update(task, completed=done, total=total,
                       info=f"{len(stats['errors']) + len(stats['skipped'])} bad/skipped")

        try:
            if shard_dir is not None:
                pack, stats = convert_sharded(sources, shard_dir, config, shard_size=shard_size, limit=limit,
                                              workers=workers, progress=tick if bar is not None else None)
            else:
                pack = ScenarioPack.from_json(sources, config, limit=limit, workers=workers,
                                              progress=tick if bar is not None else None)
                stats = pack.stats
        except ScenarioError as exc:
            pack, stats = None, None
            print(f"error: {exc}", file=out)
    seconds = time.perf_counter() - t0
    if stats is None:
        return None
    _print_stats(stats, seconds, limit, out)
    return pack


def _print_stats(stats: dict, seconds: float, limit, out) -> None:
    """Print one line per bad file / record, skipped scenario and dropped object, then the summary
    and its notes (the counts of ``stats``, :func:`gpusim.data.convert.convert_sources`)."""
    for e in stats["errors"]:
        print(f"error: {e['file']}: {e['reason']}", file=out)
    for e in stats["skipped"]:
        where = f"record[{e['record']}]: " if "record" in e else ""
        print(f"skipped: {e['file']}: {where}{e['reason']}", file=out)
    for e in stats.get("dropped_objects", []):
        print(f"dropped: {e['file']}: {e['field']}: {e['reason']}", file=out)
    what = (f"{stats['converted']} scenario(s) from {stats['files']} file(s) ({stats['records']} TFRecord record(s))"
            if stats.get("records") else f"{stats['converted']} of {stats['files']} file(s)")
    print(
        f"converted {what} in {seconds:.1f} s; "
        f"{len(stats['errors'])} bad"
        + (f" ({stats['empty_files']} empty file(s))" if stats.get("empty_files") else "")
        + f", {len(stats['skipped'])} skipped (no controllable agent)"
        + (f"; stopped at --limit {limit}" if stats.get("limit_reached") else ""),
        file=out,
    )
    notes = []
    for key, label in (
        ("ignored_objects", "objects of other types ignored"),
        ("unknown_road_types", "road polylines of unknown type kept as 'other'"),
    ):
        if stats.get(key):
            notes.append(f"{sum(stats[key].values())} {label} ({', '.join(f'{k}: {v}' for k, v in stats[key].items())})")
    dropped = collections.Counter(pathlib.Path(e["file"]).name + (f" record[{e['record']}]" if "record" in e else "")
                                  for e in stats.get("dropped_objects", []))
    if dropped:
        notes.append(f"{sum(dropped.values())} object(s) with a width or length that is not a finite number > 0 "
                     f"dropped, their scenarios kept ({', '.join(f'{k}: {n}' for k, n in dropped.items())})")
    for key, label in (
        ("never_valid_objects", "objects never valid dropped"),
        ("controllable_over_cap", "controllable vehicles over max_controlled replayed as experts"),
        ("dropped_over_max_agents", "objects dropped over max_agents"),
        ("single_point_polylines", "single-point road polylines (no segment)"),
        ("zero_length_segments", "zero-length road segments dropped"),
        ("signals", "traffic signals kept"),
        ("signals_without_lane", "signals whose lane is not in the map (no stop-line direction)"),
        ("signal_stop_points_moved", "signals whose stop point moves (first kept)"),
        ("unknown_signal_states", "signal states of unknown name stored as unknown"),
    ):
        if stats.get(key):
            notes.append(f"{stats[key]} {label}")
    for n in notes:
        print(f"  {n}", file=out)


def _is_pack(path: pathlib.Path) -> bool:
    return (path.is_dir() and (path / PACK_FILE).exists()) or (path.is_file() and path.suffix == ".pt")


def describe(pack: ScenarioPack, out=None) -> None:
    """Print totals (scenarios, agents by role and type, segments by type, grid cells, memory)
    and a per-scenario table of ``pack`` to ``out`` (default: stdout)."""
    out = out if out is not None else sys.stdout
    S = pack.num_scenarios
    exists = pack.agent_exists
    ctrl = pack.controlled & exists
    experts = exists & ~ctrl
    print(f"scenarios: {S}", file=out)
    print(f"agent slots: {pack.max_agents} per scenario, steps: {pack.num_steps}", file=out)

    def by_type(mask):
        types = pack.agent_type[mask].tolist()
        c = collections.Counter(types)
        return ", ".join(f"{ObjectType(t).name.lower()} {c[t]}" for t in sorted(c))

    print(f"agents: {int(exists.sum())} ({int(ctrl.sum())} controlled, {int(experts.sum())} experts)", file=out)
    print(f"  controlled by type: {by_type(ctrl) or '-'}", file=out)
    print(f"  experts by type: {by_type(experts) or '-'}", file=out)
    rt = pack.road_type[pack.road_type >= 0].tolist()
    c = collections.Counter(rt)
    print(f"road segments: {len(rt)} (max {pack.road_seg.shape[1]} per scenario)", file=out)
    print("  by type: " + ", ".join(f"{RoadType(t).name.lower()} {c[t]}" for t in sorted(c)), file=out)
    cells = pack.grid_dims.to(int).prod(dim=1)
    print(
        f"grid: {int(cells.sum())} cells ({pack.cell_size:g} m; max {int(cells.max())} per scenario), "
        f"k = {pack.grid_road.shape[-1]}, edge k = {pack.grid_edge.shape[-1]}, tables {pack.grid_road.dtype} "
        f"({'compact' if pack.is_compact else 'padded'})",
        file=out,
    )
    nbytes = pack.nbytes()
    parts = sorted(((t.numel() * t.element_size(), n) for n, t in pack.tensors().items()), reverse=True)[:3]
    print(
        f"memory: {nbytes} bytes ({nbytes / 2**20:.1f} MiB; largest: "
        + ", ".join(f"{n} {b / 2**20:.1f} MiB" for b, n in parts) + ")",
        file=out,
    )
    ns = pack.num_signals
    states = pack.signal_state[pack.signal_valid].tolist()
    c = collections.Counter(states)
    print(
        f"signals: {int(ns.sum())} in {int((ns > 0).sum())} scenario(s) (max {pack.max_signals} per scenario); "
        f"valid lane-steps: {int(pack.signal_valid.sum())}"
        + ("; by state: " + ", ".join(f"{SignalState(t).name.lower()} {c[t]}" for t in sorted(c)) if c else ""),
        file=out,
    )
    cfg = dataclasses.asdict(pack.config)
    print("config: " + ", ".join(f"{k}={v}" for k, v in cfg.items()), file=out)
    print("", file=out)
    hdr = f"{'#':>3} {'scenario':<36} {'agents':>6} {'ctrl':>4} {'veh':>4} {'ped':>4} {'cyc':>4} {'sdc':>4} " \
          f"{'segs':>5} {'edges':>5} {'sig':>4} {'grid':>7} {'ext(m)':>11}"
    print(hdr, file=out)
    for s in range(S):
        n = int(pack.num_agents[s])
        t = collections.Counter(pack.agent_type[s, :n].tolist())
        r = int(pack.num_segments[s])
        edges = int((pack.road_type[s, :r] == int(RoadType.ROAD_EDGE)).sum())
        nx, ny = (int(v) for v in pack.grid_dims[s])
        ext = f"{nx * pack.cell_size:.0f}x{ny * pack.cell_size:.0f}"
        print(
            f"{s:>3} {pack.scenario_ids[s][:36]:<36} {n:>6} {int(pack.num_controlled[s]):>4} "
            f"{t[int(ObjectType.VEHICLE)]:>4} {t[int(ObjectType.PEDESTRIAN)]:>4} {t[int(ObjectType.CYCLIST)]:>4} "
            f"{int(pack.sdc_index[s]):>4} {r:>5} {edges:>5} {int(pack.num_signals[s]):>4} {nx}x{ny:<4} {ext:>11}",
            file=out,
        )


def describe_sharded(sp: ShardedPack, out=None, *, verify: bool | None = True) -> int:
    """Print a sharded pack's summary from its index and each shard file's real size (no shard is
    unpickled): scenarios, shards and bytes, agents, segments, cells, signals, the maxima a pool
    pads to, config, a per-shard table with each file's state. ``verify``: also check each
    shard's CRC-32C against the index (one read of each file); None: only when the shards hold at
    most :data:`VERIFY_LIMIT` bytes (a line says when they were not verified).

    Returns:
        The number of bad shards (missing, truncated, corrupt or replaced).
    """
    out = out if out is not None else sys.stdout
    sc = sp.scenarios
    total = sum(s["bytes"] for s in sp.shards)
    check = verify if verify is not None else total <= VERIFY_LIMIT
    bad = dict(sp.check_files(verify=check))
    real = sum((sp.shard_file(i).stat().st_size if sp.shard_file(i).is_file() else 0) for i in range(sp.num_shards))
    print(f"sharded pack: {sp.path}", file=out)
    print(f"scenarios: {sp.num_scenarios} in {sp.num_shards} shard(s); {real} bytes on disk "
          f"({real / max(1, sp.num_scenarios) / 2**20:.2f} MiB per scenario)", file=out)
    print(f"agents: {sum(s['agents'] for s in sc)} ({sum(s['controlled'] for s in sc)} controlled)", file=out)
    print(f"road segments: {sum(s['segments'] for s in sc)} (max {sp.max_segments} per scenario)", file=out)
    print(f"grid cells: {sum(s['cells'] for s in sc)} (max {sp.max_cells} per scenario)", file=out)
    print(f"signals: {sum(s['signals'] for s in sc)} in {sum(s['signals'] > 0 for s in sc)} scenario(s) "
          f"(max {sp.max_signals})", file=out)
    errors, skipped = sp.stats.get("errors", []), sp.stats.get("skipped", [])
    print(f"conversion: {len(errors)} bad, {len(skipped)} skipped", file=out)
    print("config: " + ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(sp.config).items()), file=out)
    if not all(s.get("crc32c") is not None for s in sp.shards):
        state = "sizes checked, checksums not verified (index written before checksums: convert the data again)"
    elif check:
        state = "checksums verified"
    elif verify is None:
        state = f"sizes checked, checksums not verified ({total} bytes > {VERIFY_LIMIT}: pass --verify)"
    else:
        state = "sizes checked, checksums not verified (--no-verify)"
    print(f"files: {state}; {len(bad)} bad shard(s)"
          + (f", {sp.lost_message(list(bad))}" if bad else ""), file=out)
    print("", file=out)
    print(f"{'shard':<18} {'scenarios':>9} {'bytes':>12}  {'state':<8} first scenario", file=out)
    for i, s in enumerate(sp.shards):
        first = next((m["id"] for m in sc if m["shard"] == i), "-")
        size = sp.shard_file(i).stat().st_size if sp.shard_file(i).is_file() else 0
        print(f"{s['file']:<18} {s['scenarios']:>9} {size:>12}  {'BAD' if i in bad else 'ok':<8} {first}", file=out)
    for i, reason in bad.items():
        print(f"error: {sp.shard_file(i)}: {reason}; convert the data again", file=out)
    return len(bad)


def _cmd_convert_split(args, config: DataConfig) -> int:
    """``convert SRC... --split NAME``: the split's scenes from WOMD TFRecord files (by record or
    scenario id, each checked against its fingerprint), one line per scene missing, not matching
    or refused, a summary, and the pack of the found scenes (2 when scenes are lost, unless
    ``--allow-missing``; no pack is written then)."""
    from gpusim.data.convert import DEFAULT_SPLITS_FILE, build_selected, read_split_entries, select_split
    from gpusim.data.pack import pack_scenarios

    args.splits_file = args.splits_file or str(DEFAULT_SPLITS_FILE)

    for flag, given in (("--shard-size", args.shard_size), ("--limit", args.limit),
                        ("--workers", args.workers not in (None, 1))):
        if given:
            print(f"error: {flag} cannot be combined with --split (a split is converted whole, in one process); "
                  f"leave it out", file=sys.stderr)
            return 2
    try:
        entries, doc = read_split_entries(args.splits_file, args.split)
        t0 = time.perf_counter()
        raws, report = select_split(args.sources, entries)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for e in report["errors"]:
        print(f"error: {e['file']}: {e['reason']}")
    for key, word in (("missing", "missing"), ("mismatched", "mismatch"), ("refused", "refused")):
        for e in report[key]:
            where = f"{e['file']}: record[{e['record']}]: " if "file" in e else ""
            print(f"{word}: {e['scene']}: {where}{e['reason']}")
    build = raws and (args.allow_missing or not _lost(report))
    scenarios, stats = build_selected(raws, config) if build else ([], None)
    if stats is not None:
        _print_stats(stats, time.perf_counter() - t0, None, sys.stdout)
        stem_of = {(raw.file, rec): stem for stem, raw, rec in raws}
        for e in stats["errors"] + stats["skipped"]:  # named above by _print_stats; lost to the split too
            report["refused"].append({"scene": stem_of[(e["file"], e.get("record"))], "reason": e["reason"]})
    found = {"record": 0, "id": 0}
    for v in report["found"].values():
        found[v["by"]] += 1
    name = pathlib.Path(args.splits_file).name
    version = doc.get("womd_version") or "unknown"
    print(f"split {args.split!r} of {name}: {len(entries)} scenes; {len(report['found'])} found and matching their "
          f"fingerprint ({found['record']} by record, {found['id']} by scenario id), {len(report['missing'])} missing, "
          f"{len(report['mismatched'])} not matching, {len(report['refused'])} refused; "
          f"{len(report['files_read'])} of {report['files']} TFRecord file(s) read, {report['records']} record(s)")
    print(f"  fingerprints (object count, first valid positions within 1 cm) from {name}; the WOMD version its "
          f"scenes were converted from: {version}")
    lost = _lost(report)
    if lost and not args.allow_missing:
        rest = (f", or --allow-missing to write the pack of the {len(entries) - lost} found" if lost < len(entries)
                else "")  # none found: --allow-missing would write nothing
        print(f"error: {lost} of the {len(entries)} scenes of split {args.split!r} are missing, not matching or "
              f"refused (named above); no pack written. Pass the folders holding them{rest}", file=sys.stderr)
        return 2
    if not scenarios:
        print("nothing converted; no pack written", file=sys.stderr)
        return 1
    out = pathlib.Path(args.out)
    pack = pack_scenarios(scenarios, config, {**stats, "split": {
        "name": args.split, "splits_file": name, "scenes": len(entries), "found": report["found"],
        "lost": [e["scene"] for k in ("missing", "mismatched", "refused") for e in report[k]],
        "womd_version": version}})
    _save(pack, out)
    return 0


def _lost(report: dict) -> int:
    """Scenes of a split not in its pack: missing, not matching their fingerprint, or refused."""
    return len(report["missing"]) + len(report["mismatched"]) + len(report["refused"])


def _cmd_convert(args, config: DataConfig) -> int:
    """``convert``: check the flags and the output (one dataset per directory), convert, write."""
    for flag, v in (("--limit", args.limit), ("--workers", args.workers), ("--shard-size", args.shard_size)):
        if v is not None and v < 1:
            print(f"error: {flag} must be >= 1, got {v}", file=sys.stderr)
            return 2
    if args.shard_size is not None and args.out.endswith(".pt"):
        print(f"error: --out {args.out}: a sharded pack is a directory, not a .pt file", file=sys.stderr)
        return 2
    out = pathlib.Path(args.out)
    try:  # before any conversion: the finished pack must have a place to go
        check_output_path(out, "--out", kind="file" if out.suffix == ".pt" else "dir")
    except OutputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    held = f"the pack file {out}" if out.suffix == ".pt" and out.exists() else dataset_in(out)
    if held and not args.overwrite:
        print(f"error: --out {args.out} already holds {held}: pass --overwrite to replace it, or choose "
              f"another directory", file=sys.stderr)
        return 2
    if args.split is None and (args.splits_file or args.allow_missing):
        flag = "--splits-file" if args.splits_file else "--allow-missing"
        print(f"error: {flag} needs --split NAME (the split to convert)", file=sys.stderr)
        return 2
    if held and out.suffix != ".pt":  # a .pt file is replaced atomically when the new one is whole
        clear_dataset(out)
    if args.split is not None:
        return _cmd_convert_split(args, config)
    pack = _convert_with_report(args.sources, config, limit=args.limit, workers=args.workers,
                                progress=not args.no_progress and sys.stderr.isatty(),
                                shard_dir=args.out if args.shard_size else None, shard_size=args.shard_size)
    if isinstance(pack, ShardedPack):
        total = sum(s["bytes"] for s in pack.shards)
        print(f"wrote {pack.num_shards} shard(s) of <= {args.shard_size} scenarios ({total} bytes) and "
              f"{pack.path / 'index.json'}")
        return 0
    if pack is None:
        print("nothing converted; no pack written", file=sys.stderr)
        return 1
    _save(pack, args.out)
    return 0


def _save(pack: ScenarioPack, out) -> None:
    """Write ``pack`` to ``out`` (a directory or a ``.pt`` file) and print what was written."""
    path = pack.save(out)
    shown = path if path.suffix == ".pt" else path / PACK_FILE
    print(f"wrote {shown} ({shown.stat().st_size} bytes)" + ("" if path.suffix == ".pt" else f" and {path / META_FILE}"))


def _cmd_info(args, config: DataConfig) -> int:
    """``info``: describe a sharded pack, a pack (loaded, so verified) or sources (converted)."""
    first = pathlib.Path(args.sources[0])
    verify = False if args.no_verify else (True if args.verify else None)
    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always")
        try:
            if len(args.sources) == 1 and first.is_dir():
                check_one_dataset(first)
            if len(args.sources) == 1 and is_sharded(first):
                return 1 if describe_sharded(ShardedPack.open(first), verify=verify) else 0
            if len(args.sources) == 1 and _is_pack(first):
                pack = ScenarioPack.load(first, verify=verify is not False)
                print(f"pack: {first}" + ("" if verify is not False else " (checksums not verified)"))
            else:
                pack = _convert_with_report(args.sources, config)
                if pack is None:
                    return 1
                print("")
        except ScenarioError as exc:  # PackFileError: the message names the file
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except (OSError, ValueError, RuntimeError) as exc:
            print(f"error: {first}: {exc}", file=sys.stderr)
            return 1
        finally:
            for n in notes:
                if issubclass(n.category, UserWarning) and "checksums" in str(n.message):
                    print(f"note: {n.message}", file=sys.stderr)
    describe(pack)
    return 0


def main(argv=None) -> int:
    """Entry point; returns the exit code (0 ok, 1 nothing usable or a bad pack, 2 usage error)."""
    parser = argparse.ArgumentParser(prog="python -m gpusim.data", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    pc = sub.add_parser("convert", help="convert WOMD JSON files/directories/globs into a scenario pack")
    pc.add_argument("sources", nargs="+", metavar="SRC")
    pc.add_argument("--out", required=True, help="output directory (pack.pt + meta.json) or a .pt file")
    pc.add_argument("--limit", type=int, default=None, help="stop after N scenarios are converted")
    pc.add_argument("--workers", type=int, default=1, help="processes building scenarios (default 1)")
    pc.add_argument("--no-progress", action="store_true", help="no progress bar")
    pc.add_argument("--shard-size", type=int, default=None,
                    help="write a sharded pack directory: shards of N scenarios + index.json")
    pc.add_argument("--overwrite", action="store_true",
                    help="--out already holds a dataset: remove its files first (else refused)")
    pc.add_argument("--split", default=None, metavar="NAME",
                    help="convert only the scenes of split NAME of --splits-file (train, validation, held_out), "
                         "found in the WOMD TFRecord files SRC by record or scenario id and checked against "
                         "their fingerprints")
    pc.add_argument("--splits-file", default=None, metavar="FILE",
                    help="the split file of --split (default data/splits_v2.json)")
    pc.add_argument("--allow-missing", action="store_true",
                    help="with --split: write the pack of the scenes found even when some are missing, not "
                         "matching or refused (else exit 2, no pack)")
    _add_config_flags(pc)
    pi = sub.add_parser("info", help="describe a pack (directory or .pt) or JSON sources")
    pi.add_argument("sources", nargs="+", metavar="PACK_OR_SRC")
    pi.add_argument("--no-verify", action="store_true", help="do not check checksums (sizes are still checked)")
    pi.add_argument("--verify", action="store_true",
                    help=f"check every shard's checksum even past {VERIFY_LIMIT} bytes of shards")
    _add_config_flags(pi)
    pe = sub.add_parser("export-proto", help="write the Scenario protos of any sources (JSON or TFRecord) "
                        "as one TFRecord, e.g. for Waymo's WOSAC scorer")
    pe.add_argument("sources", nargs="+", metavar="SRC")
    pe.add_argument("--out", required=True, help="output TFRecord file")
    args = parser.parse_args(argv)
    if args.cmd == "export-proto":
        from gpusim.data.proto_export import export_command

        return export_command(args.sources, args.out)
    try:
        config = _config_from(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        return _cmd_convert(args, config) if args.cmd == "convert" else _cmd_info(args, config)
    except OutputError as exc:  # a write that failed after the checks (full disk, ...): one line
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
