"""profiling/wosac_speeds.py: logged against simulated speeds in the WOSAC protocol, on a hand-built
scene where vehicle A drives at 10 m/s and brakes after step 10 (tests/test_wosac.py's proto)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gpusim.data.tfrecord import write_records
from gpusim.wosac.scene import scene_from_proto
from profiling.wosac_speeds import main, object_speeds, summarise
from test_wosac import braking_proto


@pytest.fixture(scope="module")
def braking(tmp_path_factory):
    msg = braking_proto()
    d = tmp_path_factory.mktemp("w")
    write_records(d / "brake.tfrecord", [msg.SerializeToString()])
    return scene_from_proto(msg), d


def test_summarise_by_hand():
    rows = [(1, 10.0, 5.0), (1, 4.0, 4.0), (1, 0.2, 3.0), (2, 1.0, 0.5)]  # (type, logged, simulated) m/s
    out = summarise(rows)
    # the vehicle at 0.2 m/s does not move in the log: left out
    assert out["vehicle"] == {"objects": 2, "log_speed": 7.0, "sim_speed": 4.5, "median_ratio": 0.75}
    assert out["pedestrian"] == {"objects": 1, "log_speed": 1.0, "sim_speed": 0.5, "median_ratio": 0.5}
    assert "cyclist" not in out


def test_a_standing_rollout_has_ratio_zero(braking):
    scene, _ = braking
    n = scene.num_objects
    still = np.zeros((2, n, 80, 4), np.float32)
    still[..., 0] = scene.x[None, :, 10, None]
    still[..., 1] = scene.y[None, :, 10, None]
    rows = object_speeds(scene, still, np.zeros(n, bool))
    moving = [r for r in rows if r[1] >= 0.5]
    assert moving and all(sim == 0.0 for _, _, sim in moving)
    # vehicle A (the slower of the two) over the simulated steps 11-90 (79 differences, 7.9 s): from
    # x = 10 + 1.0 - 0.0125 at step 11 to x = 30, where its braking from 10 m/s at 2.5 m/s^2 ends
    a = min(moving, key=lambda r: r[1])
    assert a[1] == pytest.approx((30.0 - (10.0 + 1.0 - 0.0125)) / 7.9, abs=1e-3)


def test_expert_drives_at_the_logged_speed(braking, tmp_path):
    _, d = braking
    out = tmp_path / "s.json"
    assert main(["--policy", "expert", "--data", str(d), "--rollouts", "2", "--json", str(out)]) == 0
    vehicle = json.loads(out.read_text())["policies"]["expert"]["vehicle"]
    assert vehicle["objects"] >= 1 and vehicle["median_ratio"] == pytest.approx(1.0, abs=0.05)
