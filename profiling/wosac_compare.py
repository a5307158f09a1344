"""gpusim's WOSAC metrics against Waymo's own scorer, per scenario and component.

    # 1. scenarios as one Scenario TFRecord + rollouts of a log baseline as a submission
    python profiling/wosac_compare.py prepare data/womd_tfrecord ../shared/data/womd/1c365f15b70ebdbf.json.xz \\
        --baseline log_replay --scenarios-out /tmp/w/s.tfrecord --submission-out /tmp/w/log_replay.binproto
    # 2. the official scorer, in its own venv (profiling/wosac_official.py)
    /tmp/wosac-venv/bin/python profiling/wosac_official.py --scenarios /tmp/w/s.tfrecord \\
        --submission /tmp/w/log_replay.binproto --json /tmp/w/official.json
    # 3. gpusim on the same files, and the table of differences
    python profiling/wosac_compare.py compare --scenarios /tmp/w/s.tfrecord \\
        --submission /tmp/w/log_replay.binproto --official /tmp/w/official.json [--json out.json]

``compare`` scores the submission with :func:`gpusim.wosac.metrics.score` (``--device``, CPU by
default) and prints, per component, the mean gpusim value, the mean official value, the largest
absolute per-scenario difference and whether the tolerances hold (meta-metric within 0.01, each
component within 0.03), then the per-scenario meta-metrics. ``bench SRC... --device cuda`` times
gpusim's scoring of log baselines per scenario and for all scenarios in one batch. Exit code 2 on
bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from gpusim.data.errors import ScenarioError
from gpusim.wosac import config as C

TOL_META, TOL_COMPONENT = 0.01, 0.03


def _scorable_scenes(args) -> list:
    """The scenes of ``args.sources`` (at most ``args.limit``) that can be scored; each skipped one
    is named on stderr with its reason, and an empty list comes with an error line (the caller
    exits 2)."""
    from gpusim.wosac.sources import load_scenes

    scenes, skipped = load_scenes(args.sources, limit=args.limit)
    for name, why in skipped:
        print(f"skipped: {name}: {why}", file=sys.stderr)
    if not scenes:
        print("error: no scenario can be scored", file=sys.stderr)
    return scenes


def _prepare(args) -> int:
    from gpusim.data.proto_export import write_submission
    from gpusim.data.tfrecord import write_records
    from gpusim.wosac.baselines import BASELINES
    from gpusim.wosac.rollouts import proto_payloads
    from gpusim.wosac.scene import stack_scenes

    scenes = _scorable_scenes(args)
    if not scenes:
        return 2
    write_records(args.scenarios_out, proto_payloads(args.sources, {s.scenario_id for s in scenes}))
    rollouts = {}
    for s in scenes:
        b = stack_scenes([s])
        sim = BASELINES[args.baseline](b, args.rollouts)[0].numpy()
        rollouts[s.scenario_id] = (s.object_id, sim)
    write_submission(args.submission_out, rollouts, method=args.baseline)
    print(f"wrote {args.scenarios_out} ({len(scenes)} scenarios) and {args.submission_out} ({args.baseline})")
    return 0


def gpusim_scores(scenarios, submission, device="cpu") -> dict:
    """Score ``submission`` (binproto) on ``scenarios`` (TFRecord) with gpusim, one scenario at a
    time: ``{scenario_id: {component: value, "metametric": value, "seconds": s}}``.

    Raises:
        ScenarioError: unreadable files or rollouts that do not match a scenario.
    """
    from gpusim.data.proto_export import read_submission
    from gpusim.wosac.metrics import score
    from gpusim.wosac.rollouts import rollouts_for
    from gpusim.wosac.scene import stack_scenes
    from gpusim.wosac.sources import load_scenes

    scenes, _ = load_scenes([scenarios])
    by_id = {s.scenario_id: s for s in scenes}
    sub = read_submission(submission)
    out = {}
    for sid, (ids, states) in sub.items():
        if sid not in by_id:
            continue
        t0 = time.perf_counter()
        b = stack_scenes([by_id[sid]], device)
        sim = rollouts_for(by_id[sid], ids, states, file=submission)[None].to(device)
        res = score(b, sim)
        if device != "cpu":
            torch.cuda.synchronize()
        row = {k: float(v[0]) for k, v in res.items()}
        row["seconds"] = time.perf_counter() - t0
        out[sid] = row
    return out


def _compare(args) -> int:
    try:
        official = json.load(open(args.official))["scenarios"]
        mine = gpusim_scores(args.scenarios, args.submission, args.device)
    except (OSError, ValueError, KeyError, ScenarioError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    common = sorted(set(official) & set(mine))
    if not common:
        print("error: no scenario scored by both", file=sys.stderr)
        return 2
    rows = []
    print(f"{len(common)} scenario(s)\n{'component':<28}{'gpusim':>9}{'official':>10}{'max |diff|':>12}  ok")
    for name in (*C.COMPONENTS, "metametric"):
        g = np.array([mine[s][name] for s in common])
        o = np.array([official[s][name] for s in common])
        d = np.abs(g - o)
        tol = TOL_META if name == "metametric" else TOL_COMPONENT
        ok = bool(np.all(d <= tol) or (np.isnan(g) & np.isnan(o)).all())
        rows.append(dict(component=name, gpusim=float(np.nanmean(g)), official=float(np.nanmean(o)),
                         max_abs_diff=float(np.nanmax(d)) if np.isfinite(d).any() else float("nan"), ok=ok))
        print(f"{name:<28}{rows[-1]['gpusim']:>9.4f}{rows[-1]['official']:>10.4f}{rows[-1]['max_abs_diff']:>12.1e}  "
              f"{'yes' if ok else 'NO'}")
    print("\nper scenario (metametric gpusim / official, seconds gpusim / official):")
    for s in common:
        print(f"  {s}: {mine[s]['metametric']:.4f} / {official[s]['metametric']:.4f}   "
              f"{mine[s]['seconds']:.2f} / {official[s].get('seconds', float('nan')):.2f}")
    if args.json:
        json.dump({"components": rows, "gpusim": mine, "official": {s: official[s] for s in common}},
                  open(args.json, "w"), indent=1)
    return 0


def _bench(args) -> int:
    """Time gpusim's scoring of log baselines per scenario and for all scenarios in one batch."""
    from gpusim.wosac.baselines import BASELINES
    from gpusim.wosac.metrics import score
    from gpusim.wosac.scene import stack_scenes

    scenes = _scorable_scenes(args)
    if not scenes:
        return 2
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    rows = {}
    for base in args.baseline:
        for s in [None, *scenes]:  # the first pass (None: scenario 0 again) warms up
            sc = scenes[0] if s is None else s
            b = stack_scenes([sc], dev)
            sync()
            t0 = time.perf_counter()
            out = score(b, BASELINES[base](b, args.rollouts))
            sync()
            if s is not None:
                rows.setdefault(sc.scenario_id, {})[base] = (float(out["metametric"][0]), time.perf_counter() - t0)
        b = stack_scenes(scenes, dev)
        sync()
        t0 = time.perf_counter()
        out = score(b, BASELINES[base](b, args.rollouts))
        sync()
        print(f"{base}: {len(scenes)} scenarios in one batch: {time.perf_counter() - t0:.2f} s on {dev}; "
              f"mean metametric {float(out['metametric'].mean()):.4f}")
    for sid, r in rows.items():
        print(f"  {sid} ({next(s.num_objects for s in scenes if s.scenario_id == sid)} agents): "
              + ", ".join(f"{k} {m:.4f} in {t:.2f} s" for k, (m, t) in r.items()))
    return 0


def main(argv=None) -> int:
    """Command line entry point (see the module doc)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare", help="scenarios TFRecord + a baseline's submission binproto")
    a.add_argument("sources", nargs="+")
    a.add_argument("--baseline", choices=("log_replay", "constant_speed"), default="log_replay")
    a.add_argument("--rollouts", type=int, default=C.N_ROLLOUTS)
    a.add_argument("--limit", type=int, default=None)
    a.add_argument("--scenarios-out", required=True)
    a.add_argument("--submission-out", required=True)
    b = sub.add_parser("compare", help="score with gpusim and diff with the official JSON")
    b.add_argument("--scenarios", required=True)
    b.add_argument("--submission", required=True)
    b.add_argument("--official", required=True)
    b.add_argument("--device", default="cpu")
    b.add_argument("--json", default=None)
    c = sub.add_parser("bench", help="time gpusim's scoring of log baselines (per scenario and batched)")
    c.add_argument("sources", nargs="+")
    c.add_argument("--baseline", nargs="+", choices=("log_replay", "constant_speed"), default=["log_replay"])
    c.add_argument("--rollouts", type=int, default=C.N_ROLLOUTS)
    c.add_argument("--limit", type=int, default=None)
    c.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    torch.set_num_threads(max(1, min(torch.get_num_threads(), 4)))
    return {"prepare": _prepare, "compare": _compare, "bench": _bench}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
