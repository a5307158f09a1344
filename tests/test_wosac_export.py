"""Export in the challenge's formats: Scenario protos of JSON scenarios (round trip through
gpusim's own TFRecord reader), SimAgentsChallengeSubmission binprotos (round trip), rollouts that
do not match their scenario refused, the ``export-proto`` command."""

from __future__ import annotations

import numpy as np
import pytest

from gpusim.data.__main__ import main as data_main
from gpusim.data.errors import ScenarioError
from gpusim.data.parse import read_json, read_scenario
from gpusim.data.parse_proto import parse_record
from gpusim.data.proto_export import read_submission, scenario_proto_from_json, write_submission
from gpusim.data.tfrecord import iter_records
from gpusim.wosac.baselines import log_replay
from gpusim.wosac.rollouts import rollouts_for
from gpusim.wosac.scene import scene_from_proto, stack_scenes

SDC_FILE = "1c365f15b70ebdbf.json.xz"  # bundled scene with metadata (SDC, 2 tracks to predict)


@pytest.fixture(scope="module")
def exported(sample_dir):
    path = sample_dir / SDC_FILE
    return read_scenario(path), scenario_proto_from_json(path)


def test_json_scenario_round_trips_through_a_scenario_proto(exported):
    raw, msg = exported
    back = parse_record(msg.SerializeToString(), "exported", 0)
    assert back.scenario_id == raw.scenario_id == "1c365f15b70ebdbf"
    assert back.num_objects == raw.num_objects
    np.testing.assert_array_equal(back.valid, raw.valid)
    np.testing.assert_allclose(back.pos, raw.pos)
    np.testing.assert_allclose(back.heading, raw.heading, atol=1e-6)  # stored as float
    np.testing.assert_allclose(back.vel, raw.vel, atol=1e-5)
    np.testing.assert_array_equal(back.obj_type, raw.obj_type)
    np.testing.assert_allclose(back.length, raw.length, rtol=1e-6)
    np.testing.assert_array_equal(back.predict, raw.predict)
    assert raw.predict.sum() == 2
    # metadata: sdc_track_index 24 of the JSON objects -> the track of that object's id
    doc = read_json(raw.file)
    assert msg.HasField("sdc_track_index")
    assert msg.tracks[msg.sdc_track_index].id == doc["objects"][24]["id"]
    np.testing.assert_allclose(back.road_xy, raw.road_xy)
    np.testing.assert_array_equal(back.road_type, raw.road_type)
    np.testing.assert_array_equal(back.road_id, raw.road_id)
    # the proto carries the JSON's z (gpusim's RawScenario has none) and heights
    zs = [s.center_z for s in msg.tracks[0].states if s.valid]
    assert zs and all(-130 < z < -110 for z in zs)
    assert msg.tracks[0].states[10].height > 0
    assert len(msg.dynamic_map_states) == 91


def test_exported_json_scene_is_scorable(exported):
    raw, msg = exported
    scene = scene_from_proto(msg)
    assert scene.evaluated.sum() == 2  # the SDC is one of the two tracks to predict here
    assert scene.num_objects == int(raw.valid[:, 10].sum())


def test_submission_round_trip_and_order(tmp_path, exported):
    _, msg = exported
    scene = scene_from_proto(msg)
    sim = log_replay(stack_scenes([scene]), rollouts=3)[0].numpy()
    path = write_submission(tmp_path / "r.binproto", {scene.scenario_id: (scene.object_id, sim)}, method="test")
    back = read_submission(path)
    ids, states = back[scene.scenario_id]
    np.testing.assert_array_equal(ids, scene.object_id)
    np.testing.assert_array_equal(states, sim)
    # the trajectories may come in any object order: they are put back in the scene's order
    perm = np.arange(len(ids))[::-1]
    got = rollouts_for(scene, ids[perm], states[:, perm]).numpy()
    np.testing.assert_array_equal(got, sim)


@pytest.mark.parametrize("mutate, match", [
    (lambda ids, st: (ids[1:], st[:, 1:]), "missing"),
    (lambda ids, st: (np.where(ids == ids[0], 999999, ids), st), "not sim agents"),
    (lambda ids, st: (ids, st[:, :, :79]), "80 steps"),
    (lambda ids, st: (np.concatenate([ids, ids[:1]]), np.concatenate([st, st[:, :1]], 1)), "appears twice"),
])
def test_rollouts_not_matching_the_scenario_are_refused(exported, mutate, match):
    _, msg = exported
    scene = scene_from_proto(msg)
    sim = log_replay(stack_scenes([scene]), rollouts=2)[0].numpy()
    ids, st = mutate(scene.object_id.copy(), sim)
    with pytest.raises(ScenarioError, match=match):
        rollouts_for(scene, ids, st, file="r.binproto")


def test_unreadable_submission_is_refused(tmp_path):
    bad = tmp_path / "bad.binproto"
    bad.write_bytes(b"\xff\xff\xff\xff")
    with pytest.raises(ScenarioError, match="not a SimAgentsChallengeSubmission"):
        read_submission(bad)


def test_export_proto_command(tmp_path, sample_dir, capsys):
    out = tmp_path / "s.tfrecord"
    tf = sample_dir.parent / "womd_tfrecord" / "motion_data_one_scenario.tfrecord.gz"
    assert data_main(["export-proto", str(sample_dir / SDC_FILE), str(tf), "--out", str(out)]) == 0
    assert "2 Scenario proto(s)" in capsys.readouterr().out
    records = [p for _, p in iter_records(out)]
    assert len(records) == 2
    original = next(p for _, p in iter_records(tf))
    assert records[1] == original  # TFRecord scenarios are copied as they are
    broken = tmp_path / "broken.json"
    broken.write_text('{"objects": 3, "roads": []}')
    assert data_main(["export-proto", str(broken), "--out", str(out)]) == 1
    assert "broken.json: objects" in capsys.readouterr().err
    assert data_main(["export-proto", str(tmp_path / "none.json"), "--out", str(out)]) == 2
    assert data_main(["export-proto", str(sample_dir / SDC_FILE), "--out", str(tmp_path)]) == 2
    assert "--out" in capsys.readouterr().err


def test_assemble_rollouts_maps_slots_to_sim_agents(exported):
    import torch

    from gpusim.wosac.rollouts import assemble_rollouts

    _, msg = exported
    scene = scene_from_proto(msg)
    n = scene.num_objects
    # slots in reverse track order plus one slot that is no object; states in a frame shifted by 100 m
    tracks = np.concatenate([scene.track_index[::-1], [-1]])
    fut = slice(11, 91)
    xyh = np.stack([scene.x[:, fut] - 100.0, scene.y[:, fut] + 50.0, scene.heading[:, fut]], -1)[::-1]
    states = np.concatenate([xyh, np.zeros((1, 80, 3), np.float32)])[None].repeat(2, axis=0)
    out, filled = assemble_rollouts(scene, tracks, states, offset=(100.0, -50.0))
    assert not filled.any()
    expect = log_replay(stack_scenes([scene]), rollouts=2)[0]
    torch.testing.assert_close(out[..., [0, 1, 3]], expect[..., [0, 1, 3]], atol=1e-3, rtol=0)
    assert torch.equal(out[0, :, 5, 2], torch.as_tensor(scene.z[:, 10]))  # z of step 10 throughout
    with pytest.raises(ValueError, match="1 sim agent"):
        assemble_rollouts(scene, tracks[1:], states[:, 1:], offset=(100.0, -50.0))
    out, filled = assemble_rollouts(scene, tracks[1:], states[:, 1:], offset=(100.0, -50.0), fill="log")
    assert filled.sum() == 1 and filled[n - 1]
    torch.testing.assert_close(out[..., [0, 1, 3]], expect[..., [0, 1, 3]], atol=1e-3, rtol=0)
