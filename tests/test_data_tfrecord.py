"""WOMD TFRecord input (gpusim.data.tfrecord / parse_proto): framing and CRCs, gzip, bad records,
and equivalence with the GPUDrive JSON path on crafted and real scenarios."""

from __future__ import annotations

import json
import lzma
import os
import pathlib

import numpy as np
import pytest
import torch

from gpusim.config import DataConfig, RoadType
from gpusim.data import ScenarioError, ScenarioPack, SignalState, load_scenario
from gpusim.data.convert import expand_sources
from gpusim.data.parse_proto import parse_record
from gpusim.data.tfrecord import encode_record, is_tfrecord_file, iter_records, masked_crc, write_records
from womd_records import json_to_proto, proto_to_json, small_scenario

SHARED = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
BUNDLED_TFRECORD = pathlib.Path(__file__).resolve().parents[1] / "data" / "womd_tfrecord" / \
    "motion_data_one_scenario.tfrecord.gz"
SHARED_TFRECORD = SHARED / "womd_tfrecord" / "motion_data_one_scenario.tfrecord"
CFG = DataConfig(grid_k=16, grid_edge_k=8)


def _payloads(recs):
    return [p for _, p in recs]


# ----------------------------------------------------------------------------- framing
def test_masked_crc_known_vector():
    # CRC-32C("123456789") = 0xE3069283 (the standard check value); masked: rotr 15, + 0xA282EAD8.
    crc = 0xE3069283
    expect = ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
    assert masked_crc(b"123456789") == expect


@pytest.mark.parametrize("compress", [False, True])
def test_round_trip_multi_record(tmp_path, compress):
    payloads = [b"", b"a", os.urandom(1000), b"x" * 70000]
    path = write_records(tmp_path / "r.tfrecord", payloads, compress=compress)
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == compress
    recs = list(iter_records(path))
    assert [i for i, _ in recs] == [0, 1, 2, 3]
    assert _payloads(recs) == payloads


def test_truncated_file_reports_the_record_and_keeps_the_earlier_ones(tmp_path):
    payloads = [b"first", b"second" * 50, b"third"]
    data = b"".join(encode_record(p) for p in payloads)
    cut = len(encode_record(payloads[0])) + 40  # inside record 1's payload
    path = tmp_path / "cut.tfrecord"
    path.write_bytes(data[:cut])
    recs = list(iter_records(path))
    assert recs[0] == (0, b"first")
    idx, err = recs[1]
    assert idx == 1 and isinstance(err, ScenarioError)
    assert err.field == "record[1]" and "truncated" in err.reason and str(path) in str(err)
    assert len(recs) == 2
    path.write_bytes(data[: len(encode_record(payloads[0])) + 5])  # inside record 1's header
    (_, ok), (_, err) = list(iter_records(path))
    assert ok == b"first" and "header" in err.reason


def test_bad_payload_crc_skips_only_that_record(tmp_path):
    recs = [encode_record(p) for p in (b"zero", b"one-one", b"two")]
    bad = bytearray(recs[1])
    bad[14] ^= 0xFF  # a payload byte
    path = tmp_path / "crc.tfrecord"
    path.write_bytes(recs[0] + bytes(bad) + recs[2])
    out = list(iter_records(path))
    assert out[0][1] == b"zero" and out[2] == (2, b"two")
    assert isinstance(out[1][1], ScenarioError) and "CRC of the record data" in out[1][1].reason


def test_bad_length_crc_ends_the_file(tmp_path):
    rec = bytearray(encode_record(b"payload"))
    rec[9] ^= 0x01  # the length CRC
    path = tmp_path / "len.tfrecord"
    path.write_bytes(encode_record(b"ok") + bytes(rec) + encode_record(b"never read"))
    out = list(iter_records(path))
    assert out[0][1] == b"ok" and len(out) == 2
    assert out[1][1].field == "record[1]" and "length" in out[1][1].reason


def test_source_names():
    for name in ("a.tfrecord", "a.tfrecord.gz", "training.tfrecord-00000-of-01000", "x.tfrecord-00012"):
        assert is_tfrecord_file(name), name
    for name in ("tfrecord-00001-of-01000_307.json.xz", "a.json", "a.tfrecordx", "notes.txt"):
        assert not is_tfrecord_file(name), name


# ----------------------------------------------------------------------------- scenarios
def test_proto_scenario_maps_onto_raw_scenario():
    raw = parse_record(small_scenario("s1").SerializeToString(), "f.tfrecord", 0)
    assert raw.scenario_id == "s1" and raw.num_objects == 3 and raw.ignored_objects == {"other": 1}
    assert raw.sdc_source_index == 0 and raw.source_index.tolist() == [0, 1, 2]
    assert raw.interest.tolist() == [False, True, False] and raw.predict.tolist() == [False, True, False]
    np.testing.assert_allclose(raw.heading[1, :5], 0.3, atol=1e-6)  # radians, as logged
    assert not raw.valid[2, 81:].any() and (raw.pos[2, 81:] == 0).all()
    np.testing.assert_allclose(raw.goal[2], raw.pos[2, 80])  # goal = last valid position
    assert sorted(raw.road_type.tolist()) == sorted(
        [RoadType.LANE, RoadType.ROAD_EDGE, RoadType.ROAD_EDGE, RoadType.STOP_SIGN, RoadType.CROSSWALK])
    assert raw.road_id.tolist() == [7, 20, 21, 30, 31]
    sig = raw.signals
    assert sig.lane.tolist() == [7] and not sig.valid[:5].any() and sig.valid[5:].all()
    assert sig.state[10, 0] == SignalState.STOP and sig.state[60, 0] == SignalState.GO
    np.testing.assert_allclose(sig.pos[0], (1025.0, 2000.0))


def test_bad_records_are_reported_and_good_ones_convert(tmp_path, sample_dir):
    no_tracks = small_scenario("no_tracks")
    del no_tracks.tracks[:]
    no_map = small_scenario("no_map")
    del no_map.map_features[:]
    short = small_scenario("short")
    del short.tracks[1].states[-1]
    payloads = [small_scenario("good0").SerializeToString(), b"\x0a\xff\xff\xff", no_tracks.SerializeToString(),
                no_map.SerializeToString(), short.SerializeToString(), small_scenario("good5").SerializeToString()]
    bad_crc = bytearray(encode_record(small_scenario("crc").SerializeToString()))
    bad_crc[20] ^= 0xFF
    path = tmp_path / "mixed.tfrecord"
    path.write_bytes(b"".join(encode_record(p) for p in payloads) + bytes(bad_crc))
    json_file = sample_dir / "tfrecord-00068-of-01000_277.json.xz"
    pack = ScenarioPack.from_json([path, json_file], CFG)
    assert pack.scenario_ids[:2] == ["good0", "good5"] and pack.source_files[2] == str(json_file)
    assert pack.stats["converted"] == 3 and pack.stats["records"] == 7 and pack.stats["files"] == 2
    errs = {e["record"]: e["reason"] for e in pack.stats["errors"]}
    assert all(e["file"] == str(path) for e in pack.stats["errors"])
    assert errs[1].startswith("record[1]: not a Scenario protocol buffer")
    assert errs[2] == "record[2].tracks: missing (the scenario has no track)"
    assert errs[3] == "record[3].map_features: missing (the scenario has no map)"
    assert errs[4] == "record[4].tracks[1].states: 90 entries, expected 91"
    assert errs[6].startswith("record[6]: bad CRC")
    with pytest.raises(ScenarioError, match=r"mixed.tfrecord: record\[1\]: not a Scenario"):
        ScenarioPack.from_json([path], CFG, on_error="raise")


def test_limit_stops_early(tmp_path):
    path = write_records(tmp_path / "many.tfrecord", [small_scenario(f"s{i}").SerializeToString() for i in range(4)])
    pack = ScenarioPack.from_json(path, CFG, limit=2)
    assert pack.scenario_ids == ["s0", "s1"] and pack.stats["limit_reached"]


def _assert_packs_equal(a: ScenarioPack, b: ScenarioPack, atol=1e-4):
    assert a.scenario_ids == b.scenario_ids
    for name, ta in a.tensors().items():
        tb = getattr(b, name)
        assert ta.shape == tb.shape, name
        if name == "traj_heading":  # wrapped angles: compare on the circle
            d = torch.remainder(ta - tb + torch.pi, 2 * torch.pi) - torch.pi
            assert d.abs().max() <= 1e-4, name
        elif name == "agent_source_index":
            continue  # JSON index vs track index: equal here, see the tests
        elif ta.dtype.is_floating_point:
            torch.testing.assert_close(ta, tb, atol=atol, rtol=0, msg=name)
        else:
            assert torch.equal(ta, tb), name


@pytest.mark.parametrize("compress", [False, True])
def test_crafted_scenario_same_pack_from_tfrecord_and_json(tmp_path, compress):
    msg = small_scenario("eq")
    rec = write_records(tmp_path / "eq.tfrecord.gz" if compress else tmp_path / "eq.tfrecord",
                        [msg.SerializeToString()], compress=compress)
    js = tmp_path / "eq.json"
    js.write_text(json.dumps(proto_to_json(msg)))
    a, b = ScenarioPack.from_json(rec, CFG), ScenarioPack.from_json(js, CFG)
    assert int(a.num_signals[0]) == 1 and a.signal_dir[0, 0].tolist() == [1.0, 0.0]
    _assert_packs_equal(a, b)


def test_real_json_scenario_through_a_tfrecord_gives_the_same_pack(tmp_path, sample_dir):
    """A real bundled JSON scenario (metadata, ids; degrees or radians) written as a Scenario proto."""
    src = sample_dir / "1c365f15b70ebdbf.json.xz"
    doc = json.load(lzma.open(src))
    rec = write_records(tmp_path / "real.tfrecord", [json_to_proto(doc).SerializeToString()])
    a, b = ScenarioPack.from_json(rec, CFG), ScenarioPack.from_json(src, CFG)
    assert bool(a.agent_predict.any()) and torch.equal(a.agent_predict, b.agent_predict)
    _assert_packs_equal(a, b)


@pytest.mark.skipif(not (SHARED / "womd" / "2a173b334be3d32c.json.xz").exists(), reason="shared WOMD JSON absent")
def test_real_json_signals_survive_the_proto_round_trip(tmp_path):
    src = SHARED / "womd" / "2a173b334be3d32c.json.xz"
    doc = json.load(lzma.open(src))
    rec = write_records(tmp_path / "sig.tfrecord", [json_to_proto(doc).SerializeToString()])
    a, b = ScenarioPack.from_json(rec, CFG), ScenarioPack.from_json(src, CFG)
    assert int(b.num_signals[0]) == len(doc["tl_states"]) == 12
    _assert_packs_equal(a, b)


REAL = [pytest.param(BUNDLED_TFRECORD, id="bundled-gzip"),
        pytest.param(SHARED_TFRECORD, id="shared", marks=pytest.mark.skipif(
            not SHARED_TFRECORD.exists(), reason="shared WOMD TFRecord absent"))]


@pytest.mark.parametrize("real", REAL)
def test_real_tfrecord_scenario(tmp_path, real):
    pack = ScenarioPack.from_json(real, CFG)
    assert pack.scenario_ids == ["637f20cafde22ff8"] and pack.stats["errors"] == []
    assert int(pack.num_signals[0]) == 12 and pack.signal_valid[0].all()
    states = set(pack.signal_state[0].flatten().tolist())
    assert states == {int(SignalState.UNKNOWN), int(SignalState.ARROW_STOP), int(SignalState.STOP)}
    # every signal's lane is in the map, and the stop points lie near the packed agents' area
    assert (pack.signal_dir[0].norm(dim=-1) - 1).abs().max() < 1e-5
    assert pack.signal_pos[0].abs().max() < 150
    # headings are radians and agree with the direction of motion
    pos, head, valid = pack.traj_pos[0], pack.traj_heading[0], pack.traj_valid[0]
    step = pos[:, 1:] - pos[:, :-1]
    moving = valid[:, 1:] & valid[:, :-1] & (step.norm(dim=-1) > 0.5)
    err = torch.remainder(torch.atan2(step[..., 1], step[..., 0]) - head[:, :-1] + torch.pi, 2 * torch.pi) - torch.pi
    assert err[moving].abs().median() < 0.05
    # the same scenario through the JSON path (exported by the test helper) gives the same pack
    from gpusim.data.parse_proto import decode_scenario

    payload = next(iter_records(real))[1]
    js = tmp_path / "real.json"
    js.write_text(json.dumps(proto_to_json(decode_scenario(payload, real, 0))))
    _assert_packs_equal(pack, ScenarioPack.from_json(js, CFG))


def test_directory_expansion_lists_tfrecords(tmp_path):
    write_records(tmp_path / "training.tfrecord-00000-of-00002", [b""])
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("")
    files, errors = expand_sources(tmp_path)
    assert [pathlib.Path(f).name for f in files] == ["a.json", "training.tfrecord-00000-of-00002"] and not errors


@pytest.mark.slow
def test_workers_give_the_same_pack(tmp_path, sample_dir):
    path = write_records(tmp_path / "w.tfrecord", [small_scenario(f"w{i}").SerializeToString() for i in range(3)]
                         + [b"\x0a\xff"])
    srcs = [path, sample_dir / "tfrecord-00068-of-01000_277.json.xz"]
    a = ScenarioPack.from_json(srcs, CFG)
    b = ScenarioPack.from_json(srcs, CFG, workers=2)
    _assert_packs_equal(a, b)
    assert a.stats["errors"] == b.stats["errors"] and len(a.stats["errors"]) == 1


@pytest.mark.parametrize("action_space", [None, 0])
def test_expert_tracking_on_the_real_tfrecord_scenario(action_space):
    """The issue's bar: logged (expert) driving of the TFRecord scenario reaches >= 95% of goals with
    p95 position error < 0.1 m (closed loop through the bicycle model, as tests/test_expert_tracking.py;
    measured: 21 agents, goal rate 1.0, p95 0.066 m continuous / 0.076 m discrete)."""
    from test_expert_tracking import _track

    goal_rate, _median, p95, n = _track(ScenarioPack.from_json(BUNDLED_TFRECORD), action_space)
    assert n == 21 and goal_rate >= 0.95 and p95 < 0.1


def test_load_scenario_reads_the_first_record(tmp_path):
    path = write_records(tmp_path / "two.tfrecord", [small_scenario("first").SerializeToString(), b"junk"])
    assert load_scenario(path, CFG).scenario_id == "first"
    with pytest.raises(ScenarioError, match="holds no record"):
        load_scenario(write_records(tmp_path / "empty.tfrecord", []), CFG)


def test_unknown_proto_signal_code_is_stored_as_unknown():
    msg = small_scenario("u")
    ls = msg.dynamic_map_states[3].lane_states.add(lane=9, state=42)
    ls.stop_point.x, ls.stop_point.y = 1000.0, 2000.0
    raw = parse_record(msg.SerializeToString(), "u.tfrecord", 0)
    assert raw.signals.lane.tolist() == [7, 9] and raw.signals.unknown_names == 1
    assert raw.signals.valid[3, 1] and raw.signals.state[3, 1] == SignalState.UNKNOWN
