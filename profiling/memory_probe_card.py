"""Ship the memory-task probe: copy a run's checkpoint to ``policies/memory_probe.pt`` (about
1.8 MB at the default policy size, under the 5 MB cap) and write its card ``policies/memory_probe.md`` from the run and
the held-out evaluation JSONs (docs/trial.md, "The experiment"); print the rows of the table in
docs/trial.md.

Usage::

    python profiling/memory_probe_card.py --run runs/memory_probe \\
        --evals eval_episode_det.json eval_episode_sto.json eval_trial_det.json eval_trial_sto.json \\
        --hardware "$(nvidia-smi -L | head -1)" --command "python train/run.py ..."

Every ``--evals`` file is a ``train/evaluate.py --json`` output of the run's checkpoint; its row is
labelled by its ``memory`` (``as trained`` / ``episode``: with memory; ``trial``: the control) and
``deterministic`` / ``decode`` fields. ``s = 2 * trial_0_score`` (docs/trial.md, "What s²/2 means").
Errors (a missing file, an evaluation JSON without trial scores): one line, exit code 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import subprocess
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_COMMAND = ("python train/run.py --data womd_train --env.goal-behavior trial --env.k-trials 2 "
                   "--env.goal-candidates 2 --device cuda --total-timesteps 50000000 --seed 1 --log-dir runs "
                   "--run-name memory_probe")


def _ci(summary: dict, name: str) -> str:
    m = summary.get(name)
    if m is None:
        raise ValueError(f"the evaluation has no {name} (was it run in trial mode?)")
    return f"{m['mean']:.3f} [{m['lo']:.3f}, {m['hi']:.3f}]"


def table_rows(evals: list[pathlib.Path]) -> list[str]:
    """Markdown rows ``| run | trial_0 | trial_1 | s | s²/2 | ada_delta | n |`` of the evaluation JSONs."""
    rows = []
    for path in evals:
        d = json.loads(path.read_text())
        s = d["runs"][0]["summary"]
        memory = "control (`--memory trial`)" if d.get("memory") == "trial" else "memory"
        kind = "sampled" if not d.get("deterministic", True) else (
            "deterministic, `--decode mean`" if d.get("decode") == "mean" else "deterministic")
        t0 = s["trial_0_score"]["mean"] if "trial_0_score" in s else None
        if t0 is None:
            raise ValueError(f"{path}: no trial_0_score (was it run in trial mode?)")
        skill = 2.0 * t0
        rows.append(f"| {memory}, {kind} | {_ci(s, 'trial_0_score')} | {_ci(s, 'trial_1_score')} | {skill:.3f} | "
                    f"{skill * skill / 2:.3f} | {_ci(s, 'ada_delta_trial_1_minus_0')} | "
                    f"{s['trial_0_score']['n']} |")
    return rows


def _git() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout
        return "this repository" + (" with uncommitted changes" if dirty.strip() else "") + (" (no git)" if not head else "")
    except OSError:
        return "not recorded"


def write(run: pathlib.Path, evals: list[pathlib.Path], out: pathlib.Path, command: str, hardware: str) -> str:
    """Copy the checkpoint and write the card; returns the card's text."""
    data = (run / "checkpoint.pt").read_bytes()  # as saved (the loader wants every part, optimizer included)
    ckpt = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=False)
    pt = out.with_suffix(".pt")
    pt.parent.mkdir(parents=True, exist_ok=True)
    pt.write_bytes(data)
    env, pol = ckpt["env_config"], ckpt["policy"]
    elapsed = (ckpt.get("extra") or {}).get("elapsed")
    rows = table_rows(evals)
    card = f"""# memory_probe — an ego with KV-cache memory trained on the memory task (2 candidate goals, 2 trials)

## Checkpoint

- File: `policies/{pt.name}`, {len(data):,} bytes (at most 5,000,000), SHA-256 {hashlib.sha256(data).hexdigest()}.
- Policy: {json.dumps(pol['config'])}, {pol['num_actions']} discrete actions.
- Env settings it was trained for: goal `{env['goal_behavior']}`, `k_trials` {env['k_trials']},
  `goal_candidates` {env['goal_candidates']}, `max_controlled` {env['max_controlled']}, collision
  `{env['collision_behavior']}`, offroad `{env['offroad_behavior']}` (`train/evaluate.py` keeps them).

## Data and split

- Scenarios: the `train` split of `data/splits.json` (52 of the 72 shared WOMD scenarios).
- Held out for the figures below: the `held_out` split of `data/splits.json` (20 scenarios).
- Scenarios skipped by the converter, with reasons: none.

## Training command

```
{command}
```

- Code: {_git()}.
- Shaping: experience `candidate_progress` (the memory task's default; the run directory's `config.json` replays the run).

## Hardware, steps and wall time

- Hardware: {hardware}.
- Agent-steps trained (`global_step`): {ckpt['global_step']:,}. Updates: {ckpt['update']}.
- Wall time: {f'{elapsed:.0f} s' if elapsed is not None else 'not recorded'} (the run's elapsed time at the checkpoint).

## Held-out results

Command (for `--memory` in `episode`, `trial`; each as below, with `--decode mean` and with
`--stochastic`; `womd_held_out` from `python train/splits.py held_out --data path/to/womd --link womd_held_out`):

```
python train/evaluate.py --policy policies/{pt.name} --data womd_held_out --episodes-per-scenario 10 \\
    --memory episode --num-threads 1 --no-per-scenario --json eval_episode_det.json
```

Means over agent-episodes with 95% intervals; s = 2 x trial_0_score, the most memory can add is s²/2
(docs/trial.md):

| run | trial_0_score | trial_1_score | s | s²/2 | ada_delta_trial_1_minus_0 | agent-episodes |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Baselines: the memory task compares trial 1 with trial 0 of the same policy. For scale,
`steer_to_goal` told the true candidate (which no policy is) reaches it in 0.526 [0.472, 0.580]
of the held-out trials (docs/trial.md).

## Limitations

Trained only on the memory task (2 candidates, 2 trials); other env settings and more candidates
were not tested. Its driving is weak (s well below 1), and s bounds what memory can show; the
figures above show no use of memory yet (docs/trial.md says where it fails).

## Licence

Trained on the Waymo Open Motion Dataset: for non-commercial use only, under the Waymo Open
Dataset License Agreement for Non-Commercial Use (https://waymo.com/open/terms).
"""
    out.with_suffix(".md").write_text(card)
    return card


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="the training run directory (checkpoint.pt inside)")
    ap.add_argument("--evals", nargs="+", required=True, help="train/evaluate.py --json files of its checkpoint")
    ap.add_argument("--out", default=str(ROOT / "policies" / "memory_probe"), help="path without suffix")
    ap.add_argument("--command", default=DEFAULT_COMMAND, help="the training command line, as run")
    ap.add_argument("--hardware", default="not recorded", help="e.g. the line of nvidia-smi -L")
    args = ap.parse_args(argv)
    run = pathlib.Path(args.run)
    try:
        for p in [run / "checkpoint.pt"] + [pathlib.Path(e) for e in args.evals]:
            if not p.is_file():
                raise FileNotFoundError(f"{p}: no such file")
        write(run, [pathlib.Path(e) for e in args.evals], pathlib.Path(args.out), args.command, args.hardware)
    except (OSError, ValueError, KeyError) as e:
        print(f"memory_probe_card: {e}", file=sys.stderr)
        return 2
    print("\n".join(table_rows([pathlib.Path(e) for e in args.evals])))
    print(f"wrote {pathlib.Path(args.out).with_suffix('.pt')} and {pathlib.Path(args.out).with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
