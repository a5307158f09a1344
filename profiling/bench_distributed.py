"""Scaling of ``train/run.py`` under torchrun: 1 vs N ranks, agent-steps/s and time in all-reduce.

Runs ``torchrun --standalone --nproc-per-node N train/run.py <flags>`` for each N of ``--ranks``,
interleaved over ``--rounds`` rounds (1, 2, 1, 2, ...) so that a load change on a shared machine
hits every configuration alike, and reads the run's ``metrics.jsonl`` (one record per update):

* ``sps``: agent-steps per second of all ranks together, from the first to the last record
  (the first update, with start-up and first-call costs, is left out);
* ``allreduce_s``: rank 0's seconds in all-reduces over the same updates (gradient buckets from
  launch to completion, which includes waiting for the slower rank, plus the per-update count and
  per-report reductions), and its fraction of the wall time;
* the load average of the machine before each run.

``--num-worlds`` is per rank (weak scaling: N ranks simulate N times the worlds), and the step
budget is ``--steps-per-rank x N``, so every configuration runs about as many updates.

Usage (from the repository root)::

    python profiling/bench_distributed.py                       # 1 vs 2 ranks, gloo, 1 thread each
    python profiling/bench_distributed.py --ranks 1 2 --rounds 2 --steps-per-rank 15000 -- --num-worlds 8
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def run_once(nproc: int, steps: int, flags: list[str], out_dir: pathlib.Path, tag: str) -> dict:
    """One torchrun launch; returns the steady-state figures read from its JSONL."""
    load = os.getloadavg()[0]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           str(REPO / "train" / "run.py"), "--total-timesteps", str(steps), "--device", "cpu", "--num-threads", "1",
           "--report-interval", "1", "--quiet", "--log-dir", str(out_dir), "--run-name", tag, *flags]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    t0 = time.time()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    recs = [json.loads(x) for x in (out_dir / tag / "metrics.jsonl").read_text().splitlines()]
    if len(recs) < 3:
        raise SystemExit(f"{tag}: only {len(recs)} updates; raise --steps-per-rank")
    first, last = recs[0], recs[-1]
    span = last["time"] - first["time"]
    comm = sum(x.get("allreduce_s", 0.0) for x in recs[1:])
    return {"ranks": nproc, "updates": len(recs) - 1, "sps": (last["global_step"] - first["global_step"]) / span,
            "allreduce_s": comm, "allreduce_frac": comm / span, "update_s": span / (len(recs) - 1),
            "load_before": load, "wall_s": wall}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps-per-rank", type=int, default=12_000)
    ap.add_argument("--json", action="store_true", help="print the raw results as JSON")
    ap.add_argument("flags", nargs="*", help="train/run.py flags after --, e.g. -- --num-worlds 8")
    args = ap.parse_args(argv)
    flags = args.flags or ["--num-worlds", "8"]
    results = []
    with tempfile.TemporaryDirectory() as d:
        for rnd in range(args.rounds):
            for n in args.ranks:
                res = run_once(n, args.steps_per_rank * n, flags, pathlib.Path(d), f"r{rnd}-n{n}")
                results.append(res)
                print(f"round {rnd} ranks {n}: {res['sps']:.0f} agent-steps/s, {res['update_s']:.2f} s/update, "
                      f"all-reduce {res['allreduce_s']:.2f} s ({100 * res['allreduce_frac']:.1f}% of the time), "
                      f"load {res['load_before']:.1f}", flush=True)
    if args.json:
        print(json.dumps(results, indent=1))
    base = statistics.median(r["sps"] for r in results if r["ranks"] == args.ranks[0])
    print(f"\nmedian over {args.rounds} round(s); flags {' '.join(flags)}; torch threads 1 per rank")
    print("| ranks | agent-steps/s | speed-up | s/update | all-reduce share of time |")
    print("|---|---|---|---|---|")
    for n in args.ranks:
        rs = [r for r in results if r["ranks"] == n]
        sps = statistics.median(r["sps"] for r in rs)
        print(f"| {n} | {sps:.0f} | {sps / base:.2f}x | {statistics.median(r['update_s'] for r in rs):.2f} | "
              f"{100 * statistics.median(r['allreduce_frac'] for r in rs):.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
