"""Parsing, validation, agent selection and road simplification of WOMD JSON (gpusim.data)."""

from __future__ import annotations

import copy
import gzip
import json
import lzma
import math

import numpy as np
import pytest

from gpusim.config import DataConfig, RoadType
from gpusim.data import NoControllableAgentError, ScenarioError, load_scenario
from gpusim.data.parse import heading_units_of
from gpusim.data.parse import read_scenario
from gpusim.data.roads import polylines_to_segments, simplify_polylines

T = 91


# ----------------------------------------------------------------------------- helpers
def obj(x0, y0, vx=0.0, vy=0.0, goal=None, typ="vehicle", valid=None, expert=None, length=4.5, width=2.0):
    """A straight-line track starting at (x0, y0); invalid steps carry the -10000 sentinel."""
    valid = [True] * T if valid is None else valid
    pos = [{"x": x0 + vx * 0.1 * t, "y": y0 + vy * 0.1 * t} if v else {"x": -10000.0, "y": -10000.0}
           for t, v in enumerate(valid)]
    o = {
        "position": pos,
        "heading": [math.atan2(vy, vx) if v else -10000.0 for v in valid],
        "velocity": [{"x": vx, "y": vy} if v else {"x": -10000.0, "y": -10000.0} for v in valid],
        "valid": valid,
        "width": width,
        "length": length,
        "goalPosition": goal if goal is not None else {"x": x0 + vx * 9.0, "y": y0 + vy * 9.0},
        "type": typ,
    }
    if expert is not None:
        o["mark_as_expert"] = expert
    return o


def scenario(objects, roads=None, **top):
    roads = roads if roads is not None else [
        {"geometry": [{"x": -50.0 + i, "y": -5.0} for i in range(101)], "type": "road_edge"},
        {"geometry": [{"x": -50.0 + 2 * i, "y": 0.0} for i in range(51)], "type": "lane"},
    ]
    return {"name": "crafted.json", "objects": objects, "roads": roads, "tl_states": {}, **top}


def write(path, doc):
    text = json.dumps(doc)
    if str(path).endswith(".xz"):
        with lzma.open(path, "wt") as fh:
            fh.write(text)
    elif str(path).endswith(".gz"):
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


def raw_json(path):
    with lzma.open(path, "rt") as fh:
        return json.load(fh)


def controllable_by_rule(doc, init=0, min_goal=2.0):
    """Independent re-statement of the default control rule, on the raw JSON."""
    out = []
    for i, o in enumerate(doc["objects"]):
        if o["type"] != "vehicle" or not o["valid"][init] or o.get("mark_as_expert", False):
            continue
        p, g = o["position"][init], o["goalPosition"]
        if math.hypot(p["x"] - g["x"], p["y"] - g["y"]) > min_goal:
            out.append(i)
    return out


# ----------------------------------------------------------------------------- real files
@pytest.mark.parametrize(
    "name, variant",
    [("1c365f15b70ebdbf.json.xz", "ids"), ("tfrecord-00068-of-01000_277.json.xz", "plain"),
     ("b5f53fa2db40a6b4.json.xz", "road ids only")],
)
def test_real_scenario_both_schema_variants(sample_dir, name, variant):
    path = sample_dir / name
    doc = raw_json(path)
    assert ("id" in doc["objects"][0]) == (variant == "ids")
    sc = load_scenario(path, DataConfig())
    ctrl = controllable_by_rule(doc)
    sdc = doc.get("metadata", {}).get("sdc_track_index")
    expected = ([sdc] if sdc in ctrl else []) + [i for i in ctrl if i != sdc]
    assert sc.num_controlled == len(expected)
    assert sc.agent_source_index[: sc.num_controlled].tolist() == expected[:32]
    if sdc is not None:
        assert sc.sdc_index == 0 and sc.agent_source_index[0] == sdc
    else:
        assert sc.sdc_index == -1
    known = [o for o in doc["objects"] if o["type"] in ("vehicle", "pedestrian", "cyclist")]
    n_known = len(known)
    assert sc.num_agents == min(64, n_known)
    # Positions / headings / sizes reproduce the file (world = local + offset) at valid steps.
    for slot in range(sc.num_agents):
        o = doc["objects"][int(sc.agent_source_index[slot])]
        valid = np.array(o["valid"])
        assert sc.traj_valid[slot].numpy().tolist() == valid.tolist()
        xy = np.array([(p["x"], p["y"]) for p in o["position"]])[valid]
        got = sc.traj_pos[slot].double().numpy()[valid] + sc.offset.numpy()
        np.testing.assert_allclose(got, xy, atol=2e-3)
        assert np.all(sc.traj_pos[slot].numpy()[~valid] == 0)  # sentinels are not stored
        h = np.array(o["heading"])[valid]
        if heading_units_of(np.array([[(q["x"], q["y"]) for q in ob["position"]] for ob in known]),
                            np.array([ob["heading"] for ob in known]),
                            np.array([ob["valid"] for ob in known], dtype=bool)) == "deg":
            h = np.deg2rad(h)
        dh = np.angle(np.exp(1j * (sc.traj_heading[slot].double().numpy()[valid] - h)))
        assert np.abs(dh).max(initial=0) < 1e-5
        assert sc.agent_length[slot] == pytest.approx(o["length"], rel=1e-6)
        assert sc.agent_type[slot] == {"vehicle": 0, "pedestrian": 1, "cyclist": 2}[o["type"]]
        g = np.array([o["goalPosition"]["x"], o["goalPosition"]["y"]])
        np.testing.assert_allclose(sc.agent_goal[slot].double().numpy() + sc.offset.numpy(), g, atol=2e-3)
    # Centring: the mean of the stored valid positions is ~0.
    assert sc.traj_pos[sc.traj_valid].double().mean(0).abs().max() < 1e-3


def test_read_json_compressions_agree(tmp_path):
    doc = scenario([obj(0, 0, vx=5.0), obj(10, 3, vx=-4.0, typ="cyclist")])
    raws = [read_scenario(write(tmp_path / f"s{suffix}", doc)) for suffix in (".json", ".json.gz", ".json.xz")]
    for r in raws[1:]:
        np.testing.assert_array_equal(r.pos, raws[0].pos)
        np.testing.assert_array_equal(r.road_xy, raws[0].road_xy)
    assert raws[0].scenario_id == "crafted"


# ----------------------------------------------------------------------------- selection rule
def test_selection_rule_crafted(tmp_path):
    invalid_at_0 = [False] * 5 + [True] * (T - 5)
    objects = [
        obj(0, 0, vx=5.0),                                   # 0 controllable
        obj(0, 4, vx=5.0, expert=True),                      # 1 marked expert -> expert
        obj(0, 8, goal={"x": 1.0, "y": 8.0}),                # 2 goal 1 m away -> expert
        obj(0, 12, vx=5.0, valid=invalid_at_0),              # 3 invalid at init -> expert
        obj(0, 16, vx=1.0, typ="pedestrian"),                # 4 pedestrian -> expert
        obj(0, 20, vx=5.0, expert=False),                    # 5 controllable
        obj(0, 24, vx=5.0, typ="traffic_cone"),              # 6 unknown type -> ignored
        obj(0, 28, vx=5.0),                                  # 7 controllable, SDC
        obj(0, 32, vx=5.0, goal={"x": 2.5, "y": 32.0}),      # 8 goal 2.5 m away -> controllable
    ]
    doc = scenario(objects, metadata={"sdc_track_index": 7})
    path = write(tmp_path / "sel.json", doc)
    sc = load_scenario(path, DataConfig())
    assert sc.num_controlled == 4
    assert sc.agent_source_index[:4].tolist() == [7, 0, 5, 8]  # SDC first, then file order
    assert sc.sdc_index == 0
    assert sc.agent_source_index[4:].tolist() == [1, 2, 3, 4]  # experts in file order
    assert sc.stats["ignored_objects"] == {"traffic_cone": 1}
    assert sc.agent_type.tolist() == [0, 0, 0, 0, 0, 0, 0, 1]

    # Cap: max_controlled = 2 keeps the SDC and the first in file order; the others are experts.
    sc2 = load_scenario(path, DataConfig(max_controlled=2))
    assert sc2.agent_source_index[:2].tolist() == [7, 0]
    assert sorted(sc2.agent_source_index[2:].tolist()) == [1, 2, 3, 4, 5, 8]
    assert sc2.stats["controllable_over_cap"] == 2

    # init_steps = 10: object 3 is valid there and becomes controllable.
    sc3 = load_scenario(path, DataConfig(init_steps=10))
    assert 3 in sc3.agent_source_index[: sc3.num_controlled].tolist()

    # goal_min_distance = 3 m: object 8 (goal 2.5 m away) is no longer controllable.
    sc4 = load_scenario(path, DataConfig(goal_min_distance=3.0))
    assert sc4.agent_source_index[: sc4.num_controlled].tolist() == [7, 0, 5]


def test_max_agents_keeps_nearest_valid_experts(tmp_path):
    objects = [obj(0, 0, vx=5.0)]  # controlled, centroid (0, 0)
    objects += [obj(d, 50, typ="pedestrian") for d in (400, 10, 300, 20)]  # experts at various distances
    objects += [obj(1, 1, typ="pedestrian", valid=[False] + [True] * (T - 1))]  # near but invalid at init
    objects += [obj(5, 5, typ="pedestrian", valid=[False] * T)]  # never valid: dropped
    path = write(tmp_path / "cap.json", scenario(objects))
    sc = load_scenario(path, DataConfig(max_agents=4, max_controlled=1))
    assert sc.agent_source_index.tolist() == [0, 2, 3, 4]  # the 3 nearest valid-at-init, file order
    assert sc.stats["dropped_over_max_agents"] == 2
    assert sc.stats["never_valid_objects"] == 1
    sc = load_scenario(path, DataConfig(max_agents=6, max_controlled=1))
    assert sc.agent_source_index.tolist() == [0, 1, 2, 3, 4, 5]


def test_no_controllable_agent_is_a_scenario_error(tmp_path):
    path = write(tmp_path / "none.json", scenario([obj(0, 0, typ="pedestrian", vx=1.0), obj(5, 0, expert=True, vx=3)]))
    with pytest.raises(NoControllableAgentError, match="none.json.*objects.*no controllable"):
        load_scenario(path)
    assert issubclass(NoControllableAgentError, ScenarioError) and issubclass(ScenarioError, ValueError)


def test_unknown_road_type_maps_to_other(tmp_path):
    roads = [{"geometry": [{"x": 0.0, "y": 0.0}, {"x": 10.0, "y": 0.0}], "type": "bike_lane"},
             {"geometry": [{"x": 0.0, "y": 5.0}, {"x": 10.0, "y": 5.0}], "type": "road_edge", "id": 3,
              "map_element_id": 15},
             {"geometry": [{"x": 3.0, "y": 3.0}], "type": "stop_sign"}]
    sc = load_scenario(write(tmp_path / "r.json", scenario([obj(0, 0, vx=5.0)], roads=roads)))
    assert sc.road_type.tolist() == [int(RoadType.OTHER), int(RoadType.ROAD_EDGE)]
    assert sc.stats["unknown_road_types"] == {"bike_lane": 1}
    assert sc.stats["single_point_polylines"] == 1
    np.testing.assert_allclose(sc.road_seg[1].double().numpy() + np.tile(sc.offset.numpy(), 2), [0, 5, 10, 5], atol=1e-4)


# ----------------------------------------------------------------------------- bad input
def _bad_cases():
    good = scenario([obj(0, 0, vx=5.0), obj(3, 3, vx=2.0)])

    def mod(fn):
        d = copy.deepcopy(good)
        fn(d)
        return d

    nan_step = lambda d: d["objects"][1]["position"].__setitem__(7, {"x": float("nan"), "y": 0.0})  # noqa: E731
    return [
        ("missing objects", mod(lambda d: d.pop("objects")), "objects"),
        ("missing roads", mod(lambda d: d.pop("roads")), "roads"),
        ("short position", mod(lambda d: d["objects"][1]["position"].pop()), "objects[1].position"),
        ("short heading", mod(lambda d: d["objects"][0]["heading"].pop()), "objects[0].heading"),
        ("long velocity", mod(lambda d: d["objects"][1]["velocity"].append({"x": 0, "y": 0})), "objects[1].velocity"),
        ("short valid", mod(lambda d: d["objects"][0].__setitem__("valid", [True] * 90)), "objects[0].valid"),
        ("nan position", mod(nan_step), "objects[1].position[7]"),
        ("inf heading", mod(lambda d: d["objects"][0]["heading"].__setitem__(3, float("inf"))), "objects[0].heading[3]"),
        ("nan velocity", mod(lambda d: d["objects"][0]["velocity"].__setitem__(0, {"x": float("nan"), "y": 0})),
         "objects[0].velocity[0]"),
        ("missing width", mod(lambda d: d["objects"][1].pop("width")), "objects[1].width"),
        ("missing length", mod(lambda d: d["objects"][0].pop("length")), "objects[0].length"),
        ("missing goal", mod(lambda d: d["objects"][1].pop("goalPosition")), "objects[1].goalPosition"),
        ("missing type", mod(lambda d: d["objects"][1].pop("type")), "objects[1].type"),
        ("nan road", mod(lambda d: d["roads"][1]["geometry"].__setitem__(4, {"x": float("nan"), "y": 1.0})),
         "roads[1].geometry[4]"),
        ("missing geometry", mod(lambda d: d["roads"][0].pop("geometry")), "roads[0].geometry"),
        ("bad sdc index", mod(lambda d: d.__setitem__("metadata", {"sdc_track_index": 9})), "metadata.sdc_track_index"),
    ]


@pytest.mark.parametrize("case, doc, field", _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_bad_input_names_file_and_field(tmp_path, case, doc, field):
    path = write(tmp_path / "bad_case.json.xz", doc)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert info.value.file == str(path)
    assert info.value.field == field
    msg = str(info.value)
    assert str(path) in msg and field in msg


def test_nonfinite_at_invalid_step_is_fine(tmp_path):
    o = obj(0, 0, vx=5.0, valid=[True] * 80 + [False] * 11)
    o["position"][85] = {"x": float("nan"), "y": float("nan")}
    sc = load_scenario(write(tmp_path / "ok.json", scenario([o])))
    assert bool(sc.traj_pos.isfinite().all())


@pytest.mark.parametrize("content, reason", [
    (b'{"objects": [', "invalid or truncated JSON"),
    (b"[1, 2, 3]", "top level"),
    (b"\xff\xfe garbage", "UTF-8"),
])
def test_bad_json_files(tmp_path, content, reason):
    path = tmp_path / "broken.json"
    path.write_bytes(content)
    with pytest.raises(ScenarioError, match=reason) as info:
        load_scenario(path)
    assert info.value.file == str(path)


def test_truncated_xz_file(tmp_path, sample_dir):
    data = (sample_dir / "tfrecord-00068-of-01000_277.json.xz").read_bytes()
    path = tmp_path / "cut.json.xz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ScenarioError, match="cut.json.xz") as info:
        load_scenario(path)
    assert info.value.file == str(path)


# ----------------------------------------------------------------------------- road simplification
def test_simplify_keeps_endpoints_and_removes_collinear():
    line = np.stack([np.linspace(0, 100, 201), np.zeros(201)], axis=1)  # exactly collinear
    corner = np.array([[0, 0], [1, 0], [2, 0], [3, 0], [3, 1], [3, 2], [3, 3.0]])  # L: the corner stays
    xy = np.concatenate([line, corner])
    start = np.array([0, 201, 208])
    keep = simplify_polylines(xy, start, area=0.1)
    assert keep[:201].tolist() == [True] + [False] * 199 + [True]
    assert keep[201:].tolist() == [True, False, False, True, False, False, True]


def test_simplify_respects_area_threshold():
    rng = np.random.default_rng(0)
    x = np.linspace(0, 50, 101)
    y = rng.normal(0, 0.3, size=101)
    xy = np.stack([x, y], 1)
    start = np.array([0, 101])
    for area in (0.01, 0.1, 1.0):
        keep = simplify_polylines(xy, start, area)
        assert keep[0] and keep[-1]
        k = np.flatnonzero(keep)
        a, b, c = xy[k[:-2]], xy[k[1:-1]], xy[k[2:]]
        tri = 0.5 * np.abs((a[:, 0] - b[:, 0]) * (c[:, 1] - b[:, 1]) - (c[:, 0] - b[:, 0]) * (a[:, 1] - b[:, 1]))
        assert (tri >= area).all()  # every surviving interior point is significant
    assert simplify_polylines(xy, start, 0.01).sum() > simplify_polylines(xy, start, 1.0).sum() > 2
    assert simplify_polylines(xy, start, 0.0).all()


def test_segments_drop_zero_length_and_split_polylines():
    xy = np.array([[0, 0], [1, 0], [1, 0], [1, 5], [7, 7], [8, 8.0]])
    start = np.array([0, 4, 6])
    seg, typ, st = polylines_to_segments(xy, start, np.array([0, 2], dtype=np.int8), area=0.0)
    np.testing.assert_array_equal(seg, [[0, 0, 1, 0], [1, 0, 1, 5], [7, 7, 8, 8]])
    assert typ.tolist() == [0, 0, 2]
    assert st["zero_length_segments"] == 1


def test_simplify_real_roads_shrinks_and_stays_close(sample_dir):
    raw = read_scenario(sample_dir / "db4edc9bd0c9d18c.json.xz")
    keep = simplify_polylines(raw.road_xy, raw.road_start, 0.1)
    assert keep[raw.road_start[:-1]].all() and keep[raw.road_start[1:] - 1].all()
    assert keep.sum() < 0.5 * keep.size  # WOMD polylines are densely sampled
    # Every dropped point lies within 0.5 m of the simplified polyline it belonged to.
    seg, _, _ = polylines_to_segments(raw.road_xy, raw.road_start, raw.road_type, 0.1)
    import torch

    from gpusim.data.grid_tables import point_segment_distance
    dropped = torch.from_numpy(raw.road_xy[~keep][::7])
    d = point_segment_distance(dropped, torch.from_numpy(seg)).min(dim=1).values
    assert float(d.max()) < 0.5


def test_heading_matches_direction_of_motion_on_real_samples(sample_dir):
    """Most shipped files store headings in degrees, some in radians; after parsing, the heading
    of every moving object must agree with its direction of motion (median error < 0.05 rad)."""
    import numpy as np

    from gpusim.data.parse import parse_scenario, read_json

    units = set()
    for path in sorted(sample_dir.glob("*.json.xz")):
        raw = parse_scenario(read_json(path), path)
        step = raw.pos[:, 1:] - raw.pos[:, :-1]
        moving = raw.valid[:, 1:] & raw.valid[:, :-1] & (np.hypot(step[..., 0], step[..., 1]) > 0.5)
        motion = np.arctan2(step[..., 1], step[..., 0])[moving]
        err = np.abs(np.remainder(motion - raw.heading[:, :-1][moving] + np.pi, 2 * np.pi) - np.pi)
        assert np.median(err) < 0.05, path.name
        assert np.abs(raw.heading).max() <= np.pi + 1e-9
        doc = read_json(path)
        heads = np.array([o["heading"] for o in doc["objects"] if o["type"] in ("vehicle", "pedestrian", "cyclist")])
        pos = np.array([[[p["x"], p["y"]] for p in o["position"]] for o in doc["objects"] if o["type"] in ("vehicle", "pedestrian", "cyclist")])
        valid = np.array([o["valid"] for o in doc["objects"] if o["type"] in ("vehicle", "pedestrian", "cyclist")], dtype=bool)
        units.add(heading_units_of(pos, heads, valid))
    assert units == {"deg", "rad"}  # the sample keeps both variants
