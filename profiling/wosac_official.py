"""Score a WOSAC submission with Waymo's own scorer (the reference for gpusim's WOSAC metrics).

Runs with the Python of a separate virtual environment holding only Waymo's package (it needs
TensorFlow 2.12 and numpy < 1.24, so it is never a gpusim dependency)::

    python3.11 -m venv /tmp/wosac-venv
    /tmp/wosac-venv/bin/pip install waymo-open-dataset-tf-2-12-0==1.6.7
    /tmp/wosac-venv/bin/python profiling/wosac_official.py --scenarios S.tfrecord \\
        --submission R.binproto --json official.json

``--scenarios`` is a TFRecord of ``Scenario`` protos (a WOMD file, or one written by
``python -m gpusim.data export-proto``; gzip-compressed files are detected); ``--submission`` a
``SimAgentsChallengeSubmission`` binproto (``train/evaluate.py --export-rollouts`` or
``profiling/wosac_compare.py prepare``). For every scenario of the submission the script runs
``metrics.compute_scenario_metrics_for_bundle`` with the 2025 sim-agents config of the installed
package and writes, per scenario, the ten component likelihoods, the meta-metric, the simulated
collision / offroad / traffic-light violation rates and the seconds it took. It imports nothing
from gpusim. Exit code 2 on bad input (one line naming the file).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

COMPONENTS = ("linear_speed", "linear_acceleration", "angular_speed", "angular_acceleration",
              "distance_to_nearest_object", "collision_indication", "time_to_collision",
              "distance_to_road_edge", "offroad_indication", "traffic_light_violation")


def _load(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from google.protobuf import text_format
    from waymo_open_dataset.protos import scenario_pb2, sim_agents_metrics_pb2, sim_agents_submission_pb2
    from waymo_open_dataset.wdl_limited.sim_agents_metrics import metrics

    with open(args.scenarios, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    scenarios = {}
    for rec in tf.data.TFRecordDataset(args.scenarios, compression_type="GZIP" if gz else ""):
        sc = scenario_pb2.Scenario.FromString(rec.numpy())
        scenarios[sc.scenario_id] = sc
    sub = sim_agents_submission_pb2.SimAgentsChallengeSubmission()
    with open(args.submission, "rb") as fh:
        sub.ParseFromString(fh.read())
    cfg_path = os.path.join(os.path.dirname(metrics.__file__), "challenge_2025_sim_agents_config.textproto")
    config = sim_agents_metrics_pb2.SimAgentMetricsConfig()
    with open(cfg_path) as fh:
        text_format.Parse(fh.read(), config)
    return scenarios, sub, config, metrics


def main(argv=None) -> int:
    """Command line entry point (see the module doc)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", required=True, help="TFRecord of Scenario protos")
    p.add_argument("--submission", required=True, help="SimAgentsChallengeSubmission binproto")
    p.add_argument("--json", required=True, help="output JSON")
    args = p.parse_args(argv)
    for flag, path in (("--scenarios", args.scenarios), ("--submission", args.submission)):
        if not os.path.isfile(path):
            print(f"error: {flag} {path}: no such file", file=sys.stderr)
            return 2
    try:
        scenarios, sub, config, metrics = _load(args)
    except Exception as exc:  # noqa: BLE001 - any parse failure is a user error here
        print(f"error: cannot read the inputs ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 2
    out = {"package": "waymo-open-dataset-tf-2-12-0==1.6.7", "config": "challenge_2025_sim_agents_config",
           "scenarios": {}, "errors": {}}
    for sr in sub.scenario_rollouts:
        sc = scenarios.get(sr.scenario_id)
        if sc is None:
            out["errors"][sr.scenario_id] = "scenario not in --scenarios"
            continue
        t0 = time.perf_counter()
        try:
            m = metrics.compute_scenario_metrics_for_bundle(config, sc, sr)
        except Exception as exc:  # noqa: BLE001 - recorded per scenario
            out["errors"][sr.scenario_id] = f"{type(exc).__name__}: {exc}"
            continue
        row = {c: float(getattr(m, c + "_likelihood")) for c in COMPONENTS}
        row.update(metametric=float(m.metametric), simulated_collision_rate=float(m.simulated_collision_rate),
                   simulated_offroad_rate=float(m.simulated_offroad_rate),
                   simulated_traffic_light_violation_rate=float(m.simulated_traffic_light_violation_rate),
                   seconds=time.perf_counter() - t0)
        out["scenarios"][sr.scenario_id] = row
        print(f"{sr.scenario_id}: metametric {row['metametric']:.4f} ({row['seconds']:.1f} s)", file=sys.stderr)
    with open(args.json, "w") as fh:
        json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
