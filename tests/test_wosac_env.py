"""WOSAC figures of simulated drivers (profiling/wosac_env.py, the interim env protocol): on a
hand-built scene where the SDC brakes after step 10, expert replay through inverse dynamics scores
higher than constant speed, and every simulated object is mapped back to its track."""

from __future__ import annotations

import pytest

from gpusim.data.tfrecord import write_records
from gpusim.wosac import metrics as M
from gpusim.wosac.scene import scene_from_proto, stack_scenes
from profiling.wosac_env import run_policy
from test_wosac import braking_proto


@pytest.fixture(scope="module")
def braking(tmp_path_factory):
    msg = braking_proto()
    path = write_records(tmp_path_factory.mktemp("w") / "brake.tfrecord", [msg.SerializeToString()])
    return scene_from_proto(msg), str(path)


def test_expert_beats_constant_speed(braking):
    scene, path = braking
    batch = stack_scenes([scene])
    figures = {}
    for policy in ("expert", "constant_speed"):
        sim, replayed, _ = run_policy(scene, path, policy, "discrete", rollouts=2)
        assert not replayed.any()  # both vehicles are driven by the policy
        assert sim.shape == (2, 2, 80, 4)
        figures[policy] = M.score(batch, sim[None])
    assert figures["expert"]["metametric"].item() > figures["constant_speed"]["metametric"].item() + 0.02
    assert figures["expert"]["linear_speed"].item() > figures["constant_speed"]["linear_speed"].item()
