"""WOSAC figures of gpusim's baseline drivers in the simulator, per action space (the loop is
:func:`train.eval.wosac.simulate`, the one ``train/evaluate.py --mode wosac`` runs; this script
adds the discrete / continuous comparison for the baselines).

    python profiling/wosac_env.py data/womd_tfrecord data/womd_sample/1c365f15b70ebdbf.json.xz \\
        --policy expert constant_speed --action-space discrete continuous [--json out.json] \\
        [--export-rollouts r.binproto --export-policy expert]

Per scenario WOSAC can score (``gpusim.wosac.sources``), a pack is built with ``init_steps 10``
and every vehicle valid at step 10 controllable (``max_controlled`` = ``max_agents`` = the object
count, ``goal_min_distance 0``), and 32 worlds of that scenario run 80 steps
(``scenario_length 81`` so no auto-reset lands in the record; collisions and offroad ``ignore``;
goals ``stop`` with a 1 mm radius, so no agent stops at its goal). The policy drives the
controlled vehicles; objects the env cannot control (pedestrians, cyclists, vehicles without a
goal distance) are **log-replayed** by the env and counted in the output (``replayed``): their
figures flatter the policy, so these runs are not the challenge's protocol for those objects.
Positions (x, y, heading; z = step 10) go through :func:`gpusim.wosac.rollouts.assemble_rollouts`
and :func:`gpusim.wosac.metrics.score`. ``--export-rollouts`` writes one policy's rollouts as a
``SimAgentsChallengeSubmission`` for ``profiling/wosac_official.py``.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from gpusim.wosac import config as C
from gpusim.wosac.metrics import score
from gpusim.wosac.scene import stack_scenes
from gpusim.wosac.sources import load_scenes
from train.baselines import make_baseline
from train.eval.sweep import CallableDriver
from train.eval.wosac import simulate, source_files


def run_policy(scene, path, policy: str, action_space: str, rollouts: int, seed: int = 0):
    """Simulate ``rollouts`` worlds of ``scene`` under a baseline policy
    (:func:`train.eval.wosac.simulate`); returns (rollouts [R, N, 80, 4], [N] bool sim agents
    log-replayed by the env or absent, seconds)."""
    from train.config import TrainConfig

    base = TrainConfig().env.replace(action_space=action_space, check_actions="sync")
    return simulate(scene, path, lambda env: CallableDriver(make_baseline(policy, seed=seed)), base, rollouts, seed)


def main(argv=None) -> int:
    """Command line entry point (see the module doc)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sources", nargs="+")
    p.add_argument("--policy", nargs="+", default=["expert", "constant_speed"])
    p.add_argument("--action-space", nargs="+", default=["discrete"], choices=("discrete", "continuous"))
    p.add_argument("--rollouts", type=int, default=C.N_ROLLOUTS)
    p.add_argument("--json", default=None)
    p.add_argument("--export-rollouts", default=None)
    p.add_argument("--export-policy", default="expert")
    args = p.parse_args(argv)
    torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)))
    scenes, skipped = load_scenes(args.sources)
    for name, why in skipped:
        print(f"skipped: {name}: {why}", file=sys.stderr)
    results, export = {}, {}
    paths = source_files(args.sources)
    for scene in scenes:
        path = paths[scene.scenario_id]
        batch = stack_scenes([scene])
        for policy in args.policy:
            for space in args.action_space:
                key = f"{policy}/{space}"
                sim, replayed, sec = run_policy(scene, path, policy, space, args.rollouts)
                res = {k: float(v[0]) for k, v in score(batch, sim[None]).items()}
                res.update(replayed=int(replayed.sum()), evaluated_replayed=int((replayed & scene.evaluated).sum()),
                           sim_agents=scene.num_objects, evaluated=int(scene.evaluated.sum()), sim_seconds=sec)
                results.setdefault(key, {})[scene.scenario_id] = res
                print(f"{scene.scenario_id} {key}: metametric {res['metametric']:.4f} "
                      f"({res['replayed']} of {scene.num_objects} sim agents, {res['evaluated_replayed']} of "
                      f"{res['evaluated']} evaluated, log-replayed by the env; {sec:.1f} s simulating)")
                if args.export_rollouts and key == f"{args.export_policy}/{args.action_space[0]}":
                    export[scene.scenario_id] = (scene.object_id, sim.numpy())
    names = (*C.COMPONENTS, "metametric")
    print(f"\n{'component':<28}" + "".join(f"{k:>26}" for k in results))
    for n in names:
        print(f"{n:<28}" + "".join(f"{np.mean([r[n] for r in rows.values()]):>26.4f}" for rows in results.values()))
    if args.json:
        json.dump(results, open(args.json, "w"), indent=1)
    if export:
        from gpusim.data.proto_export import write_submission

        write_submission(args.export_rollouts, export, method=args.export_policy)
        print(f"wrote {args.export_rollouts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
