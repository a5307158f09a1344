"""How fast a policy's sim agents drive against the log, in the WOSAC protocol.

WOSAC's kinematic likelihoods say *that* simulated speeds differ from the log, not by how much;
this script says by how much. Each scene of ``--data`` is simulated as ``train/evaluate.py --mode
wosac`` does (:func:`train.eval.wosac.simulate`: start at step 10, 80 steps, every valid object
controlled, sampled actions), and for every scored object (``tracks_to_predict``) valid on at least
half of the 80 steps the mean speed of the log is set beside the mean speed over the rollouts
(both from 10 Hz position differences, m/s). Printed per object type (vehicle, pedestrian,
cyclist) for the objects that move in the log (mean speed >= 0.5 m/s): count, mean logged speed,
mean simulated speed, and the median over objects of simulated / logged speed.

    python -m profiling.wosac_speeds --policy policies/sim_agent.pt expert --data VAL_DIR --scenes 10

``expert`` (the log's own actions through the inverse dynamics) is the reference: a ratio near 1.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

TYPES = {1: "vehicle", 2: "pedestrian", 3: "cyclist"}
#: An object moves in the log when its mean logged speed is at least this (m/s).
MOVING = 0.5


def object_speeds(scene, sim: np.ndarray, replayed: np.ndarray) -> list[tuple[int, float, float]]:
    """``[(object type, logged mean speed, simulated mean speed)]`` (m/s) of the scored objects of
    ``scene`` (a :class:`gpusim.wosac.scene.WosacScene`) driven in ``sim`` [R, N, 80, 4] (x, y, z,
    heading) and valid on at least 40 of the 80 simulated steps; log-replayed objects left out."""
    lx, ly, valid = scene.x[:, 11:], scene.y[:, 11:], scene.valid[:, 11:]
    rows = []
    for n in range(scene.num_objects):
        if not scene.evaluated[n] or replayed[n] or valid[n].sum() < 40:
            continue
        both = valid[n, 1:] & valid[n, :-1]
        logged = float(np.hypot(np.diff(lx[n]), np.diff(ly[n]))[both].mean() * 10)
        simulated = float(np.hypot(np.diff(sim[:, n, :, 0], axis=1), np.diff(sim[:, n, :, 1], axis=1)).mean() * 10)
        rows.append((int(scene.object_type[n]), logged, simulated))
    return rows


def summarise(rows: list[tuple[int, float, float]]) -> dict:
    """Per object type, over the objects that move in the log: ``{type: {"objects", "log_speed",
    "sim_speed", "median_ratio"}}``."""
    r = np.array(rows, dtype=np.float64).reshape(-1, 3)
    out = {}
    for code, name in TYPES.items():
        k = (r[:, 0] == code) & (r[:, 1] >= MOVING)
        if k.any():
            out[name] = {"objects": int(k.sum()), "log_speed": float(r[k, 1].mean()),
                         "sim_speed": float(r[k, 2].mean()), "median_ratio": float(np.median(r[k, 2] / r[k, 1]))}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", nargs="+", required=True,
                    help="checkpoints or run directories, or baselines (expert, constant_speed, ...)")
    ap.add_argument("--data", required=True, help="WOMD scenes (JSON / TFRecord directory)")
    ap.add_argument("--scenes", type=int, default=10, help="the first N scenes WOSAC can score")
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    from gpusim.wosac.sources import load_scenes
    from train.eval.wosac import simulate, source_files
    from train.evaluate import EvalConfig, _load_policies, _make_driver, base_env_config

    torch.set_num_threads(1)
    scenes, _ = load_scenes([a.data])
    scenes, paths = scenes[: a.scenes], source_files([a.data])
    # each policy as `train/evaluate.py --mode wosac --policy SPEC` alone: its own env settings, sampled
    cfg = EvalConfig(policy=tuple(a.policy), stochastic=True, seed=a.seed, device="cpu")
    result = {}
    for spec in a.policy:
        (entry,) = _load_policies([spec], "cpu")
        base, _ = base_env_config([entry], cfg)
        make = lambda env, e=entry: _make_driver(e, env, cfg)  # noqa: E731
        rows = []
        for i, scene in enumerate(scenes):
            sim, replayed, _ = simulate(scene, paths[scene.scenario_id], make, base, a.rollouts, seed=a.seed + i)
            rows += object_speeds(scene, sim.numpy(), replayed)
        result[spec] = summarise(rows)
        for name, s in result[spec].items():
            print(f"{spec}: {name} x{s['objects']}: log {s['log_speed']:.2f} m/s, simulated {s['sim_speed']:.2f} m/s, "
                  f"median ratio {s['median_ratio']:.2f}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"data": a.data, "scenes": [s.scenario_id for s in scenes], "rollouts": a.rollouts,
                       "seed": a.seed, "policies": result}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
