"""Command line: WOSAC realism figures of log baselines or of a submission file.

    python -m gpusim.wosac SRC... [--baseline log_replay constant_speed] [--submission FILE.binproto]
                           [--device cuda] [--json out.json] [--limit N] [--quiet]

``SRC`` are scenario files or directories (WOMD TFRecord or GPUDrive JSON, read through
``Scenario`` protos). Each ``--baseline`` (rollouts built from the log, no simulator) and the
``--submission`` (a ``SimAgentsChallengeSubmission`` binproto, e.g. from
``gpusim.data.proto_export.write_submission``) is scored on every scenario that can be scored;
the table shows, per component and the meta-metric, the mean over scenarios with a 95% normal
interval (``mean +- 1.96 s / sqrt(n)``, s the sample deviation over scenarios). Scenarios WOSAC
cannot score (no track to predict, no object valid at step 10, ...) are listed with their reason
and counted. A submission that is empty, lacks a scored scenario or whose objects or steps do not
match is refused (exit 2, one line naming the file and scenario); one with fewer rollouts per
scenario than the challenge's 32 is scored with a note saying so. ``--limit`` must be >= 1;
``--device cuda`` without CUDA and an unwritable ``--json`` are refused before any scoring. A
line on stderr names each scenario as it is scored, with its seconds (``--quiet``: none).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

from gpusim.data.errors import ScenarioError
from gpusim.wosac import config as C


def _interval(values: list[float]) -> dict:
    """Mean and 95% normal interval over scenarios (NaN values left out; n counts the rest)."""
    v = [x for x in values if not math.isnan(x)]
    n = len(v)
    if n == 0:
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
    m = sum(v) / n
    s = math.sqrt(sum((x - m) ** 2 for x in v) / (n - 1)) if n > 1 else 0.0
    h = 1.959964 * s / math.sqrt(n)
    return {"mean": m, "lo": max(0.0, m - h), "hi": min(1.0, m + h), "n": n}


def _score_all(scenes, make_rollouts, device, label: str = "", say=None) -> dict:
    """Per-scenario figures ``{scenario_id: {component: value}}`` for rollouts from ``make_rollouts(scene,
    batch)`` -> [1, R, N, 80, 4]; ``say(text)``, when given, is told ``LABEL: scenario I/N ID (S s)``
    after each scenario (a scenario takes seconds to minutes on a CPU)."""
    from gpusim.wosac.metrics import score
    from gpusim.wosac.scene import stack_scenes

    rows = {}
    for i, s in enumerate(scenes, 1):
        t0 = time.perf_counter()
        b = stack_scenes([s], device)
        out = score(b, make_rollouts(s, b).to(device))
        rows[s.scenario_id] = {k: float(v[0]) for k, v in out.items()}
        if say is not None:
            say(f"{label}: scenario {i}/{len(scenes)} {s.scenario_id} ({time.perf_counter() - t0:.1f} s)")
    return rows


def _say(text: str) -> None:
    """A progress line on stderr (the table goes to stdout)."""
    print(text, file=sys.stderr, flush=True)


def main(argv=None) -> int:
    """Entry point; returns the exit code (0 ok, 2 bad input)."""
    p = argparse.ArgumentParser(prog="python -m gpusim.wosac",
                                description=__doc__.split("\n\n")[0].removeprefix("Command line: "))
    p.add_argument("sources", nargs="+", metavar="SRC",
                   help="scenario files or directories: WOMD TFRecord shards or GPUDrive JSON")
    p.add_argument("--baseline", nargs="*", choices=("log_replay", "constant_speed"), default=None,
                   help="log baselines to score (rollouts built from the log, no simulator); default log_replay "
                        "without --submission, none with it")
    p.add_argument("--submission", default=None,
                   help="SimAgentsChallengeSubmission binproto to score (e.g. from train/evaluate.py --mode wosac "
                        "--export-rollouts)")
    p.add_argument("--device", default="cpu", help="torch device of the scoring: cpu (default) or cuda")
    p.add_argument("--limit", type=int, default=None, help="score at most N scenarios (N >= 1; default all)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr (the table is still printed)")
    p.add_argument("--json", default=None, help="write every figure (per scenario too) to this file")
    args = p.parse_args(argv)
    from gpusim.data.proto_export import read_submission
    from gpusim.wosac.baselines import BASELINES
    from gpusim.wosac.rollouts import rollouts_for
    from gpusim.wosac.sources import load_scenes

    from gpusim.fileio import OutputError, check_output_path, write_text

    baselines = args.baseline if args.baseline is not None else ([] if args.submission else ["log_replay"])
    if args.limit is not None and args.limit < 1:
        print(f"error: --limit must be >= 1, got {args.limit} (leave it out to score every scenario)", file=sys.stderr)
        return 2
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        print(f"error: --device {args.device}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"error: --device {args.device}: CUDA is not available here; pass --device cpu", file=sys.stderr)
        return 2
    try:
        if args.json:
            check_output_path(args.json, "--json")
        scenes, skipped = load_scenes(args.sources, limit=args.limit)
        sub = read_submission(args.submission) if args.submission else None
    except (ScenarioError, RuntimeError, OutputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if sub is not None and not sub:
        print(f"error: --submission {args.submission}: empty submission (no scenario rollouts in it)", file=sys.stderr)
        return 2
    for name, why in skipped:
        print(f"skipped: {name}: {why}", file=sys.stderr)
    if not scenes:
        print("error: no scenario can be scored (see the reasons above)", file=sys.stderr)
        return 2
    results = {}
    t0 = time.perf_counter()
    say = None if args.quiet else _say
    if say is not None:
        say(f"scoring {len(scenes)} scenario(s) for {', '.join([*baselines, *(['submission'] if sub else [])])} "
            f"on {device}")
    for base in baselines:
        results[base] = _score_all(scenes, lambda s, b, f=BASELINES[base]: f(b), device, base, say)
    if sub is not None:
        missing = [s.scenario_id for s in scenes if s.scenario_id not in sub]
        if missing:
            print(f"error: {args.submission}: no rollouts for scenario(s) {missing[:5]} (the file does not match "
                  f"the scenarios)", file=sys.stderr)
            return 2
        counts = sorted({int(sub[s.scenario_id][1].shape[0]) for s in scenes})
        if counts[0] < C.N_ROLLOUTS:
            print(f"note: {args.submission}: {'/'.join(map(str, counts))} rollout(s) per scenario; the challenge "
                  f"requires {C.N_ROLLOUTS}, so these figures are not comparable to its leaderboard", file=sys.stderr)
        try:
            results["submission"] = _score_all(
                scenes, lambda s, b: rollouts_for(s, *sub[s.scenario_id], file=args.submission)[None], device,
                "submission", say)
        except ScenarioError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    seconds = time.perf_counter() - t0
    names = (*C.COMPONENTS, *C.BUCKETS, "metametric")
    summary = {k: {n: _interval([r[n] for r in rows.values()]) for n in names} for k, rows in results.items()}
    print(f"{len(scenes)} scenario(s) scored, {len(skipped)} skipped; {seconds:.1f} s on {device}")
    print(f"{'component':<28}" + "".join(f"{k:>26}" for k in results))
    for n in names:
        cells = "".join(f"{summary[k][n]['mean']:>9.4f} [{summary[k][n]['lo']:.3f}, {summary[k][n]['hi']:.3f}]"
                        for k in results)
        print(f"{n:<28}{cells}")
    if args.json:
        try:
            write_text(args.json, json.dumps({"summary": summary, "per_scenario": results, "skipped": skipped,
                                              "seconds": seconds, "device": str(device)}, indent=1), flag="--json")
        except OutputError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
