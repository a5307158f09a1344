"""Paired differences between two policies of one ``train/evaluate.py --records`` file.

Two policies evaluated side by side in one call play the same agent-episodes (same scenario,
repetition and slot). The difference per agent-episode removes what they share (the scenario's
difficulty); its interval is clustered by scenario (:func:`train.eval.stats.paired_difference`).
This is the comparison the results pages use for "above the baseline".

    python train/evaluate.py --policy runs/x/checkpoint.pt steer_to_goal --data HELD --records rec.jsonl
    python -m profiling.paired rec.jsonl --policy checkpoint.pt --baseline steer_to_goal \\
        --metric goal_reached collision_or_offroad

WOSAC figures are per scene: ``--wosac`` pairs the per-scenario rows of ``evaluate --mode wosac
--json`` files (one or several, e.g. a policy's and the baselines' calls on the same scenes), and
the interval is over scenes::

    python -m profiling.paired held_sim.json held_base.json --wosac --policy sim_agent.pt \\
        --baseline constant_speed --metric metametric
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from train.eval.stats import paired_difference


def match_label(name: str, labels) -> str:
    """The one label of ``labels`` that ``name`` names: the label itself, else the only label
    ending with it (``checkpoint.pt`` names ``drv/checkpoint.pt``).

    Raises:
        ValueError: no label, or several, end with ``name`` (the message lists them).
    """
    labels = sorted(set(labels))
    if name in labels:
        return name
    found = [lab for lab in labels if lab.endswith(name)]
    if not found:
        raise ValueError(f"no rows of policy {name!r}; labels: {labels}")
    if len(found) > 1:
        raise ValueError(f"policy {name!r} names {len(found)} labels ({', '.join(found)}); pass a longer part of "
                         f"the label")
    return found[0]


def _metric(row: dict, metric: str, where: str):
    """``row[metric]``, or ValueError naming the metric and those ``row`` has."""
    if metric not in row:
        known = sorted(k for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
        raise ValueError(f"--metric {metric}: not in {where}; use one of {', '.join(known)}")
    return row[metric]


def metric_bounds(a, b) -> tuple[float, float] | None:
    """``(-1, 1)`` when every value of ``a`` and ``b`` lies in [0, 1] (a rate: the difference is in
    [-1, 1]), else None (no bound: episode length or return)."""
    return (-1.0, 1.0) if all(0.0 <= v <= 1.0 for v in list(a) + list(b)) else None


def pairs(rows: list[dict], policy: str, baseline: str, metric: str, mode: str = "self_play"):
    """``(a, b, clusters)``: the metric of ``policy`` and ``baseline`` on the agent-episodes both
    played (keyed by scenario, repetition, slot and role), and each pair's scenario (an int index).

    A policy is matched by its label or a label ending with it (``checkpoint.pt`` matches
    ``drv/checkpoint.pt``).

    Raises:
        ValueError: a policy with no rows, or no agent-episode in common.
    """
    def rows_of(name):
        in_mode = [r for r in rows if r.get("mode", mode) == mode]
        if not in_mode:
            raise ValueError(f"no rows of mode {mode}; modes: {sorted({r.get('mode') for r in rows})}")
        label = match_label(name, (r["policy"] for r in in_mode))
        return {(r["scenario"], r["repetition"], r["slot"], r.get("role")): _metric(r, metric, "the records")
                for r in in_mode if r["policy"] == label}

    pa, pb = rows_of(policy), rows_of(baseline)
    keys = sorted(set(pa) & set(pb))
    if not keys:
        raise ValueError(f"{policy!r} and {baseline!r} share no agent-episode: evaluate them in one call")
    index = {s: i for i, s in enumerate(sorted({k[0] for k in keys}))}
    return [pa[k] for k in keys], [pb[k] for k in keys], [index[k[0]] for k in keys]


def wosac_pairs(docs: list[dict], policy: str, baseline: str, metric: str):
    """``(a, b, clusters)`` of a WOSAC metric: the per-scenario values of ``policy`` and
    ``baseline`` on the scenes both were scored on (``per_scenario`` rows of ``evaluate --mode wosac
    --json`` documents), one pair per scene.

    Raises:
        ValueError: a policy in none of the documents, or no scene in common.
    """
    runs = [r for d in docs for r in d.get("runs", [])]

    def of(name):
        label = match_label(name, (r["label"] for r in runs))
        r = next(r for r in runs if r["label"] == label)
        return {row["scenario"]: _metric(row, metric, f"the WOSAC rows of {label}") for row in r["per_scenario"]}

    pa, pb = of(policy), of(baseline)
    keys = sorted(set(pa) & set(pb))
    if not keys:
        raise ValueError(f"{policy!r} and {baseline!r} were scored on no common scene")
    return [pa[k] for k in keys], [pb[k] for k in keys], list(range(len(keys)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("records", type=pathlib.Path, nargs="+", help="an evaluate --records file (or, with --wosac, "
                   "evaluate --mode wosac --json files)")
    p.add_argument("--wosac", action="store_true", help="pair the per-scenario rows of WOSAC JSON files")
    p.add_argument("--policy", required=True)
    p.add_argument("--baseline", required=True)
    p.add_argument("--metric", nargs="+", default=None,
                   help="default: goal_reached collision_or_offroad; with --wosac: metametric")
    p.add_argument("--mode", default="self_play")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    a = p.parse_args(argv)
    if a.metric is None:
        a.metric = ["metametric"] if a.wosac else ["goal_reached", "collision_or_offroad"]
    try:
        if a.wosac:
            docs = [json.loads(f.read_text()) for f in a.records]
        else:
            rows = [json.loads(line) for f in a.records for line in f.read_text().splitlines() if line.strip()]
        out = {}
        for m in a.metric:
            x, y, c = (wosac_pairs(docs, a.policy, a.baseline, m) if a.wosac
                       else pairs(rows, a.policy, a.baseline, m, a.mode))
            iv = paired_difference(x, y, c, bounds=metric_bounds(x, y))
            out[m] = {"diff": iv.mean, "lo": iv.lo, "hi": iv.hi, "pairs": len(x), "scenarios": len(set(c))}
    except (OSError, ValueError, KeyError) as e:
        print(f"profiling/paired.py: {' '.join(map(str, a.records))}: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(out))
    else:
        for m, v in out.items():
            unit = "scenes" if a.wosac else f"agent-episodes, {v['scenarios']} scenes, clustered by scene"
            print(f"{m}: {a.policy} - {a.baseline} = {v['diff']:+.3f} [{v['lo']:+.3f}, {v['hi']:+.3f}] "
                  f"({v['pairs']} {unit})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
