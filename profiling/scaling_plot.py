"""Plot goal rate against the number of training scenes: validation (with intervals) and training
time, one curve per budget.

Each point is a run directory (its last ``metrics.jsonl`` record gives the training-time goal rate,
sampled, per-agent EMA) and its validation figure from an ``evaluate --json`` file that evaluated
that run's checkpoint (matched by the checkpoint path, or by the run directory's name in the
label). The gap between the two curves is the generalisation gap.

    python -m profiling.scaling_plot --out scaling.png \\
        --curve "CPU, 2M steps" val_cpu.json 25=runs/cpu_scaling/n25_s1 50=runs/cpu_scaling/n50_s1 \\
        --curve "H200, about 40M steps" val_gpu.json 25=runs/gpu_round/drv_n25_s1 50=runs/gpu_round/drv_n50_s1
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys


def curve_points(eval_json, pairs: list[str]) -> list[dict]:
    """``[{n, val, lo, hi, train}]`` of one curve, sorted by ``n``.

    Args:
        eval_json: an ``evaluate --json`` file. pairs: ``"N=RUN_DIR"`` strings.

    Raises:
        ValueError: a malformed pair, a run without ``metrics.jsonl`` or without an evaluation.
    """
    runs = json.loads(pathlib.Path(eval_json).read_text())["runs"]
    out = []
    for pair in pairs:
        n, sep, d = pair.partition("=")
        if not sep or not n.isdigit():
            raise ValueError(f"{pair!r}: expected N=RUN_DIR")
        d = pathlib.Path(d)
        lines = (d / "metrics.jsonl").read_text().splitlines()
        train = json.loads(lines[-1])["goal_reached"]
        hit = [r for r in runs if pathlib.Path(r.get("policy", "")).parent.name == d.name
               or r["label"].startswith(d.name + "/")]
        if not hit:
            raise ValueError(f"{eval_json}: no evaluation of {d / 'checkpoint.pt'}")
        g = hit[0]["summary"]["goal_reached"]
        out.append({"n": int(n), "val": g["mean"], "lo": g["lo"], "hi": g["hi"], "train": train})
    return sorted(out, key=lambda p: p["n"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--curve", nargs="+", action="append", required=True, metavar="NAME EVAL_JSON N=RUN_DIR",
                    help="a curve: its name, the evaluation file, then N=RUN_DIR points")
    ap.add_argument("--reference", type=float, help="a horizontal line (e.g. steer_to_goal's validation goal)")
    ap.add_argument("--reference-label", default="steer_to_goal")
    ap.add_argument("--out", type=pathlib.Path, required=True)
    a = ap.parse_args(argv)
    try:
        curves = [(c[0], curve_points(c[1], c[2:])) for c in a.curve]
    except (OSError, ValueError, KeyError, IndexError) as e:
        print(f"profiling/scaling_plot.py: {e}", file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for k, (name, pts) in enumerate(curves):
        col = f"C{k}"
        ns = [p["n"] for p in pts]
        ax.errorbar(ns, [p["val"] for p in pts], yerr=[[p["val"] - p["lo"] for p in pts], [p["hi"] - p["val"] for p in pts]],
                    fmt="o-", color=col, capsize=3, label=f"{name}: validation (argmax)")
        ax.plot(ns, [p["train"] for p in pts], "s--", color=col, alpha=0.6, label=f"{name}: training time (sampled)")
        for p in pts:
            print(f"{name}: {p['n']} scenes: validation {p['val']:.3f} [{p['lo']:.3f}, {p['hi']:.3f}], "
                  f"training {p['train']:.3f}")
    if a.reference is not None:
        ax.axhline(a.reference, color="gray", ls=":", label=a.reference_label)
    ax.set_xscale("log")
    ax.set_xticks(sorted({p["n"] for _, pts in curves for p in pts}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.get_xaxis().set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("training scenes (nested subsets of the train split)")
    ax.set_ylabel("goal rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
