"""Speed and peak memory of ``gpusim.data`` conversion (JSON or TFRecord sources → ScenarioPack).

Reports wall seconds, scenarios per second, input bytes per second and the peak resident memory
of the process (``ru_maxrss``; run one configuration per process for a clean peak).

``--make-tfrecord DIR`` first writes every JSON scenario of DIR as one TFRecord file of Scenario
protos (through the test helper ``tests/womd_records.json_to_proto``; ``--gzip`` compresses it)
and converts that file, to time the TFRecord path on more than the one real WOMD record we have.

Usage (from the repository root)::

    python profiling/bench_convert.py ../shared/data/womd_tfrecord/motion_data_one_scenario.tfrecord
    python profiling/bench_convert.py data/womd_sample
    python profiling/bench_convert.py --make-tfrecord ../shared/data/womd [--gzip] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import pathlib
import resource
import sys
import tempfile
import time


def _make_tfrecord(src_dir: str, out: pathlib.Path, gzip: bool) -> pathlib.Path:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
    from womd_records import json_to_proto  # noqa: PLC0415

    from gpusim.data.tfrecord import write_records

    files = sorted(pathlib.Path(src_dir).glob("*.json.xz"))
    return write_records(out, (json_to_proto(json.load(lzma.open(f))).SerializeToString() for f in files),
                         compress=gzip)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sources", nargs="*")
    p.add_argument("--make-tfrecord", metavar="JSON_DIR")
    p.add_argument("--gzip", action="store_true")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--limit", type=int, default=None)
    args = p.parse_args(argv)

    from gpusim.data import ScenarioPack

    sources = list(args.sources)
    tmp = None
    if args.make_tfrecord:
        tmp = tempfile.TemporaryDirectory()
        sources.append(str(_make_tfrecord(args.make_tfrecord, pathlib.Path(tmp.name) / "womd.tfrecord", args.gzip)))
    in_bytes = sum(os.path.getsize(f) for s in sources
                   for f in ([s] if os.path.isfile(s) else [str(c) for c in pathlib.Path(s).iterdir()]))
    t0 = time.perf_counter()
    pack = ScenarioPack.from_json(sources, workers=args.workers, limit=args.limit)
    sec = time.perf_counter() - t0
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    S = pack.num_scenarios
    print(json.dumps({
        "sources": sources if not tmp else args.sources + [f"<{args.make_tfrecord} as TFRecord>"],
        "input_bytes": in_bytes, "workers": args.workers, "scenarios": S, "errors": len(pack.stats["errors"]),
        "seconds": round(sec, 2), "scenarios_per_s": round(S / sec, 2), "input_mib_per_s": round(in_bytes / sec / 2**20, 2),
        "pack_mib": round(pack.nbytes() / 2**20, 1), "peak_rss_mib": round(peak_mib),
        "signals": int(pack.num_signals.sum()), "scenarios_with_signals": int((pack.num_signals > 0).sum()),
    }, indent=1))
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
