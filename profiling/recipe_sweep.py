"""End-to-end trainer throughput of several recipes: short ``train/run.py`` runs, one per setting.

Each setting is a set of trainer flags; every run is a real ``python train/run.py`` process (CUDA
graph of the rollout, host reads, reports, all as a user gets them) with a report after every
update, stopped after about ``--iters`` updates. From its ``metrics.jsonl`` the sweep takes the
median over the updates after the first ``--skip`` (kernel compilation, graph capture) of

* ``sps``: agent-steps/s as the trainer counts them (active slots x horizon per rollout),
* ``rollout_s`` and ``update_s``: seconds per update spent collecting and in the PPO update,
* ``optimizer_steps`` per update,

and prints one table row per setting (and writes them as JSON with ``--json FILE``). The runs go
one after another, so on a shared device each has it alone.

Usage (repository root)::

    python profiling/recipe_sweep.py --iters 8 \\
        --setting base= --setting w4096="--num-worlds 4096" --setting bf16="--num-worlds 4096 --ppo.autocast bf16" \\
        -- --data data/womd_sample --device cuda

Flags after ``--`` go to every run; a setting's own flags come after them (and win). The budget of
a run is set from its world count: ``iters x num_worlds x max_controlled x horizon / 2``
agent-steps (the trainer counts active slots only, so a run makes between ``iters`` and ``2 x
iters`` updates when at least half of the slots hold an agent).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

ROOT = pathlib.Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    from profiling.cli import split_train_argv

    argv, common = split_train_argv(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="arguments after -- go to every train/run.py run")
    ap.add_argument("--setting", action="append", default=[], metavar="NAME=FLAGS",
                    help="a setting: its name and its trainer flags (shell-quoted); repeat for each")
    ap.add_argument("--iters", type=int, default=8, help="updates per run, at least (see the budget rule)")
    ap.add_argument("--skip", type=int, default=2, help="first updates left out of the medians")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds before a run is stopped")
    ap.add_argument("--log-dir", default=None, help="where the runs go (default: a temporary directory)")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
    args.common = common
    if not args.setting:
        ap.error("--setting: give at least one, e.g. --setting base=")
    for s in args.setting:
        if "=" not in s:
            ap.error(f"--setting {s}: expected NAME=FLAGS (FLAGS may be empty: NAME=)")
    return args


def run_budget(flags: list[str], iters: int) -> int:
    """Agent-steps for about ``iters`` updates of the run ``flags`` describe (parsed as
    ``train/run.py`` parses them, recipe included): ``iters x W x C x horizon // 2``, with the
    env's episode length (``EnvConfig.horizon``: 91 steps, times ``k_trials`` in trial mode)."""
    from train.config import parse_args as train_parse

    cfg = train_parse(list(flags) + ["--quiet"])
    return max(1, iters * cfg.num_worlds * cfg.env.max_controlled * cfg.env.horizon // 2)


def summarise(records: list[dict], skip: int) -> dict:
    """Medians of ``sps``, ``rollout_s``, ``update_s`` and ``optimizer_steps`` over ``records``
    (one ``metrics.jsonl`` record per update) after the first ``skip``; all records when fewer
    remain. ``updates`` is the number of records used. Raises ValueError when there is none."""
    use = records[skip:] or records
    if not use:
        raise ValueError("no report records")
    out = {k: statistics.median(float(r[k]) for r in use) for k in ("sps", "rollout_s", "update_s", "optimizer_steps")}
    out["updates"] = len(use)
    out["update_share"] = out["update_s"] / max(out["rollout_s"] + out["update_s"], 1e-12)
    return out


def run_setting(name: str, flags: list[str], args, log_dir: pathlib.Path) -> dict:
    """One ``train/run.py`` run of ``flags``; returns its :func:`summarise` row (plus ``name``,
    ``flags``, ``wall_s``, ``rc``), or a row with ``error`` when the run failed."""
    budget = run_budget(flags, args.iters)
    cmd = [sys.executable, str(ROOT / "train" / "run.py"), *flags, "--report-interval", "1",
           "--total-timesteps", str(budget), "--log-dir", str(log_dir), "--run-name", name, "--quiet"]
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
        rc, err = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, err = "timeout", (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    row = {"name": name, "flags": " ".join(flags), "wall_s": time.time() - t0, "rc": rc}
    path = log_dir / name / "metrics.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    records = [r for r in records if "sps" in r and "update_s" in r]
    try:
        row.update(summarise(records, args.skip))
    except ValueError:
        row["error"] = (err or "no metrics")[-600:]
    return row


def main(argv=None) -> list[dict]:
    """Run every setting and print the table; returns the rows."""
    args = parse_args(argv)
    log_dir = pathlib.Path(args.log_dir or tempfile.mkdtemp(prefix="recipe_sweep_"))
    rows = []
    for s in args.setting:
        name, flags = s.split("=", 1)
        row = run_setting(name, [*args.common, *shlex.split(flags)], args, log_dir)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print(f"# recipe sweep: medians over updates after the first {args.skip}; common flags {args.common}")
    print(f"{'setting':<14}{'agent-steps/s':>15}{'rollout s':>11}{'update s':>10}{'update %':>10}{'opt steps':>10}"
          f"{'updates':>9}  flags")
    for r in rows:
        if "error" in r:
            print(f"{r['name']:<14}  failed (rc {r['rc']}): {r['error'].strip().splitlines()[-1] if r['error'].strip() else ''}")
            continue
        print(f"{r['name']:<14}{r['sps']:>15,.0f}{r['rollout_s']:>11.3f}{r['update_s']:>10.3f}"
              f"{100 * r['update_share']:>9.0f}%{r['optimizer_steps']:>10.0f}{r['updates']:>9d}  {r['flags']}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
