"""WOSAC metrics on a hand-built two-vehicle scene whose features and likelihoods are worked out
by hand, the official quirks gpusim reproduces, and bad input.

The scene (all values exact in float32): a straight road between two road edges, y = -5 m
(drawn towards +x, so the road is on its left) and y = +5 m (drawn towards -x); no signal.
Vehicle A (track id 7, the SDC) starts at x = 0 and drives at 10 m/s along y = 0; vehicle B
(id 9, the track to predict) starts 60 m ahead and drives at 5 m/s. Boxes 4 m x 2 m x 1.5 m.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gpusim.data.womd_proto import messages
from gpusim.wosac import baselines as B
from gpusim.wosac import config as C
from gpusim.wosac import features as F
from gpusim.wosac import metrics as M
from gpusim.wosac.scene import SceneSkipped, scene_from_proto, stack_scenes

T = C.TOTAL_STEPS
FUT = np.arange(C.CURRENT_TIME_INDEX + 1, T)  # the 80 scored steps


def two_vehicle_proto(*, ttp=True, steps=T, valid_b_at_10=True, signal=False):
    """The scene of the module doc as a ``Scenario`` message; with ``signal``, a surface-street
    lane along y = 0 (id 100) whose signal shows STOP at every step, stop point x = 50.5 m."""
    msg = messages()["Scenario"](scenario_id="two-vehicles", current_time_index=10)
    for tid, x0, v in ((7, 0.0, 10.0), (9, 60.0, 5.0)):
        tr = msg.tracks.add(id=tid, object_type=1)
        for t in range(steps):
            ok = valid_b_at_10 or tid == 7 or t != 10
            tr.states.add(center_x=x0 + v * 0.1 * t, center_y=0.0, center_z=0.0, heading=0.0, velocity_x=v,
                          length=4.0, width=2.0, height=1.5, valid=ok)
    msg.sdc_track_index = 0
    if ttp:
        msg.tracks_to_predict.add(track_index=1)
    for fid, y, direction in ((1, -5.0, 1.0), (2, 5.0, -1.0)):
        edge = msg.map_features.add(id=fid).road_edge
        for x in (-100.0, 300.0)[::int(direction)]:
            edge.polyline.add(x=x, y=y, z=0.0)
    if signal:
        lane = msg.map_features.add(id=100).lane
        lane.type = C.SURFACE_STREET_LANE_TYPE
        for x in (-100.0, 300.0):
            lane.polyline.add(x=x, y=0.0, z=0.0)
        for _ in range(steps):
            ls = msg.dynamic_map_states.add().lane_states.add(lane=100, state=4)
            ls.stop_point.x, ls.stop_point.y = 50.5, 0.0
    return msg


def braking_proto():
    """:func:`two_vehicle_proto` with vehicle A braking at 2.5 m/s^2 after step 10 (from 10 m/s: it
    stops at x = 30 m after 4 s and stands)."""
    msg = two_vehicle_proto()
    for t, s in enumerate(msg.tracks[0].states):
        if t > 10:
            k = (t - 10) * 0.1
            s.center_x = 10.0 + 10.0 * k - 1.25 * k * k if k < 4 else 10.0 + 20.0
            s.velocity_x = max(0.0, 10.0 - 2.5 * k)
    return msg


@pytest.fixture(scope="module")
def batch():
    return stack_scenes([scene_from_proto(two_vehicle_proto())])


def _log_features(batch):
    (x, y, z, h), v = M.log_trajectories(batch)
    return M.compute_features(batch, x, y, z, h, v)


def test_config_table_is_the_2025_challenge():
    assert len(C.SIM_AGENTS_2025) == 10
    assert sum(f.weight for f in C.SIM_AGENTS_2025) == pytest.approx(1.0, abs=1e-6)
    assert C.feature("collision_indication").weight == pytest.approx(0.25)
    assert C.feature("linear_acceleration").num_bins == 11
    assert C.feature("distance_to_road_edge").min_val == -20.0
    with pytest.raises(KeyError, match="unknown WOSAC component"):
        C.feature("jerk")


def test_hand_built_scene_features(batch):
    f = _log_features(batch)
    t = torch.as_tensor(FUT, dtype=torch.float32)
    # evaluated objects in ascending id: A (7), B (9)
    assert torch.allclose(f["linear_speed"][0, 0, 0, :-1], torch.full((79,), 10.0), atol=1e-3)
    assert torch.allclose(f["linear_speed"][0, 0, 1, :-1], torch.full((79,), 5.0), atol=1e-3)
    assert torch.isnan(f["linear_speed"][0, 0, :, -1]).all()  # the central difference ends a step early
    assert torch.allclose(f["linear_acceleration"][0, 0, :, :-2], torch.zeros(2, 78), atol=1e-2)
    assert (f["angular_speed"][0, 0, :, :-1] == 0).all()
    # box gap: 60 + 0.5 t - t - 4 (the rounded corners do not matter for aligned boxes)
    gap = 56.0 - 0.5 * t
    assert torch.allclose(f["distance_to_nearest_object"][0, 0, 0], gap, atol=1e-3)
    assert torch.allclose(f["distance_to_nearest_object"][0, 0, 1], gap, atol=1e-3)
    # A closes in on B at 5 m/s; capped at 5 s; the last step has no speed (NaN) -> 5 s
    ttc = torch.clamp(gap / 5.0, max=5.0)
    assert torch.allclose(f["time_to_collision"][0, 0, 0, :-1], ttc[:-1], atol=1e-3)
    assert f["time_to_collision"][0, 0, 0, 70].item() == pytest.approx((56.0 - 0.5 * 81) / 5.0, abs=1e-3)
    assert (f["time_to_collision"][0, 0, 1] == 5.0).all()  # B follows nobody
    # corners at y = +-1, edges at y = +-5, both on the road side
    assert torch.allclose(f["distance_to_road_edge"][0, 0], torch.full((2, 80), -4.0), atol=1e-4)
    assert not f["collision"].any() and not f["offroad"].any() and not f["traffic_light_violation"].any()


def _mixed_rollouts(batch):
    """32 rollouts of the log, except: A drives at 8 m/s in rollouts 0-15; B sits 3 m ahead of A
    (boxes overlap) in rollouts 16-19; A is shifted to y = 6 m (off the road) in 24-31."""
    sim = B.log_replay(batch).clone()  # [1, 32, 2, 80, 4]
    k = torch.arange(1, 81, dtype=torch.float32)
    sim[0, :16, 0, :, 0] = 10.0 + 0.8 * k
    sim[0, 16:20, 1, :, 0] = sim[0, 16:20, 0, :, 0] + 3.0
    sim[0, 24:, 0, :, 1] = 6.0
    return sim


def test_hand_built_scene_likelihoods(batch):
    out = M.score(batch, _mixed_rollouts(batch))
    # speed histograms (bins of 2.5 m/s, +0.1 per bin, 32 x 80 values; the last step is NaN -> last
    # bin; step 11 spans the jump from the logged step 10 to the rollout):
    #   A at 10 m/s (bin 4) in rollouts 16-23 (79 steps) and 24-31 (78: step 11 jumps 6 m sideways);
    #   B at 5 m/s (bin 2) in the 28 rollouts other than 16-19 (79 steps each).
    # Each object's 78 valid logged speeds (speed validity on the 80 steps) fall in those bins.
    total = 32 * 80 + 10 * 0.1
    expect = math.sqrt((8 * 79 + 8 * 78 + 0.1) / total * (28 * 79 + 0.1) / total)
    assert out["linear_speed"].item() == pytest.approx(expect, rel=1e-5)
    # collision: A and B each collide in 4 of 32 rollouts, never in the log
    assert out["collision_indication"].item() == pytest.approx((28 + 0.001) / (32 + 0.002), rel=1e-5)
    # offroad: A in 8 rollouts, B never
    assert out["offroad_indication"].item() == pytest.approx(
        math.sqrt((24 + 0.001) / 32.002 * (32 + 0.001) / 32.002), rel=1e-5)
    assert out["traffic_light_violation"].item() == pytest.approx(32.001 / 32.002, rel=1e-6)
    meta = sum(c.weight * out[c.name] for c in C.SIM_AGENTS_2025)
    assert out["metametric"].item() == pytest.approx(meta.item(), rel=1e-6)
    assert out["metametric"].item() < M.score(batch, B.log_replay(batch))["metametric"].item()


def test_log_replay_beats_constant_speed_when_the_log_brakes():
    msg = two_vehicle_proto()
    for s in list(msg.tracks[0].states)[11:]:  # A brakes to a stop after step 10
        s.center_x = 10.0 + 3.0
    b = stack_scenes([scene_from_proto(msg)])
    log, cv = M.score(b, B.log_replay(b)), M.score(b, B.constant_speed(b))
    assert log["metametric"].item() > cv["metametric"].item() + 0.05
    assert log["linear_speed"].item() > cv["linear_speed"].item()


def test_histogram_rules_match_the_official_edges():
    cfg = C.feature("linear_speed")  # [0, 25], 10 bins of 2.5
    v = torch.tensor([-1.0, 0.0, 2.4999, 2.5, 24.9, 25.0, 99.0, float("nan")])
    assert M.histogram_bins(v, cfg).tolist() == [0, 0, 0, 1, 9, 9, 9, 9]


def test_box_distance_rotated_and_overlapping():
    a = F._corners(torch.tensor(0.0), torch.tensor(0.0), torch.tensor(0.0), torch.tensor(2.0), torch.tensor(2.0))
    b = F._corners(torch.tensor(5.0), torch.tensor(0.0), torch.tensor(math.pi / 4), torch.tensor(2.0),
                   torch.tensor(2.0))
    # square of side 2 turned 45 deg reaches sqrt(2) towards the first one: gap 5 - 1 - sqrt(2)
    assert F._box_box_signed_distance(a, b).item() == pytest.approx(4.0 - math.sqrt(2), abs=1e-5)
    c = F._corners(torch.tensor(1.5), torch.tensor(0.0), torch.tensor(0.0), torch.tensor(2.0), torch.tensor(2.0))
    assert F._box_box_signed_distance(a, c).item() == pytest.approx(-0.5, abs=1e-5)


@pytest.mark.parametrize("kw, reason", [
    (dict(ttp=False), "no objects to predict"),
    (dict(steps=50), "expected 91"),
    (dict(valid_b_at_10=False), "not valid at step 10"),
])
def test_unscorable_scenes_are_skipped_with_a_reason(kw, reason):
    with pytest.raises(SceneSkipped, match=reason):
        scene_from_proto(two_vehicle_proto(**kw))


def test_no_road_edge_is_skipped():
    msg = two_vehicle_proto()
    del msg.map_features[:]
    with pytest.raises(SceneSkipped, match="no road edge"):
        scene_from_proto(msg)


def test_rollouts_of_the_wrong_shape_are_refused(batch):
    with pytest.raises(ValueError, match=r"\[1, R, 2, 80, 4\]"):
        M.score(batch, torch.zeros(1, 32, 2, 79, 4))


def test_speed_validity_is_taken_on_the_80_simulated_steps(batch):
    """The official scorer takes the central-difference validity on the 80 scored steps, so the
    first scored step never counts for speeds (nor the first two for accelerations), even when
    the log is valid before it."""
    (x, y, z, h), v = M.log_trajectories(batch)
    log = M.compute_features(batch, x, y, z, h, v)
    sim = {k: t.expand(1, 32, *t.shape[2:]).clone() for k, t in log.items()}
    log["linear_speed"][..., 0] = 24.0  # the first scored step: another bin than every rollout value
    log["linear_acceleration"][..., 1] = 11.0
    out = M.likelihoods(batch, log, sim)
    reference = M.likelihoods(batch, {k: t.clone() for k, t in _log_features(batch).items()}, sim)
    assert out["linear_speed"].item() == pytest.approx(reference["linear_speed"].item(), rel=1e-6)
    assert out["linear_acceleration"].item() == pytest.approx(reference["linear_acceleration"].item(), rel=1e-6)
    log["linear_speed"][..., 1] = 24.0  # the second one counts
    assert M.likelihoods(batch, log, sim)["linear_speed"].item() < 0.95 * reference["linear_speed"].item()


def test_pruned_nearest_segment_searches_equal_the_full_ones():
    """The candidate pruning of the road-edge and lane searches changes nothing: same segments as
    a search over every segment, on the bundled WOMD scenario (5251 road-edge segments)."""
    from gpusim.data.tfrecord import iter_records

    from conftest import REPO

    payload = next(p for _, p in iter_records(REPO / "data/womd_tfrecord/motion_data_one_scenario.tfrecord.gz"))
    msg = messages()["Scenario"]()
    msg.ParseFromString(payload)
    b = stack_scenes([scene_from_proto(msg)])
    assert b.edge_start.shape[1] > 10 * F.CANDIDATES
    g = torch.Generator().manual_seed(0)
    centre = b.edge_start[0, ::50]  # points scattered around the map, some far from any edge
    q = (centre[torch.randint(len(centre), (600,), generator=g)] + torch.randn(600, 3, generator=g) * 15)[None]
    seg, rel, d2 = F._nearest_edge(b, q)
    _, _, _, d3 = F._edge_terms(q[:, :, None], b.edge_start[:, None], b.edge_vec[:, None])
    full = torch.where(b.edge_valid[:, None], d3, torch.full_like(d3, F.BIG)).argmin(dim=-1)
    assert torch.equal(seg, full)
    xy = q[..., :2]
    lane = F._current_lane(b, xy, 1 << 22)
    dl = F._lane_distance(xy[:, :, None], b.lane_start[:, None], b.lane_vec[:, None])
    brute = torch.gather(b.lane_seg_lane_id, 1, dl.argmin(dim=-1))
    assert torch.equal(lane, brute)


def test_red_light_violation_hand_built():
    """A crosses the stop point (x = 50.5 m) between steps 50 and 51 of the log; B starts past it.
    In rollouts 0-7, A stops at x = 30 m instead."""
    b = stack_scenes([scene_from_proto(two_vehicle_proto(signal=True))])
    log = _log_features(b)["traffic_light_violation"][0, 0]
    assert log[0].nonzero().flatten().tolist() == [51 - 11]
    assert not log[1].any()
    sim = B.log_replay(b).clone()
    sim[0, :8, 0, :, 0] = sim[0, :8, 0, :, 0].clamp(max=30.0)
    out = M.score(b, sim)
    assert out["traffic_light_violation"].item() == pytest.approx(math.sqrt(24.001 * 32.001) / 32.002, rel=1e-5)
    # a green signal is no violation
    msg = two_vehicle_proto(signal=True)
    for d in msg.dynamic_map_states:
        d.lane_states[0].state = 6
    b = stack_scenes([scene_from_proto(msg)])
    assert not _log_features(b)["traffic_light_violation"].any()


def test_scenarios_batched_with_padding_score_as_alone():
    """Two scenes of different sizes (objects, road edges, lanes, signals) padded into one batch
    give each scene's own figures."""
    first = scene_from_proto(two_vehicle_proto())
    msg = two_vehicle_proto(signal=True)
    parked = msg.tracks.add(id=3, object_type=1)
    for _ in range(T):
        parked.states.add(center_x=80.0, center_y=3.0, center_z=0.0, heading=0.1, length=4.5, width=2.0,
                          height=1.5, valid=True)
    edge = msg.map_features.add(id=5).road_edge
    for x, y in ((-50.0, 20.0), (0.0, 21.0), (50.0, 20.0)):
        edge.polyline.add(x=x, y=y, z=0.0)
    second = scene_from_proto(msg)
    both = stack_scenes([first, second])
    assert both.present.shape == (2, 3) and not both.present[0, 2]
    rollouts = B.constant_speed(both)
    rollouts[:, :8, 0, :, 1] += 6.0  # some offroad A's
    together = M.score(both, rollouts)
    for i, scene in enumerate((first, second)):
        alone = M.score(stack_scenes([scene]), rollouts[i:i + 1, :, :scene.num_objects])
        for k, v in alone.items():
            assert together[k][i].item() == pytest.approx(v.item(), rel=1e-6, abs=1e-7), k


def test_cli_scores_baselines_and_a_submission(tmp_path, capsys):
    import json

    from gpusim.data.proto_export import write_submission
    from gpusim.data.tfrecord import write_records
    from gpusim.wosac.__main__ import main

    src = write_records(tmp_path / "two.tfrecord", [two_vehicle_proto().SerializeToString(),
                                                    two_vehicle_proto(ttp=False).SerializeToString()])
    scene = scene_from_proto(two_vehicle_proto())
    b = stack_scenes([scene])
    sub = write_submission(tmp_path / "r.binproto", {scene.scenario_id: (scene.object_id, _mixed_rollouts(b)[0].numpy())})
    out = tmp_path / "w.json"
    assert main([str(src), "--baseline", "log_replay", "--submission", str(sub), "--json", str(out)]) == 0
    text = capsys.readouterr()
    assert "1 scenario(s) scored, 1 skipped" in text.out and "no objects to predict" in text.err
    res = json.loads(out.read_text())
    mixed = M.score(b, _mixed_rollouts(b))
    assert res["summary"]["submission"]["metametric"]["mean"] == pytest.approx(mixed["metametric"].item(), rel=1e-6)
    assert res["summary"]["log_replay"]["collision_indication"]["mean"] == pytest.approx(32.001 / 32.002)
    # rollouts that miss an object are refused with the file and scenario named
    bad = write_submission(tmp_path / "bad.binproto",
                           {scene.scenario_id: (scene.object_id[:1], _mixed_rollouts(b)[0, :, :1].numpy())})
    assert main([str(src), "--submission", str(bad)]) == 2
    assert "bad.binproto: scenario two-vehicles: objects do not match" in capsys.readouterr().err
