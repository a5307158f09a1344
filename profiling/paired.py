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


def pairs(rows: list[dict], policy: str, baseline: str, metric: str, mode: str = "self_play"):
    """``(a, b, clusters)``: the metric of ``policy`` and ``baseline`` on the agent-episodes both
    played (keyed by scenario, repetition, slot and role), and each pair's scenario (an int index).

    A policy is matched by its label or a label ending with it (``checkpoint.pt`` matches
    ``drv/checkpoint.pt``).

    Raises:
        ValueError: a policy with no rows, or no agent-episode in common.
    """
    def rows_of(name):
        got = {(r["scenario"], r["repetition"], r["slot"], r.get("role")): r[metric] for r in rows
               if r.get("mode", mode) == mode and (r["policy"] == name or r["policy"].endswith("/" + name)
                                                   or r["policy"].endswith(name))}
        if not got:
            raise ValueError(f"no rows of policy {name!r} (mode {mode}); labels: "
                             f"{sorted({r['policy'] for r in rows})}")
        return got

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
    def of(name):
        for d in docs:
            for r in d.get("runs", []):
                if r["label"] == name or r["label"].endswith(name):
                    return {row["scenario"]: row[metric] for row in r["per_scenario"]}
        raise ValueError(f"no WOSAC run of policy {name!r}; labels: "
                         f"{sorted(r['label'] for d in docs for r in d.get('runs', []))}")

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
    p.add_argument("--metric", nargs="+", default=["goal_reached", "collision_or_offroad"])
    p.add_argument("--mode", default="self_play")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    a = p.parse_args(argv)
    try:
        if a.wosac:
            docs = [json.loads(f.read_text()) for f in a.records]
        else:
            rows = [json.loads(line) for f in a.records for line in f.read_text().splitlines() if line.strip()]
        out = {}
        for m in a.metric:
            x, y, c = (wosac_pairs(docs, a.policy, a.baseline, m) if a.wosac
                       else pairs(rows, a.policy, a.baseline, m, a.mode))
            iv = paired_difference(x, y, c, bounds=(-1.0, 1.0))
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
