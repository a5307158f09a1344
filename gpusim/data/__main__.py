"""Command line: convert WOMD JSON scenarios into a pack, and describe a pack.

    python -m gpusim.data convert SRC... --out DIR_OR_FILE.pt [--max-agents N] [--max-controlled N]
                                  [--init-steps N] [--cell-size M] [...]
    python -m gpusim.data info PACK_DIR_OR_PT_OR_JSON_SOURCES...

``convert`` prints one line per bad file (``error: <file>: <field>: <reason>``) and per skipped
scenario, then a summary, writes the pack of the good scenarios and exits with 0 if at least one
scenario was converted, 1 if none was (2 for bad usage). ``info`` loads a pack (directory or
``.pt``) or converts JSON sources in memory and prints totals and a per-scenario table.
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


def _convert_with_report(sources, config, out=None) -> ScenarioPack | None:
    """Convert, printing one line per bad / skipped file and a summary. None if nothing usable."""
    out = out if out is not None else sys.stdout

    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            pack = ScenarioPack.from_json(sources, config)
            stats = pack.stats
        except ScenarioError as exc:
            pack, stats = None, None
            print(f"error: {exc}", file=out)
    seconds = time.perf_counter() - t0
    if stats is None:
        return None
    for e in stats["errors"]:
        print(f"error: {e['file']}: {e['reason']}", file=out)
    for e in stats["skipped"]:
        print(f"skipped: {e['file']}: {e['reason']}", file=out)
    print(
        f"converted {stats['converted']} of {stats['files']} file(s) in {seconds:.1f} s; "
        f"{len(stats['errors'])} bad, {len(stats['skipped'])} skipped (no controllable agent)",
        file=out,
    )
    notes = []
    for key, label in (
        ("ignored_objects", "objects of other types ignored"),
        ("unknown_road_types", "road polylines of unknown type kept as 'other'"),
    ):
        if stats.get(key):
            notes.append(f"{sum(stats[key].values())} {label} ({', '.join(f'{k}: {v}' for k, v in stats[key].items())})")
    for key, label in (
        ("never_valid_objects", "objects never valid dropped"),
        ("controllable_over_cap", "controllable vehicles over max_controlled replayed as experts"),
        ("dropped_over_max_agents", "objects dropped over max_agents"),
        ("single_point_polylines", "single-point road polylines (no segment)"),
        ("zero_length_segments", "zero-length road segments dropped"),
    ):
        if stats.get(key):
            notes.append(f"{stats[key]} {label}")
    for n in notes:
        print(f"  {n}", file=out)
    return pack


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
        f"grid: {int(cells.sum())} cells ({pack.cell_size:g} m; max {pack.grid_road.shape[1]} per scenario), "
        f"k = {pack.grid_road.shape[2]}, edge k = {pack.grid_edge.shape[2]}",
        file=out,
    )
    nbytes = pack.nbytes()
    parts = sorted(((t.numel() * t.element_size(), n) for n, t in pack.tensors().items()), reverse=True)[:3]
    print(
        f"memory: {nbytes} bytes ({nbytes / 2**20:.1f} MiB; largest: "
        + ", ".join(f"{n} {b / 2**20:.1f} MiB" for b, n in parts) + ")",
        file=out,
    )
    cfg = dataclasses.asdict(pack.config)
    print("config: " + ", ".join(f"{k}={v}" for k, v in cfg.items()), file=out)
    print("", file=out)
    hdr = f"{'#':>3} {'scenario':<36} {'agents':>6} {'ctrl':>4} {'veh':>4} {'ped':>4} {'cyc':>4} {'sdc':>4} " \
          f"{'segs':>5} {'edges':>5} {'grid':>7} {'ext(m)':>11}"
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
            f"{int(pack.sdc_index[s]):>4} {r:>5} {edges:>5} {nx}x{ny:<4} {ext:>11}",
            file=out,
        )


def main(argv=None) -> int:
    """Entry point; returns the exit code (0 ok, 1 nothing usable, 2 usage error)."""
    parser = argparse.ArgumentParser(prog="python -m gpusim.data", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    pc = sub.add_parser("convert", help="convert WOMD JSON files/directories/globs into a scenario pack")
    pc.add_argument("sources", nargs="+", metavar="SRC")
    pc.add_argument("--out", required=True, help="output directory (pack.pt + meta.json) or a .pt file")
    _add_config_flags(pc)
    pi = sub.add_parser("info", help="describe a pack (directory or .pt) or JSON sources")
    pi.add_argument("sources", nargs="+", metavar="PACK_OR_SRC")
    _add_config_flags(pi)
    args = parser.parse_args(argv)
    try:
        config = _config_from(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    if args.cmd == "convert":
        pack = _convert_with_report(args.sources, config)
        if pack is None:
            print("nothing converted; no pack written", file=sys.stderr)
            return 1
        path = pack.save(args.out)
        shown = path if path.suffix == ".pt" else path / PACK_FILE
        print(f"wrote {shown} ({shown.stat().st_size} bytes)" + ("" if path.suffix == ".pt" else f" and {path / META_FILE}"))
        return 0

    # info
    first = pathlib.Path(args.sources[0])
    if len(args.sources) == 1 and _is_pack(first):
        try:
            pack = ScenarioPack.load(first)
        except (OSError, ValueError, RuntimeError) as exc:
            print(f"error: {first}: {exc}", file=sys.stderr)
            return 1
        print(f"pack: {first}")
    else:
        pack = _convert_with_report(args.sources, config)
        if pack is None:
            return 1
        print("")
    describe(pack)
    return 0


if __name__ == "__main__":
    sys.exit(main())
