"""Plot realism (WOSAC meta-metric) against goal rate for the policies of two evaluation files.

The sim-agent trade-off of docs/results/sim_agents.md: each policy's meta-metric from an
``evaluate --mode wosac --json`` file (or several) against its goal rate from an
``evaluate --setting goal --json`` file, with both intervals as error bars. Policies are matched by
label; baselines present in both files are drawn too.

    python -m profiling.realism_plot --wosac val_a.json val_b.json --goal goal.json --out realism.png
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys


def points(wosac_files, goal_files) -> list[dict]:
    """``[{label, meta, meta_lo, meta_hi, goal, goal_lo, goal_hi}]`` for labels in both kinds of file.

    Raises:
        ValueError: a file without ``runs``, or no label in common.
    """
    def runs(files):
        out = {}
        for f in files:
            doc = json.loads(pathlib.Path(f).read_text())
            if "runs" not in doc:
                raise ValueError(f"{f}: no 'runs' (not an evaluate --json file)")
            out.update({r["label"]: r["summary"] for r in doc["runs"]})
        return out

    w, g = runs(wosac_files), runs(goal_files)
    common = [k for k in w if k in g]
    if not common:
        raise ValueError(f"no policy label in both kinds of file (wosac: {sorted(w)}, goal: {sorted(g)})")
    return [{"label": k, "meta": w[k]["metametric"]["mean"], "meta_lo": w[k]["metametric"]["lo"],
             "meta_hi": w[k]["metametric"]["hi"], "goal": g[k]["goal_reached"]["mean"],
             "goal_lo": g[k]["goal_reached"]["lo"], "goal_hi": g[k]["goal_reached"]["hi"]} for k in common]


def plot(pts: list[dict], out: pathlib.Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    for p in pts:
        ax.errorbar(p["goal"], p["meta"], xerr=[[p["goal"] - p["goal_lo"]], [p["goal_hi"] - p["goal"]]],
                    yerr=[[p["meta"] - p["meta_lo"]], [p["meta_hi"] - p["meta"]]], fmt="o", capsize=3)
        ax.annotate(p["label"].split("/")[0], (p["goal"], p["meta"]), textcoords="offset points", xytext=(5, 4),
                    fontsize=8)
    ax.set_xlabel("goal rate, goal setting (validation, 95% CI clustered by scene)")
    ax.set_ylabel("WOSAC 2025 meta-metric (validation, 95% CI over scenes)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wosac", nargs="+", required=True)
    ap.add_argument("--goal", nargs="+", required=True)
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--title", default="Sim agents: realism against goal rate")
    a = ap.parse_args(argv)
    try:
        pts = points(a.wosac, a.goal)
    except (OSError, ValueError, KeyError) as e:
        print(f"profiling/realism_plot.py: {e}", file=sys.stderr)
        return 2
    plot(pts, a.out, a.title)
    for p in pts:
        print(f"{p['label']}: meta {p['meta']:.3f}, goal {p['goal']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
