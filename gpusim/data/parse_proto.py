"""Decode one WOMD ``Scenario`` protocol buffer (a TFRecord record) into a :class:`RawScenario`.

The mapping gives the same :class:`~gpusim.data.parse.RawScenario` as the GPUDrive JSON path
(:mod:`gpusim.data.parse`), with these choices (documented in ``docs/data.md``):

* tracks of type vehicle / pedestrian / cyclist are kept in track order (``source_index`` = track
  index); ``unset`` / ``other`` tracks are ignored and counted. Every track must have 91 states.
* per-step position (``center_x/y``), heading (radians, as logged — no unit guessing) and
  velocity; invalid steps hold 0.
* ``length`` / ``width``: those of the last valid state (the GPUDrive JSON converter does the
  same); goal = the last valid position. A track whose size there is not a finite number > 0 is
  dropped (``RawScenario.dropped_objects``), the scenario kept.
* ``mark_as_expert`` does not exist in the protos: false for every track.
* map features → polylines: lane / road_line / road_edge polylines, crosswalk / speed_bump /
  driveway polygons (as listed, not closed — as in the JSON files), stop sign = one point.
  ``road_id`` = the feature id.
* ``objects_of_interest`` (track ids) and ``tracks_to_predict`` (track indices) → flags.
* ``dynamic_map_states[t].lane_states`` → :class:`~gpusim.data.signals.RawSignals`.

Errors are :class:`ScenarioError` naming the file and ``record[i]`` (plus the field, e.g.
``record[2].tracks[5].states``).
"""

from __future__ import annotations

import collections

import numpy as np

from gpusim.config import WOMD_STEPS, ObjectType, RoadType
from gpusim.data.errors import ScenarioError
from gpusim.data.parse import RawScenario, bad_size_reason
from gpusim.data.signals import SignalState, signals_from_observations
from gpusim.data.womd_proto import messages

_TRACK_TYPES = {1: ObjectType.VEHICLE, 2: ObjectType.PEDESTRIAN, 3: ObjectType.CYCLIST}
_TRACK_TYPE_NAMES = {0: "unset", 4: "other"}
_FEATURES = {
    "lane": (RoadType.LANE, "polyline"), "road_line": (RoadType.ROAD_LINE, "polyline"),
    "road_edge": (RoadType.ROAD_EDGE, "polyline"), "crosswalk": (RoadType.CROSSWALK, "polygon"),
    "speed_bump": (RoadType.SPEED_BUMP, "polygon"), "driveway": (RoadType.DRIVEWAY, "polygon"),
}


def decode_scenario(payload: bytes, file, index: int):
    """Parse ``payload`` as a ``Scenario`` message.

    Raises:
        ScenarioError: field ``record[index]`` if the bytes are not a valid message.
    """
    from google.protobuf.message import DecodeError

    msg = messages()["Scenario"]()
    try:
        msg.ParseFromString(payload)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ScenarioError(file, f"record[{index}]", f"not a Scenario protocol buffer ({exc})") from None
    return msg


def _tracks(msg, file, rec, T):
    ignored = collections.Counter()
    keep = []
    for j, tr in enumerate(msg.tracks):
        otype = _TRACK_TYPES.get(tr.object_type)
        if otype is None:
            ignored[_TRACK_TYPE_NAMES.get(tr.object_type, str(tr.object_type))] += 1
            continue
        if len(tr.states) != T:
            raise ScenarioError(file, f"{rec}.tracks[{j}].states", f"{len(tr.states)} entries, expected {T}")
        keep.append((j, tr, otype))
    n = len(keep)
    arr = np.zeros((n, T, 7))  # x, y, heading, vx, vy, length, width
    valid = np.zeros((n, T), bool)
    for k, (j, tr, _) in enumerate(keep):
        arr[k] = [(s.center_x, s.center_y, s.heading, s.velocity_x, s.velocity_y, s.length, s.width)
                  for s in tr.states]
        valid[k] = [s.valid for s in tr.states]
        bad = ~np.isfinite(arr[k, :, :5]).all(axis=1) & valid[k]
        if bad.any():
            t = int(np.flatnonzero(bad)[0])
            raise ScenarioError(file, f"{rec}.tracks[{j}].states[{t}]", "non-finite value at a valid step")
    return keep, arr, valid, ignored


def _map(msg, file, rec):
    pts, types, ids, starts = [], [], [], [0]
    for j, feat in enumerate(msg.map_features):
        kind = feat.WhichOneof("feature_data")
        if kind is None:
            continue
        sub = getattr(feat, kind)
        if kind == "stop_sign":
            xy = np.array([[sub.position.x, sub.position.y]]) if sub.HasField("position") else np.zeros((0, 2))
            rt = RoadType.STOP_SIGN
        else:
            rt, attr = _FEATURES[kind]
            xy = np.array([(p.x, p.y) for p in getattr(sub, attr)], dtype=np.float64).reshape(-1, 2)
        if not np.isfinite(xy).all():
            raise ScenarioError(file, f"{rec}.map_features[{j}].{kind}", "non-finite coordinates")
        pts.append(xy)
        types.append(int(rt))
        ids.append(int(feat.id))
        starts.append(starts[-1] + len(xy))
    return pts, types, ids, starts


def _signals(msg, file, rec, T):
    obs = []
    unknown = 0
    for t, dms in enumerate(msg.dynamic_map_states):
        if t >= T:
            break
        for ls in dms.lane_states:
            code = ls.state
            if not 0 <= code < len(SignalState):  # codes are 0..8, contiguous
                unknown += 1
                code = 0
            x, y = ls.stop_point.x, ls.stop_point.y
            if not (np.isfinite(x) and np.isfinite(y)):
                raise ScenarioError(file, f"{rec}.dynamic_map_states[{t}].lane_states", "non-finite stop point")
            obs.append((t, int(ls.lane), int(code), float(x), float(y)))
    sig = signals_from_observations(obs, T)
    sig.unknown_names = unknown
    return sig


def proto_to_raw(msg, file, index: int) -> RawScenario:
    """Map a decoded ``Scenario`` message onto a :class:`RawScenario` (rules in the module doc).

    Raises:
        ScenarioError: naming ``file`` and ``record[index]``: no tracks (``.tracks``), no map
            features (``.map_features``), a track without 91 states, non-finite values at valid
            steps or in map geometry, or ``sdc_track_index`` out of range. (A track with a bad box
            size is dropped, not refused: ``dropped_objects``.)
    """
    file = str(file)
    rec = f"record[{index}]"
    T = WOMD_STEPS
    if len(msg.tracks) == 0:
        raise ScenarioError(file, f"{rec}.tracks", "missing (the scenario has no track)")
    if len(msg.map_features) == 0:
        raise ScenarioError(file, f"{rec}.map_features", "missing (the scenario has no map)")
    keep, arr, valid, ignored = _tracks(msg, file, rec, T)
    last = np.where(valid.any(axis=1), T - 1 - np.argmax(valid[:, ::-1], axis=1), 0)
    rows = np.arange(len(keep))
    length, width = arr[rows, last, 5], arr[rows, last, 6]
    dropped, ok = [], np.ones(len(keep), bool)
    for k in np.flatnonzero(valid.any(axis=1)):
        why = bad_size_reason(float(width[k]), float(length[k]))
        if why is not None:
            dropped.append({"field": f"{rec}.tracks[{keep[k][0]}].states[{last[k]}]", "reason": why})
            ok[k] = False
    keep = [kp for kp, o in zip(keep, ok) if o]
    arr, valid, last, length, width = arr[ok], valid[ok], last[ok], length[ok], width[ok]
    n = len(keep)
    pos, heading, vel = arr[..., 0:2].copy(), arr[..., 2].copy(), arr[..., 3:5].copy()
    goal = pos[np.arange(n), last].copy()
    good = np.isfinite(length) & np.isfinite(width) & (length > 0) & (width > 0)
    length = np.where(good, length, 1.0)  # never-valid tracks (the only ones left with a bad size) are dropped later
    width = np.where(good, width, 1.0)
    inv = ~valid
    pos[inv] = 0.0
    heading[inv] = 0.0
    vel[inv] = 0.0
    heading = np.remainder(heading + np.pi, 2 * np.pi) - np.pi
    sdc = int(msg.sdc_track_index) if msg.HasField("sdc_track_index") else -1
    if sdc >= len(msg.tracks) or sdc < -1:
        raise ScenarioError(file, f"{rec}.sdc_track_index", f"{sdc} is not an index into the {len(msg.tracks)} tracks")
    src = np.array([j for j, _, _ in keep], dtype=np.int64)
    ooi = set(msg.objects_of_interest)
    ttp = {int(p.track_index) for p in msg.tracks_to_predict}
    pts, types, ids, starts = _map(msg, file, rec)
    sid = msg.scenario_id or f"{file}#{index}"
    return RawScenario(
        file=file, scenario_id=sid, pos=pos, heading=heading, vel=vel, valid=valid,
        obj_type=np.array([int(o) for _, _, o in keep], dtype=np.int8),
        length=length, width=width, goal=goal, expert=np.zeros(n, bool), source_index=src,
        sdc_source_index=sdc,
        road_xy=np.concatenate(pts) if pts else np.zeros((0, 2)),
        road_start=np.array(starts, dtype=np.int64), road_type=np.array(types, dtype=np.int8),
        road_id=np.array(ids, dtype=np.int64),
        interest=np.array([tr.id in ooi for _, tr, _ in keep], dtype=bool).reshape(n),
        predict=np.isin(src, list(ttp)),
        signals=_signals(msg, file, rec, T),
        ignored_objects=dict(ignored),
        dropped_objects=dropped,
    )


def parse_record(payload: bytes, file, index: int) -> RawScenario:
    """:func:`decode_scenario` then :func:`proto_to_raw`. Raises :class:`ScenarioError`."""
    return proto_to_raw(decode_scenario(payload, file, index), file, index)


def track_fingerprint(msg, count: int) -> tuple[int, list]:
    """What GPUDrive's JSON converter would record of a decoded ``Scenario``: the number of tracks
    (that converter writes every track, of any type, as one object, in track order) and the first
    valid ``(center_x, center_y)`` (m, float) of each of the first ``count`` tracks, None for a
    track never valid. Compared with a split file's ``objects`` / ``first_xy``."""
    first = []
    for tr in list(msg.tracks)[:count]:
        st = next((s for s in tr.states if s.valid), None)
        first.append(None if st is None else (float(st.center_x), float(st.center_y)))
    return len(msg.tracks), first
