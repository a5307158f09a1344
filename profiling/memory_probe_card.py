"""Ship the memory-task probe: copy a run's checkpoint to ``policies/memory_probe.pt`` (about
1.8 MB at the default policy size, under the 5 MB cap) and write its card ``policies/memory_probe.md`` from the run and
the held-out evaluation JSONs (docs/trial.md, "The experiment"); print the rows of the table in
docs/trial.md.

Usage::

    python profiling/memory_probe_card.py --run runs/memory_probe \\
        --evals eval_episode_det.json eval_episode_sto.json eval_trial_det.json eval_trial_sto.json \\
        --hardware "$(nvidia-smi -L | head -1)" --command "python train/run.py ..." \\
        --left-out "1c86ee6a2c07e516=its controlled agent in slot 2 has no candidate place"

Every ``--evals`` file is a ``train/evaluate.py --json`` output of the run's checkpoint; its row is
labelled by its ``memory`` (``as trained`` / ``episode``: with memory; ``trial``: the control) and
``deterministic`` / ``decode`` fields. ``s = 2 * trial_0_score`` (docs/trial.md, "What s²/2 means").
The figures are on the ``held_out`` split of ``data/splits_v2.json`` (:data:`train.splits.SPLITS_FILE`):
the scenes the evaluations ran must be that split's, less the ``--left-out`` ones (each named with
its reason on the card).
Errors (a missing file, an evaluation JSON without trial scores, evaluations on other scenes than
the held-out split less ``--left-out``): one line, exit code 2.
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
sys.path.insert(0, str(ROOT))
from train.splits import SPLITS_FILE, read_splits  # noqa: E402  (the repository root on the path first)

DEFAULT_COMMAND = ("python train/run.py --data womd_train --env.goal-behavior trial --env.k-trials 2 "
                   "--env.goal-candidates 2 --env.scenario-length 40 --env.candidate-practice 0.5 "
                   "--total-timesteps 5000000 --checkpoint-interval 50 --num-threads 1 --seed 1 --run-name memory_probe")


def _summary(d: dict, label: str | None = None) -> dict:
    """The summary of the run labelled ``label`` (default: the first) of a loaded evaluation JSON."""
    for run in d["runs"]:
        if label is None or run["label"] == label:
            return run["summary"]
    raise KeyError(label)


def _ci(summary: dict, name: str, digits: int = 3) -> str:
    m = summary.get(name)
    if m is None:
        raise ValueError(f"the evaluation has no {name} (was it run in trial mode?)")
    if "lo" not in m:  # a rate over no agent-episode has no interval
        return f"{m['mean']:.{digits}f}"
    return f"{m['mean']:.{digits}f} [{m['lo']:.{digits}f}, {m['hi']:.{digits}f}]"


def _after_decoy(s: dict, name: str) -> str:
    return _ci(s, name, digits=2) if name in s else "–"


def _label(d: dict) -> str:
    memory = "control (`--memory trial`)" if d.get("memory") == "trial" else "memory"
    kind = "sampled" if not d.get("deterministic", True) else (
        "deterministic, `--decode mean`" if d.get("decode") == "mean" else "deterministic")
    return f"{memory}, {kind}"


def table_rows(evals: list[pathlib.Path]) -> list[str]:
    """Markdown rows ``| run | trial_0 | trial_1 | s | s²/2 | ada_delta | after a decoy: goal | after
    a decoy: decoy again (n) | n |`` of the evaluation JSONs (the first run of each)."""
    rows = []
    for path in evals:
        d = json.loads(path.read_text())
        s = _summary(d)
        t0 = s["trial_0_score"]["mean"] if "trial_0_score" in s else None
        if t0 is None:
            raise ValueError(f"{path}: no trial_0_score (was it run in trial mode?)")
        skill = 2.0 * t0
        n_decoy = (s.get("decoy_then_goal_trial_1") or {}).get("n", 0)
        rows.append(f"| {_label(d)} | {_ci(s, 'trial_0_score')} | {_ci(s, 'trial_1_score')} | {skill:.3f} | "
                    f"{skill * skill / 2:.3f} | {_ci(s, 'ada_delta_trial_1_minus_0')} | "
                    f"{_after_decoy(s, 'decoy_then_goal_trial_1')} | {_after_decoy(s, 'decoy_then_decoy_trial_1')} "
                    f"(n {n_decoy}) | {s['trial_0_score']['n']} |")
    return rows


def verdict(evals: list[pathlib.Path]) -> str:
    """One sentence per evaluation: whether ``ada_delta`` meets the memory task's target (docs/trial.md:
    at least max(s²/4, 0.05) with its interval above 0 with memory; the control's interval holding 0)."""
    out = []
    for path in evals:
        d = json.loads(path.read_text())
        s = _summary(d)
        a, t0 = s["ada_delta_trial_1_minus_0"], s["trial_0_score"]["mean"]
        need = max(t0 * t0, 0.05)  # (2 t0)^2 / 4
        if d.get("memory") == "trial":
            ok = a["lo"] <= 0.0 <= a["hi"]
            out.append(f"{_label(d)}: interval {'includes' if ok else 'excludes'} 0 ({'as the target asks' if ok else 'not as the target asks'})")
        else:
            ok = a["lo"] > 0.0 and a["mean"] >= need
            out.append(f"{_label(d)}: {a['mean']:.3f} against the target {need:.3f} with the interval above 0: "
                       f"{'met' if ok else 'not met'}")
    return "; ".join(out) + "."


def steer_to_goal_line(evals: list[pathlib.Path]) -> str:
    """The baseline sentence of the card: ``steer_to_goal`` told the true candidate, from the first
    evaluation JSON that ran it beside the checkpoint (``--policy CKPT steer_to_goal``), else a
    pointer to docs/trial.md."""
    for path in evals:
        try:
            s = _summary(json.loads(path.read_text()), "steer_to_goal")
        except KeyError:
            continue
        return (f"For scale, `steer_to_goal` told the true candidate (which no policy is) reaches it in "
                f"{_ci(s, 'trial_0_score')} of the held-out trials ({path.name}).")
    return "For scale, see `steer_to_goal` told the true candidate in docs/trial.md."


def held_out_scenes(evals: list[pathlib.Path], left_out: dict[str, str]) -> tuple[int, int]:
    """``(split size, scenes evaluated)``: checks that every evaluation ran the ``held_out`` split of
    :data:`train.splits.SPLITS_FILE` less the ``left_out`` stems (``{stem: reason}``).

    Raises:
        ValueError: an evaluation ran other scenes (names the file, the missing and the extra ones),
            or a ``left_out`` stem is not in the split.
    """
    split = set(read_splits(SPLITS_FILE)["splits"]["held_out"])
    unknown = sorted(set(left_out) - split)
    if unknown:
        raise ValueError(f"--left-out {', '.join(unknown)}: not in the held_out split of {SPLITS_FILE.name}")
    want = split - set(left_out)
    for path in evals:
        for run in json.loads(path.read_text())["runs"]:
            got = set(run.get("scenarios") or [])
            if got != want:
                raise ValueError(f"{path}: run {run.get('label')} is not on the held_out split of {SPLITS_FILE.name} "
                                 f"less --left-out (missing {sorted(want - got)[:5]}, extra {sorted(got - want)[:5]}); "
                                 f"name each scene left out with --left-out STEM=REASON")
    return len(split), len(want)


def _git() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout
        return "this repository" + (" with uncommitted changes" if dirty.strip() else "") + (" (no git)" if not head else "")
    except OSError:
        return "not recorded"


def write(run: pathlib.Path, evals: list[pathlib.Path], out: pathlib.Path, command: str, hardware: str,
          left_out: dict[str, str] | None = None, code: str | None = None) -> str:
    """Copy the checkpoint and write the card; returns the card's text.

    ``left_out``: ``{stem: reason}`` of the held-out scenes the evaluations left out; ``code``: the
    card's code line (default: this repository's git state).

    Raises:
        ValueError: as :func:`held_out_scenes`, :func:`table_rows`.
    """
    left_out = left_out or {}
    n_split, n_run = held_out_scenes(evals, left_out)
    held = f"held_out of data/splits_v2.json, {n_split} scenes"
    if left_out:
        held += (f";\n  the figures below on {n_run} of them, left out (`train/evaluate.py` refuses them): "
                 + "; ".join(f"{k} ({v})" for k, v in sorted(left_out.items())))
    rm = "".join(f"\nrm womd_held_out/{k}.json.xz" for k in sorted(left_out))
    data = (run / "checkpoint.pt").read_bytes()  # as saved (the loader wants every part, optimizer included)
    ckpt = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=False)
    pt = out.with_suffix(".pt")
    pt.parent.mkdir(parents=True, exist_ok=True)
    pt.write_bytes(data)
    env, pol = ckpt["env_config"], ckpt["policy"]
    elapsed = (ckpt.get("extra") or {}).get("elapsed")
    rows = table_rows(evals)
    cfg = ckpt.get("config") or {}
    shaping = " ".join([str(cfg.get("experience", "candidate_progress"))] + list(cfg.get("experience_arg") or []))
    card = f"""# memory_probe — an ego with KV-cache memory trained on the memory task (2 candidate goals, 2 trials)

## Checkpoint

- File: `policies/{pt.name}`, {len(data):,} bytes (at most 5,000,000), SHA-256 {hashlib.sha256(data).hexdigest()}.
- Policy: {json.dumps(pol['config'])}, {pol['num_actions']} discrete actions.
- Env settings it was trained for: goal `{env['goal_behavior']}`, `k_trials` {env['k_trials']},
  `goal_candidates` {env['goal_candidates']}, `scenario_length` {env['scenario_length']} steps per trial,
  `max_controlled` {env['max_controlled']}, collision `{env['collision_behavior']}`, offroad
  `{env['offroad_behavior']}` (`train/evaluate.py` keeps them); training only (evaluation drops it):
  `candidate_practice` {env.get('candidate_practice', 0.0)}.

## Data and split

- Scenarios: the `train` split of `data/splits.json` (52 of the 72 shared WOMD scenarios; all 52 are
  in `train` of `data/splits_v2.json`, none in its `validation` or `held_out`).
- Held out for the figures below: {held}.
- Scenarios skipped by the converter, with reasons: none.

## Training command

```
{command}
```

- Code: {code or _git()}.
- Shaping: experience `{shaping}` (the run directory's `config.json` replays the run).

## Hardware, steps and wall time

- Hardware: {hardware}.
- Agent-steps trained (`global_step`): {ckpt['global_step']:,}. Updates: {ckpt['update']}.
- Wall time: {f'{elapsed:.0f} s' if elapsed is not None else 'not recorded'} (the run's elapsed time at the checkpoint).

## Held-out results

Command (for `--memory` in `episode`, `trial`; each as below, with `--decode mean` and with
`--stochastic`; `steer_to_goal` beside the checkpoint without `--memory`, which a baseline refuses:
the checkpoint's own memory is `episode`):

```
python train/splits.py held_out --data path/to/womd path/to/womd_more --link womd_held_out{rm}
python train/evaluate.py --policy policies/{pt.name} --data womd_held_out --episodes-per-scenario 10 \\
    --memory episode --num-threads 1 --no-per-scenario --json eval_episode_det.json
```

The control, `--memory trial`, clears the KV cache at every trial start and zeroes the `trial_index`
observation column: the exact memoryless control (a deterministic policy drives trial 1 as trial 0).
Means over agent-episodes ({n_run} scenes) with 95% intervals clustered by scenario, identical
repeated episodes counted once; s = 2 x trial_0_score, the most memory can add is s²/2 (docs/trial.md):

| run | trial_0_score | trial_1_score | s | s²/2 | ada_delta_trial_1_minus_0 | after a decoy in trial 0: the true goal in trial 1 | ... the decoy again | agent-episodes |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Against the target: {verdict(evals)}

Baselines: the memory task compares trial 1 with trial 0 of the same policy. {steer_to_goal_line(evals)}

## Limitations

Trained only on the memory task (2 candidates, 2 trials); other env settings and more candidates
were not tested. Its driving is weak (s well below 1), and s bounds what memory can show. The
figures are one training run's, on the held-out scenes; other seeds, the memoryless control
trained as such and the bundled sample are in docs/trial.md.

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
    ap.add_argument("--code", default=None, help="the card's code line (default: this repository's git state)")
    ap.add_argument("--left-out", nargs="*", default=[], metavar="STEM=REASON",
                    help="held-out scenes the evaluations left out, each with its reason")
    args = ap.parse_args(argv)
    run = pathlib.Path(args.run)
    try:
        for p in [run / "checkpoint.pt"] + [pathlib.Path(e) for e in args.evals]:
            if not p.is_file():
                raise FileNotFoundError(f"{p}: no such file")
        left_out = {}
        for item in args.left_out:
            stem, sep, reason = item.partition("=")
            if not sep or not stem or not reason:
                raise ValueError(f"--left-out {item!r}: give STEM=REASON")
            left_out[stem] = reason
        write(run, [pathlib.Path(e) for e in args.evals], pathlib.Path(args.out), args.command, args.hardware,
              left_out, args.code)
    except (OSError, ValueError, KeyError) as e:
        print(f"memory_probe_card: {e}", file=sys.stderr)
        return 2
    print("\n".join(table_rows([pathlib.Path(e) for e in args.evals])))
    print(f"wrote {pathlib.Path(args.out).with_suffix('.pt')} and {pathlib.Path(args.out).with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
