"""Write WOMD ``Scenario`` protos (from any scenario gpusim reads) and WOSAC submissions.

Two writers, no TensorFlow and no ``protoc``:

* :func:`scenario_proto_from_json` / :func:`export_scenarios`: a ``Scenario`` message (the schema
  of :mod:`gpusim.data.womd_proto`) from a GPUDrive/PufferDrive JSON file, so JSON scenarios can
  be scored by Waymo's tools. TFRecord sources are copied record by record.
* :func:`submission_message` / :func:`write_submission` / :func:`read_submission`: the
  ``SimAgentsChallengeSubmission`` protocol buffer of the Waymo Open Sim Agents Challenge
  (scenario rollouts -> joint scenes -> simulated trajectories), declared here at run time.

The submission schema follows the public ``sim_agents_submission.proto`` of the
``waymo-research/waymo-open-dataset`` repository (field numbers looked up, the schema written here
as a ``FileDescriptorProto``; proto2, enums as ``int32``):

* ``SimulatedTrajectory``: center_x = 2, center_y = 3, center_z = 4, heading = 5 (repeated
  float: m, m, m, rad; one value per simulated step), object_id = 6 (int32 track id).
* ``JointScene``: simulated_trajectories = 1. ``ScenarioRollouts``: scenario_id = 1 (string),
  joint_scenes = 2.
* ``SimAgentsChallengeSubmission``: scenario_rollouts = 1, submission_type = 2
  (1 = SIM_AGENTS_SUBMISSION), account_name = 3, unique_method_name = 4, authors = 5 (repeated
  string), affiliation = 6, description = 7, method_link = 8, uses_lidar_data = 9,
  uses_camera_data = 10, uses_public_model_pretraining = 11, num_model_parameters = 12 (string),
  public_model_names = 13 (repeated string),
  acknowledge_complies_with_closed_loop_requirement = 14.

JSON -> ``Scenario`` mapping (choices, see ``docs/wosac.md``): objects of known type
(vehicle / pedestrian / cyclist) in file order become tracks (``id`` = the JSON ``id``, else the
object's index); ``metadata`` track indices are remapped to the kept tracks; states carry x, y,
heading (radians, after gpusim's unit detection), velocity, length, width from the JSON, z from
``position[t].z`` and height from ``height`` (0 when absent); invalid steps are written as empty
states (``valid`` false, every value 0). Roads become map features (``id`` = JSON ``id``, else the
road's index) with z; a lane's type is its ``map_element_id`` when that is 0..3 (Waymo's lane types,
which GPUDrive's ids reuse), else 2 (surface street); a road edge's type is ``map_element_id - 14``
for 15 / 16 (boundary / median), else 0; road lines get type 0. Signals become 91
``dynamic_map_states`` with the JSON's per-step states and stop points.
"""

from __future__ import annotations

import functools
import pathlib

import numpy as np

from gpusim.config import WOMD_STEPS, RoadType
from gpusim.data.errors import ScenarioError
from gpusim.data.parse import parse_scenario, read_json
from gpusim.data.signals import SignalState
from gpusim.data.womd_proto import build_messages, messages

SUBMISSION_PACKAGE = "gpusim.wosac_submission"
#: ``SimAgentsChallengeSubmission.submission_type`` of a sim-agents submission.
SIM_AGENTS_SUBMISSION = 1

_SUBMISSION_SCHEMA: dict[str, list[tuple]] = {
    "SimulatedTrajectory": [
        ("center_x", 2, "REPEATED", "FLOAT", None), ("center_y", 3, "REPEATED", "FLOAT", None),
        ("center_z", 4, "REPEATED", "FLOAT", None), ("heading", 5, "REPEATED", "FLOAT", None),
        ("object_id", 6, "OPTIONAL", "INT32", None),
    ],
    "JointScene": [("simulated_trajectories", 1, "REPEATED", "MESSAGE", "SimulatedTrajectory")],
    "ScenarioRollouts": [("scenario_id", 1, "OPTIONAL", "STRING", None),
                         ("joint_scenes", 2, "REPEATED", "MESSAGE", "JointScene")],
    "SimAgentsChallengeSubmission": [
        ("scenario_rollouts", 1, "REPEATED", "MESSAGE", "ScenarioRollouts"),
        ("submission_type", 2, "OPTIONAL", "INT32", None), ("account_name", 3, "OPTIONAL", "STRING", None),
        ("unique_method_name", 4, "OPTIONAL", "STRING", None), ("authors", 5, "REPEATED", "STRING", None),
        ("affiliation", 6, "OPTIONAL", "STRING", None), ("description", 7, "OPTIONAL", "STRING", None),
        ("method_link", 8, "OPTIONAL", "STRING", None), ("uses_lidar_data", 9, "OPTIONAL", "BOOL", None),
        ("uses_camera_data", 10, "OPTIONAL", "BOOL", None),
        ("uses_public_model_pretraining", 11, "OPTIONAL", "BOOL", None),
        ("num_model_parameters", 12, "OPTIONAL", "STRING", None),
        ("public_model_names", 13, "REPEATED", "STRING", None),
        ("acknowledge_complies_with_closed_loop_requirement", 14, "OPTIONAL", "BOOL", None),
    ],
}


@functools.lru_cache(maxsize=1)
def submission_messages() -> dict[str, type]:
    """The submission message classes by name (``"SimAgentsChallengeSubmission"``, ...), built
    once per process (:func:`gpusim.data.womd_proto.build_messages`; repeated floats packed)."""
    return build_messages("gpusim_wosac_submission.proto", SUBMISSION_PACKAGE, _SUBMISSION_SCHEMA,
                          packed_floats=True)


def submission_message(rollouts: dict, *, method: str = "gpusim", description: str = ""):
    """Build a ``SimAgentsChallengeSubmission``.

    Args:
        rollouts: ``{scenario_id: (object_id [N] int, states [R, N, 80, 4] float x, y, z, heading)}``.
        method: ``unique_method_name``. description: ``description``.

    Raises:
        ValueError: if a states array is not ``[R, N, 80, 4]`` with N matching the ids, or holds
            non-finite values.
    """
    M = submission_messages()
    sub = M["SimAgentsChallengeSubmission"](submission_type=SIM_AGENTS_SUBMISSION, unique_method_name=method,
                                            description=description)
    for sid, (ids, states) in rollouts.items():
        ids = np.asarray(ids, np.int64)
        states = np.asarray(states, np.float32)
        if states.ndim != 4 or states.shape[1] != len(ids) or states.shape[3] != 4:
            raise ValueError(f"scenario {sid}: states must be [R, {len(ids)}, steps, 4], got {list(states.shape)}")
        if not np.isfinite(states).all():
            raise ValueError(f"scenario {sid}: non-finite simulated states")
        sr = sub.scenario_rollouts.add(scenario_id=str(sid))
        for r in range(states.shape[0]):
            js = sr.joint_scenes.add()
            for n, oid in enumerate(ids):
                s = states[r, n]
                js.simulated_trajectories.add(center_x=s[:, 0].tolist(), center_y=s[:, 1].tolist(),
                                              center_z=s[:, 2].tolist(), heading=s[:, 3].tolist(), object_id=int(oid))
    return sub


def write_submission(path, rollouts: dict, **kw) -> pathlib.Path:
    """Serialize :func:`submission_message` to ``path`` (a ``.binproto`` file) through the atomic
    writer (:func:`gpusim.fileio.write_bytes`: a failed write leaves a previous file whole).
    Returns the path.

    Raises:
        OutputError: the file cannot be written (one line naming it and the cause).
    """
    from gpusim.fileio import write_bytes

    return write_bytes(path, submission_message(rollouts, **kw).SerializeToString())


def read_submission(path) -> dict:
    """Read a submission binproto: ``{scenario_id: (object_id [N] int64, states [R, N, T, 4] float32)}``.

    Raises:
        ScenarioError: if the file cannot be read or parsed, or a scenario's joint scenes differ in
            objects (ids or order) or trajectory lengths.
    """
    from google.protobuf.message import DecodeError

    try:
        data = pathlib.Path(path).read_bytes()
    except OSError as exc:
        raise ScenarioError(path, "", f"cannot read ({exc.strerror or exc})") from None
    sub = submission_messages()["SimAgentsChallengeSubmission"]()
    try:
        sub.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ScenarioError(path, "", f"not a SimAgentsChallengeSubmission protocol buffer ({exc})") from None
    out = {}
    for i, sr in enumerate(sub.scenario_rollouts):
        fld = f"scenario_rollouts[{i}]"
        scenes = []
        ids = None
        for j, js in enumerate(sr.joint_scenes):
            these = [t.object_id for t in js.simulated_trajectories]
            if ids is None:
                ids = these
            elif these != ids:
                raise ScenarioError(path, f"{fld}.joint_scenes[{j}]", "objects differ from joint_scenes[0]")
            try:
                scenes.append(np.array([[t.center_x, t.center_y, t.center_z, t.heading]
                                        for t in js.simulated_trajectories], np.float32).transpose(0, 2, 1))
            except ValueError:
                raise ScenarioError(path, f"{fld}.joint_scenes[{j}]", "trajectories of different lengths") from None
        if not scenes:
            raise ScenarioError(path, fld, "no joint scene")
        shapes = {s.shape for s in scenes}
        if len(shapes) > 1:
            raise ScenarioError(path, fld, f"joint scenes of different shapes {sorted(shapes)}")
        out[sr.scenario_id] = (np.array(ids, np.int64), np.stack(scenes))
    return out


_LANE_TYPES = (0, 1, 2, 3)  # Waymo LaneCenter types; GPUDrive's map_element_id reuses them for lanes
_SURFACE_STREET = 2
_TRACK_TYPE = {0: 1, 1: 2, 2: 3}  # gpusim ObjectType (vehicle, pedestrian, cyclist) -> Track.object_type


def _z(point) -> float:
    v = point.get("z", 0.0) if isinstance(point, dict) else 0.0
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) else 0.0


def _add_tracks(msg, raw, objects):
    for k in range(raw.num_objects):
        src = int(raw.source_index[k])
        obj = objects[src]
        oid = obj.get("id")
        tr = msg.tracks.add(id=int(oid) if isinstance(oid, int) and not isinstance(oid, bool) else src,
                            object_type=_TRACK_TYPE.get(int(raw.obj_type[k]), 4))
        height = obj.get("height", 0.0)
        height = float(height) if isinstance(height, (int, float)) and np.isfinite(height) else 0.0
        pos = obj["position"]
        for t in range(WOMD_STEPS):
            st = tr.states.add()
            if not raw.valid[k, t]:
                continue
            st.center_x, st.center_y = float(raw.pos[k, t, 0]), float(raw.pos[k, t, 1])
            st.center_z = _z(pos[t])
            st.heading = float(raw.heading[k, t])
            st.velocity_x, st.velocity_y = float(raw.vel[k, t, 0]), float(raw.vel[k, t, 1])
            st.length, st.width, st.height = float(raw.length[k]), float(raw.width[k]), height
            st.valid = True


def _add_roads(msg, raw, roads):
    for p in range(len(raw.road_type)):
        road = roads[p]
        rid = int(raw.road_id[p]) if raw.road_id[p] >= 0 else p
        mid = road.get("map_element_id")
        mid = mid if isinstance(mid, int) and not isinstance(mid, bool) else None
        pts = [(float(a), float(b), _z(g)) for (a, b), g in
               zip(raw.road_xy[raw.road_start[p]:raw.road_start[p + 1]], road["geometry"])]
        rt = RoadType(int(raw.road_type[p]))
        feat = msg.map_features.add(id=rid)
        if rt == RoadType.LANE:
            sub = feat.lane
            sub.type = mid if mid in _LANE_TYPES else _SURFACE_STREET
            line = sub.polyline
        elif rt in (RoadType.ROAD_LINE, RoadType.ROAD_EDGE):
            sub = feat.road_line if rt == RoadType.ROAD_LINE else feat.road_edge
            sub.type = (mid - 14) if rt == RoadType.ROAD_EDGE and mid in (15, 16) else 0
            line = sub.polyline
        elif rt == RoadType.STOP_SIGN:
            if pts:
                feat.stop_sign.position.x, feat.stop_sign.position.y, feat.stop_sign.position.z = pts[0]
            else:
                feat.stop_sign.SetInParent()
            continue
        elif rt in (RoadType.CROSSWALK, RoadType.SPEED_BUMP, RoadType.DRIVEWAY):
            line = getattr(feat, rt.name.lower()).polygon
        else:  # unknown road types are not written (no Waymo map feature kind fits)
            del msg.map_features[-1]
            continue
        for x, y, z in pts:
            line.add(x=x, y=y, z=z)


def _add_signals(msg, doc):
    states = [msg.dynamic_map_states.add() for _ in range(WOMD_STEPS)]
    tl = doc.get("tl_states") or {}
    for key in sorted(tl, key=int):
        e = tl[key]
        zs = e.get("z") if isinstance(e.get("z"), list) else None
        for i, t in enumerate(e["time_index"]):
            code = SignalState.from_name(e["state"][i])
            ls = states[t].lane_states.add(lane=int(key), state=int(code if code is not None else 0))
            ls.stop_point.x, ls.stop_point.y = float(e["x"][i]), float(e["y"][i])
            ls.stop_point.z = float(zs[i]) if zs is not None and i < len(zs) else 0.0


def scenario_proto_from_json(path):
    """A ``Scenario`` message (:func:`gpusim.data.womd_proto.messages`) for a JSON scenario file.

    Raises:
        ScenarioError: naming the file and field, for every problem the JSON reader
            (:func:`gpusim.data.parse.parse_scenario`) refuses.
    """
    doc = read_json(path)
    raw = parse_scenario(doc, path)
    msg = messages()["Scenario"](scenario_id=raw.scenario_id, current_time_index=10)
    msg.timestamps_seconds.extend([0.1 * t for t in range(WOMD_STEPS)])
    _add_tracks(msg, raw, doc["objects"])
    where = {int(s): k for k, s in enumerate(raw.source_index)}
    if raw.sdc_source_index in where:
        msg.sdc_track_index = where[raw.sdc_source_index]
    for k in np.flatnonzero(raw.predict):
        msg.tracks_to_predict.add(track_index=int(k), difficulty=0)
    msg.objects_of_interest.extend(int(msg.tracks[k].id) for k in np.flatnonzero(raw.interest))
    _add_roads(msg, raw, doc["roads"])
    _add_signals(msg, doc)
    return msg


def scenario_payloads(path):
    """Yield ``(record_index, payload bytes or ScenarioError)`` of one source file: the records
    of a TFRecord file as they are, or the one ``Scenario`` of a JSON file.

    Raises:
        ScenarioError: if a TFRecord file cannot be opened.
    """
    from gpusim.data.tfrecord import is_tfrecord_file, iter_records

    if is_tfrecord_file(path):
        yield from iter_records(path)
        return
    try:
        yield 0, scenario_proto_from_json(path).SerializeToString()
    except ScenarioError as exc:
        yield 0, exc


def export_scenarios(sources, out) -> tuple[int, list]:
    """Write every readable scenario of ``sources`` (files or directories) as one TFRecord of
    ``Scenario`` protos at ``out`` (atomically; nothing is written when no scenario is readable).
    Returns (scenarios written, list of ``ScenarioError``).

    Raises:
        ScenarioError: if no source file is found. OutputError: ``out`` cannot be written.
    """
    from gpusim.data.convert import expand_sources
    from gpusim.data.tfrecord import write_records

    files, missing = expand_sources(sources)
    errors = [ScenarioError(m.get("file", "?"), "", m.get("reason", "not found")) for m in missing]
    if not files:
        raise ScenarioError(", ".join(map(str, sources)), "", "no scenario file (.json[.gz|.xz] or .tfrecord)")
    payloads = []
    for f in files:
        for _, item in scenario_payloads(f):
            (errors if isinstance(item, ScenarioError) else payloads).append(item)
    if payloads:
        write_records(out, payloads, flag="--out")
    return len(payloads), errors


def export_command(sources, out, *, stdout=None, stderr=None) -> int:
    """``python -m gpusim.data export-proto SRC... --out FILE.tfrecord``: write the ``Scenario``
    protos of ``sources``, print one line per unreadable file or record and a summary.

    Returns:
        0 if at least one scenario was written, 1 if none could be, 2 for a bad ``--out`` or no
        source file.
    """
    import sys

    from gpusim.fileio import OutputError, check_output_path

    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    out = pathlib.Path(out)
    try:
        check_output_path(out, "--out")
        n, errors = export_scenarios(sources, out)
    except (ScenarioError, OutputError) as exc:
        print(f"error: {exc}", file=stderr)
        return 2
    for e in errors:
        print(f"error: {e}", file=stderr)
    if n == 0:
        print("nothing exported; no file written", file=stderr)
        return 1
    print(f"wrote {out}: {n} Scenario proto(s)" + (f", {len(errors)} source(s) skipped" if errors else ""), file=stdout)
    return 0
