"""Test helpers: write WOMD ``Scenario`` protos with gpusim's own schema, and translate between a
GPUDrive-layout JSON document and a ``Scenario`` message (both directions), so one scenario can
be converted through both input paths and the packs compared.

The translations follow the rules of :mod:`gpusim.data.parse_proto` (goal = last valid position,
box size constant per object, polygons not closed, stop sign = one point).
"""

from __future__ import annotations

import numpy as np

from gpusim.data.parse import heading_units_of
from gpusim.data.signals import SignalState
from gpusim.data.womd_proto import messages

TYPE_CODES = {"vehicle": 1, "pedestrian": 2, "cyclist": 3, "other": 4, "unset": 0}
TYPE_NAMES = {v: k for k, v in TYPE_CODES.items()}
POLY_ATTR = {"lane": "polyline", "road_line": "polyline", "road_edge": "polyline",
             "crosswalk": "polygon", "speed_bump": "polygon", "driveway": "polygon"}


def json_to_proto(doc: dict):
    """A ``Scenario`` message holding the same scenario as the GPUDrive JSON ``doc``.

    Headings are written in radians (the JSON unit is decided as the JSON reader does). Objects
    without ``id`` get their index as track id; roads without ``id`` get 10000 + index.
    """
    M = messages()
    msg = M["Scenario"]()
    msg.scenario_id = str(doc.get("scenario_id") or doc.get("name") or "")
    msg.timestamps_seconds.extend([0.1 * t for t in range(91)])
    msg.current_time_index = 10
    objs = doc["objects"]
    typed = [o for o in objs if o["type"] in ("vehicle", "pedestrian", "cyclist")]
    if typed:
        pos = np.array([[(p["x"], p["y"]) for p in o["position"]] for o in typed])
        head = np.array([o["heading"] for o in typed], dtype=float)
        val = np.array([o["valid"] for o in typed], dtype=bool)
        deg = heading_units_of(pos, head, val) == "deg"
    else:
        deg = False
    for i, o in enumerate(objs):
        tr = msg.tracks.add(id=int(o.get("id", i)), object_type=TYPE_CODES.get(o["type"], 4))
        for t in range(91):
            h = float(o["heading"][t])
            tr.states.add(center_x=o["position"][t]["x"], center_y=o["position"][t]["y"],
                          length=o["length"], width=o["width"], heading=np.deg2rad(h) if deg else h,
                          velocity_x=o["velocity"][t]["x"], velocity_y=o["velocity"][t]["y"],
                          valid=bool(o["valid"][t]))
    for j, r in enumerate(doc["roads"]):
        f = msg.map_features.add(id=int(r.get("id", 10000 + j)))
        pts = [(p["x"], p["y"]) for p in r["geometry"]]
        if r["type"] == "stop_sign":
            f.stop_sign.position.x, f.stop_sign.position.y = pts[0]
        else:
            sub = getattr(f, r["type"])
            for x, y in pts:
                getattr(sub, POLY_ATTR[r["type"]]).add(x=x, y=y)
    per_step = [[] for _ in range(91)]
    for lane, e in (doc.get("tl_states") or {}).items():
        for t, name, x, y in zip(e["time_index"], e["state"], e["x"], e["y"]):
            per_step[t].append((int(lane), int(SignalState.from_name(name)), x, y))
    for t in range(91):
        dms = msg.dynamic_map_states.add()
        for lane, code, x, y in per_step[t]:
            ls = dms.lane_states.add(lane=lane, state=code)
            ls.stop_point.x, ls.stop_point.y = x, y
    meta = doc.get("metadata") or {}
    if "sdc_track_index" in meta:
        msg.sdc_track_index = meta["sdc_track_index"]
    msg.objects_of_interest.extend(meta.get("objects_of_interest", []))
    for e in meta.get("tracks_to_predict", []):
        msg.tracks_to_predict.add(track_index=e["track_index"], difficulty=e.get("difficulty", 0))
    return msg


def proto_to_json(msg) -> dict:
    """A GPUDrive-layout JSON document (newer variant: ids, radians, metadata) of a ``Scenario``."""
    objects = []
    for tr in msg.tracks:
        valid = [bool(s.valid) for s in tr.states]
        last = max((t for t, v in enumerate(valid) if v), default=0)
        fin = tr.states[last]
        objects.append({
            "id": tr.id, "type": TYPE_NAMES.get(tr.object_type, "other"),
            "position": [{"x": s.center_x, "y": s.center_y} for s in tr.states],
            "heading": [s.heading for s in tr.states],
            "velocity": [{"x": s.velocity_x, "y": s.velocity_y} for s in tr.states],
            "valid": valid, "length": fin.length or 1.0, "width": fin.width or 1.0,
            "goalPosition": {"x": fin.center_x, "y": fin.center_y}, "mark_as_expert": False,
        })
    roads = []
    for f in msg.map_features:
        kind = f.WhichOneof("feature_data")
        if kind is None:
            continue
        sub = getattr(f, kind)
        if kind == "stop_sign":
            geom = [{"x": sub.position.x, "y": sub.position.y}]
        else:
            geom = [{"x": p.x, "y": p.y} for p in getattr(sub, POLY_ATTR[kind])]
        roads.append({"id": f.id, "type": kind, "geometry": geom})
    tl: dict = {}
    for t, dms in enumerate(msg.dynamic_map_states):
        for ls in dms.lane_states:
            e = tl.setdefault(str(ls.lane), {"state": [], "x": [], "y": [], "z": [], "time_index": []})
            e["state"].append(SignalState(ls.state).name.lower())
            e["x"].append(ls.stop_point.x)
            e["y"].append(ls.stop_point.y)
            e["z"].append(0.0)
            e["time_index"].append(t)
    meta = {"sdc_track_index": msg.sdc_track_index, "objects_of_interest": list(msg.objects_of_interest),
            "tracks_to_predict": [{"track_index": p.track_index, "difficulty": p.difficulty}
                                  for p in msg.tracks_to_predict]}
    return {"scenario_id": msg.scenario_id, "objects": objects, "roads": roads, "tl_states": tl, "metadata": meta}


def small_scenario(scenario_id: str = "synthetic", *, signals: bool = True):
    """A small valid ``Scenario``: two moving vehicles, a pedestrian, an ``other`` track, a lane
    with a signal, road edges, a stop sign and a crosswalk."""
    M = messages()
    msg = M["Scenario"](scenario_id=scenario_id, sdc_track_index=0, current_time_index=10)
    msg.timestamps_seconds.extend([0.1 * t for t in range(91)])
    rows = [(1, 0.0, 0.0, 5.0, 0.0), (1, 0.0, 4.0, 3.0, 0.3), (2, 10.0, -6.0, 0.0, 1.2), (4, 3.0, 3.0, 0.0, 0.0)]
    for i, (typ, x0, y0, v, h) in enumerate(rows):
        tr = msg.tracks.add(id=100 + i, object_type=typ)
        for t in range(91):
            d = v * 0.1 * t
            tr.states.add(center_x=1000.0 + x0 + d * np.cos(h), center_y=2000.0 + y0 + d * np.sin(h),
                          length=4.5 if typ == 1 else 0.8, width=2.0 if typ == 1 else 0.8, heading=h,
                          velocity_x=v * np.cos(h), velocity_y=v * np.sin(h), valid=not (i == 2 and t > 80))
    msg.objects_of_interest.append(101)
    msg.tracks_to_predict.add(track_index=1, difficulty=1)
    lane = msg.map_features.add(id=7)
    for k in range(12):
        lane.lane.polyline.add(x=990.0 + 5 * k, y=2000.0)
    for j, y in enumerate((1996.0, 2006.0)):
        edge = msg.map_features.add(id=20 + j)
        for k in range(12):
            edge.road_edge.polyline.add(x=990.0 + 5 * k, y=y)
    stop = msg.map_features.add(id=30)
    stop.stop_sign.position.x, stop.stop_sign.position.y = 1030.0, 1998.0
    stop.stop_sign.lane.append(7)
    cw = msg.map_features.add(id=31)
    for x, y in ((1020, 1996), (1024, 1996), (1024, 2006), (1020, 2006)):
        cw.crosswalk.polygon.add(x=x, y=y)
    for t in range(91):
        dms = msg.dynamic_map_states.add()
        if signals and t >= 5:
            ls = dms.lane_states.add(lane=7, state=int(SignalState.STOP if t < 50 else SignalState.GO))
            ls.stop_point.x, ls.stop_point.y = 1025.0, 2000.0
    return msg
