"""Read and validate one WOMD scenario in the GPUDrive/PufferDrive JSON layout.

The layout (as written by GPUDrive's WOMD converter and read by PufferDrive):

* ``objects``: list of tracks with ``position`` (91 ``{x, y[, z]}``), ``heading`` (91 floats, radians or degrees — decided per file by :func:`heading_units_of`),
  ``velocity`` (91 ``{x, y}``, m/s), ``valid`` (91 bools), ``width``, ``length`` (m),
  ``goalPosition`` (``{x, y[, z]}``, the last valid logged position), ``type`` (``"vehicle"``,
  ``"pedestrian"``, ``"cyclist"``, ...). One schema variant also has ``id``, ``height`` and
  ``mark_as_expert``; the other has none of them (``mark_as_expert`` then defaults to false).
* ``roads``: list of polylines with ``geometry`` (list of ``{x, y[, z]}``) and ``type``
  (``"lane"``, ``"road_line"``, ``"road_edge"``, ``"stop_sign"``, ``"crosswalk"``,
  ``"speed_bump"``, ``"driveway"``); one variant also has ``id`` and ``map_element_id``.
* optional ``name``, ``scenario_id``, ``tl_states`` (traffic-signal states per lane, read by
  :func:`gpusim.data.signals.parse_json_signals`) and ``metadata`` (its ``sdc_track_index`` is
  the index of the self-driving car in ``objects``; ``objects_of_interest`` lists object ``id``s,
  ``tracks_to_predict`` ``{track_index, difficulty}`` entries, as in Waymo's protos).

Invalid track steps hold sentinel coordinates (usually -10000, sometimes 0): only ``valid`` is
trusted. Every problem raises :class:`~gpusim.data.errors.ScenarioError` naming the file and field.
"""

from __future__ import annotations

import collections
import gzip
import json
import lzma
import math
import pathlib
from dataclasses import dataclass, field

import numpy as np

from gpusim.config import WOMD_STEPS, ObjectType, RoadType
from gpusim.data.errors import ScenarioError
from gpusim.data.signals import RawSignals, parse_json_signals

#: File name endings accepted as scenario files.
SCENARIO_SUFFIXES = (".json", ".json.gz", ".json.xz")

_OBJECT_TYPES = {"vehicle": ObjectType.VEHICLE, "pedestrian": ObjectType.PEDESTRIAN, "cyclist": ObjectType.CYCLIST}
_ROAD_TYPES = {m.name.lower(): m for m in RoadType}


def is_scenario_file(path) -> bool:
    """True if ``path``'s name ends with ``.json``, ``.json.gz`` or ``.json.xz``."""
    name = pathlib.Path(path).name.lower()
    return name.endswith(SCENARIO_SUFFIXES)


def scenario_stem(path) -> str:
    """File name without the ``.json[.gz|.xz]`` ending."""
    name = pathlib.Path(path).name
    for suf in (".json.gz", ".json.xz", ".json"):
        if name.lower().endswith(suf):
            return name[: -len(suf)]
    return name


def read_json(path) -> dict:
    """Load the JSON document of a ``.json``, ``.json.gz`` or ``.json.xz`` file.

    Raises:
        ScenarioError: (field ``""``) if the file is missing, unreadable, truncated, not valid
            JSON, or its top level is not a JSON object.
    """
    path = pathlib.Path(path)
    name = path.name.lower()
    opener = gzip.open if name.endswith(".gz") else lzma.open if name.endswith(".xz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise ScenarioError(path, "", "no such file") from None
    except (EOFError, lzma.LZMAError, gzip.BadGzipFile, OSError) as exc:
        raise ScenarioError(path, "", f"cannot decompress/read file ({type(exc).__name__}: {exc})") from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(path, "", f"not UTF-8 text ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ScenarioError(path, "", f"invalid or truncated JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ScenarioError(path, "", f"top level is a JSON {type(doc).__name__}, expected an object")
    return doc


@dataclass
class RawScenario:
    """One validated scenario, in world coordinates (float64 numpy), objects of known type only.

    N objects (vehicle/pedestrian/cyclist, file order), T = 91 steps, P road polylines.

    Attributes:
        file: source path.
        scenario_id: ``scenario_id`` from the JSON, else ``name`` without ``.json``, else the file stem.
        pos: [N, T, 2] float64 logged centre positions (m); 0 at invalid steps.
        heading: [N, T] float64 heading (rad, wrapped to [-pi, pi)); 0 at invalid steps.
        vel: [N, T, 2] float64 velocity (m/s); 0 at invalid steps.
        valid: [N, T] bool.
        obj_type: [N] int8 :class:`ObjectType` codes.
        length, width: [N] float64 box size (m).
        goal: [N, 2] float64 ``goalPosition`` (m).
        expert: [N] bool ``mark_as_expert`` (false when absent).
        source_index: [N] int64 index of each object in the file's ``objects`` list.
        sdc_source_index: index in ``objects`` of the self-driving car (``metadata.sdc_track_index``),
            -1 when unknown.
        road_xy: [Q, 2] float64 all road polyline points, concatenated.
        road_start: [P + 1] int64 polyline ``p`` is ``road_xy[road_start[p]:road_start[p + 1]]``.
        road_type: [P] int8 :class:`RoadType` codes (unknown names map to ``OTHER``).
        road_id: [P] int64 map-feature id of each polyline (JSON ``id``; -1 when absent).
        interest: [N] bool object is in ``objects_of_interest``.
        predict: [N] bool object is in ``tracks_to_predict``.
        signals: the traffic-signal states (:class:`RawSignals`, world coordinates).
        ignored_objects: count of objects of other types, by type name.
        unknown_road_types: count of polylines whose type mapped to ``OTHER``, by type name.
        dropped_objects: the objects left out for a box size that is not a finite number > 0 at
            an object valid at some step (:data:`BAD_SIZE`), one ``{"field", "reason"}`` each
            (``field`` e.g. ``objects[3].width``); the rest of the scenario is kept.
    """

    file: str
    scenario_id: str
    pos: np.ndarray
    heading: np.ndarray
    vel: np.ndarray
    valid: np.ndarray
    obj_type: np.ndarray
    length: np.ndarray
    width: np.ndarray
    goal: np.ndarray
    expert: np.ndarray
    source_index: np.ndarray
    sdc_source_index: int
    road_xy: np.ndarray
    road_start: np.ndarray
    road_type: np.ndarray
    road_id: np.ndarray | None = None
    interest: np.ndarray | None = None
    predict: np.ndarray | None = None
    signals: RawSignals | None = None
    ignored_objects: dict = field(default_factory=dict)
    unknown_road_types: dict = field(default_factory=dict)
    dropped_objects: list = field(default_factory=list)

    def __post_init__(self):
        n, p, t = self.pos.shape[0], self.road_type.shape[0], self.pos.shape[1]
        if self.road_id is None:
            self.road_id = np.full(p, -1, np.int64)
        if self.interest is None:
            self.interest = np.zeros(n, bool)
        if self.predict is None:
            self.predict = np.zeros(n, bool)
        if self.signals is None:
            self.signals = RawSignals.empty(t)

    @property
    def num_objects(self) -> int:
        """N."""
        return int(self.pos.shape[0])


def _points(seq, file, fld, *, n=None, allow_nonfinite=False) -> np.ndarray:
    """[len, 2] float64 from a list of {x, y, ...} dicts."""
    if not isinstance(seq, list):
        raise ScenarioError(file, fld, f"expected a list, got {type(seq).__name__}")
    if n is not None and len(seq) != n:
        raise ScenarioError(file, fld, f"{len(seq)} entries, expected {n}")
    try:
        arr = np.array([(p["x"], p["y"]) for p in seq], dtype=np.float64).reshape(len(seq), 2)
    except (TypeError, KeyError, ValueError):
        bad = next(
            (i for i, p in enumerate(seq) if not (isinstance(p, dict) and _num(p.get("x")) and _num(p.get("y")))), 0
        )
        raise ScenarioError(file, f"{fld}[{bad}]", "expected an object with numeric 'x' and 'y'") from None
    return arr


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _numbers(seq, file, fld, n) -> np.ndarray:
    if not isinstance(seq, list):
        raise ScenarioError(file, fld, f"expected a list, got {type(seq).__name__}")
    if len(seq) != n:
        raise ScenarioError(file, fld, f"{len(seq)} entries, expected {n}")
    try:
        arr = np.array(seq, dtype=np.float64)
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.shape != (n,) or any(isinstance(v, bool) or v is None for v in seq):
        bad = next((i for i, v in enumerate(seq) if not _num(v)), 0)
        raise ScenarioError(file, f"{fld}[{bad}]", f"expected a number, got {seq[bad]!r}")
    return arr


def _size(obj, key, file, fld) -> float:
    """A box size (``width`` / ``length``, m) as stored, non-finite or non-positive values
    included (the caller drops such an object, :func:`bad_size_reason`).

    Raises:
        ScenarioError: the key is missing or its value is not a number.
    """
    if key not in obj:
        raise ScenarioError(file, fld, "missing")
    v = obj[key]
    if not _num(v):
        raise ScenarioError(file, fld, f"expected a number, got {v!r}")
    return float(v)


#: Why an object is dropped for its box size (the reason of a ``dropped_objects`` entry).
BAD_SIZE = "box size must be a finite number > 0; the object is dropped, the scenario kept"


def bad_size_reason(width: float, length: float) -> str | None:
    """None when both box sizes (m) are finite and > 0; else the reason an object with them is
    dropped, naming the bad values (e.g. ``"width 0.0: box size must be ..."``)."""
    bad = [f"{k} {v!r}" for k, v in (("width", width), ("length", length)) if not (math.isfinite(v) and v > 0)]
    return f"{', '.join(bad)}: {BAD_SIZE}" if bad else None


def _check_finite(arr, valid, file, fld):
    """Raise if ``arr`` has a non-finite number at a valid step."""
    bad = ~np.isfinite(arr)
    if arr.ndim == 2:
        bad = bad.any(axis=1)
    bad &= valid
    if bad.any():
        t = int(np.flatnonzero(bad)[0])
        raise ScenarioError(file, f"{fld}[{t}]", f"non-finite value at a valid step ({int(bad.sum())} such steps)")


def heading_units_of(pos: np.ndarray, heading: np.ndarray, valid: np.ndarray) -> str:
    """Decide whether a file's ``heading`` values are radians or degrees: ``"rad"`` or ``"deg"``.

    The published GPUDrive/PufferDrive JSON files are not consistent: of the 72 shared WOMD
    scenarios, 66 store headings in degrees and 6 in radians (measured by comparing the logged
    heading with the direction of motion). The unit is decided once per file: at valid steps where
    the object moves more than 0.5 m before the next valid step, the logged heading is compared
    with the direction of motion under both readings, and the reading with the smaller median
    angular error wins. Without such steps, any ``|heading| > 2 pi`` means degrees.

    Args:
        pos: [N, T, 2] float64 positions (m); heading: [N, T] raw headings; valid: [N, T] bool.
    """
    step = pos[:, 1:] - pos[:, :-1]
    moving = valid[:, 1:] & valid[:, :-1] & (np.hypot(step[..., 0], step[..., 1]) > 0.5)
    if moving.any():
        motion = np.arctan2(step[..., 1], step[..., 0])[moving]
        raw = heading[:, :-1][moving]

        def err(h):
            return np.median(np.abs(np.remainder(motion - h + np.pi, 2 * np.pi) - np.pi))

        return "deg" if err(np.deg2rad(raw)) < err(raw) else "rad"
    return "deg" if np.abs(heading[valid]).max(initial=0.0) > 2 * np.pi else "rad"


def parse_scenario(doc: dict, file) -> RawScenario:
    """Validate a loaded JSON document and convert it to a :class:`RawScenario`.

    The work is split into helpers, called in this order (so the first problem found is the one
    reported): :func:`_check_top_level`, :func:`_scenario_id`, :func:`_parse_objects` (per object
    :func:`_object_type`, :func:`_parse_track`, :func:`_parse_goal`, :func:`_parse_expert`),
    :func:`_wrap_headings`, :func:`_sdc_index`, :func:`_metadata_flags`, :func:`_parse_roads`,
    then :func:`gpusim.data.signals.parse_json_signals`.

    Args:
        doc: the JSON top-level object (as returned by :func:`read_json`).
        file: path used in error messages and stored in the result.

    Raises:
        ScenarioError: naming ``file`` and the field: missing ``objects``/``roads`` (or not lists);
            an object that is not a JSON object; an object without ``type``, ``width``, ``length``,
            ``goalPosition``, ``position``, ``heading``, ``velocity`` or ``valid``; per-step arrays
            without exactly 91 entries; non-numeric entries (non-boolean ``valid`` entries or
            ``mark_as_expert``, a ``width`` / ``length`` that is not a number); non-finite numbers
            at valid steps; non-finite goal; a road without a list ``geometry`` or with non-finite
            points; ``metadata.sdc_track_index`` out of range; ``metadata.objects_of_interest`` /
            ``tracks_to_predict`` not lists, or a ``tracks_to_predict`` entry without a valid
            ``track_index``; malformed ``tl_states``.
    """
    file = str(file)
    T = WOMD_STEPS
    objects, roads = _check_top_level(doc, file)
    sid = _scenario_id(doc, file)
    obj = _parse_objects(objects, file, T)
    meta = doc.get("metadata")
    sdc = _sdc_index(meta, objects, file)
    interest, predict = _metadata_flags(meta, objects, obj["source_index"], file)
    pts, rtypes, starts, rids, unknown_roads = _parse_roads(roads, file)

    return RawScenario(
        file=file,
        scenario_id=sid,
        pos=obj["pos"],
        heading=obj["heading"],
        vel=obj["vel"],
        valid=obj["valid"],
        obj_type=obj["obj_type"],
        length=obj["length"],
        width=obj["width"],
        goal=obj["goal"],
        expert=obj["expert"],
        source_index=np.array(obj["source_index"], dtype=np.int64),
        sdc_source_index=sdc,
        road_xy=np.concatenate(pts) if pts else np.zeros((0, 2)),
        road_start=np.array(starts, dtype=np.int64),
        road_type=np.array(rtypes, dtype=np.int8),
        road_id=np.array(rids, dtype=np.int64),
        interest=interest,
        predict=predict,
        signals=parse_json_signals(doc.get("tl_states"), file, T),
        ignored_objects=obj["ignored"],
        unknown_road_types=dict(unknown_roads),
        dropped_objects=obj["dropped"],
    )


def _check_top_level(doc: dict, file: str) -> tuple[list, list]:
    """The ``objects`` and ``roads`` lists of ``doc``.

    Raises:
        ScenarioError: (field ``objects`` / ``roads``) if either is missing or not a list.
    """
    for key in ("objects", "roads"):
        if key not in doc:
            raise ScenarioError(file, key, "missing")
        if not isinstance(doc[key], list):
            raise ScenarioError(file, key, f"expected a list, got {type(doc[key]).__name__}")
    return doc["objects"], doc["roads"]


def _scenario_id(doc: dict, file: str) -> str:
    """``scenario_id``, else ``name``, else the file stem; a trailing ``.json`` is removed."""
    sid = doc.get("scenario_id") or doc.get("name") or scenario_stem(file)
    return scenario_stem(str(sid)) if str(sid).endswith(".json") else str(sid)


def _parse_objects(objects: list, file: str, T: int) -> dict:
    """Validate the ``objects`` list and keep those of known type (vehicle/pedestrian/cyclist).

    Returns:
        dict with, for the N kept objects in file order: ``pos`` [N, T, 2], ``heading`` [N, T]
        (rad, wrapped to [-pi, pi)), ``vel`` [N, T, 2] float64 (all 0 at invalid steps), ``valid``
        [N, T] bool, ``obj_type`` [N] int8, ``length``, ``width`` [N] float64 (m), ``goal`` [N, 2]
        float64 (m), ``expert`` [N] bool, ``source_index`` (list of N ints, index in ``objects``),
        ``ignored`` (dict: count of skipped objects by type name) and ``dropped`` (list of
        ``{"field", "reason"}``: objects valid at some step whose width or length is not a finite
        number > 0, left out; such an object never valid is kept as read and dropped by the
        builder with the other never-valid objects).

    Raises:
        ScenarioError: for any invalid kept object (see :func:`parse_scenario`).
    """
    ignored: collections.Counter = collections.Counter()
    dropped: list[dict] = []
    pos_l, head_l, vel_l, valid_l = [], [], [], []
    types, lengths, widths, goals, experts, src = [], [], [], [], [], []
    for i, obj in enumerate(objects):
        f = f"objects[{i}]"
        otype = _object_type(obj, f, file)
        if otype is None:
            ignored[str(obj["type"])] += 1
            continue
        pos, heading, vel, valid = _parse_track(obj, f, file, T)
        width = _size(obj, "width", file, f + ".width")
        length = _size(obj, "length", file, f + ".length")
        why = bad_size_reason(width, length)
        if why is not None and valid.any():  # never valid: the builder drops it with the other never-valid objects
            dropped.append({"field": f, "reason": why})
            continue
        goal = _parse_goal(obj, f, file)
        exp = _parse_expert(obj, f, file)

        inv = ~valid
        pos[inv] = 0.0
        heading[inv] = 0.0
        vel[inv] = 0.0
        pos_l.append(pos)
        head_l.append(heading)
        vel_l.append(vel)
        valid_l.append(valid)
        types.append(int(otype))
        lengths.append(length)
        widths.append(width)
        goals.append(goal)
        experts.append(exp)
        src.append(i)

    n = len(src)
    if n:
        head_l = _wrap_headings(pos_l, head_l, valid_l)
    return {
        "pos": np.stack(pos_l) if n else np.zeros((0, T, 2)),
        "heading": np.stack(head_l) if n else np.zeros((0, T)),
        "vel": np.stack(vel_l) if n else np.zeros((0, T, 2)),
        "valid": np.stack(valid_l) if n else np.zeros((0, T), dtype=bool),
        "obj_type": np.array(types, dtype=np.int8),
        "length": np.array(lengths, dtype=np.float64),
        "width": np.array(widths, dtype=np.float64),
        "goal": np.array(goals, dtype=np.float64).reshape(n, 2),
        "expert": np.array(experts, dtype=bool),
        "source_index": src,
        "ignored": dict(ignored),
        "dropped": dropped,
    }


def _object_type(obj, f: str, file: str):
    """The :class:`ObjectType` of object ``obj`` (field prefix ``f``), or None for other types
    (vehicle/pedestrian/cyclist names are matched case-insensitively; non-strings are ignored).

    Raises:
        ScenarioError: if ``obj`` is not a JSON object or has no ``type``.
    """
    if not isinstance(obj, dict):
        raise ScenarioError(file, f, f"expected an object, got {type(obj).__name__}")
    if "type" not in obj:
        raise ScenarioError(file, f + ".type", "missing")
    tname = obj["type"]
    return _OBJECT_TYPES.get(str(tname).lower()) if isinstance(tname, str) else None


def _parse_track(obj: dict, f: str, file: str, T: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The logged track of one object: ``pos`` [T, 2] (m), raw ``heading`` [T] (file units),
    ``vel`` [T, 2] (m/s) float64, as in the file (sentinels at invalid steps), and ``valid`` [T] bool.

    Raises:
        ScenarioError: a missing ``position``/``heading``/``velocity``/``valid``; ``valid`` not a
            list of T booleans; per-step arrays without T entries or with non-numeric entries;
            non-finite numbers at valid steps.
    """
    for key in ("position", "heading", "velocity", "valid"):
        if key not in obj:
            raise ScenarioError(file, f"{f}.{key}", "missing")
    valid = obj["valid"]
    if not isinstance(valid, list):
        raise ScenarioError(file, f + ".valid", f"expected a list, got {type(valid).__name__}")
    if len(valid) != T:
        raise ScenarioError(file, f + ".valid", f"{len(valid)} entries, expected {T}")
    if not all(isinstance(v, (bool, int)) for v in valid):
        bad = next(k for k, v in enumerate(valid) if not isinstance(v, (bool, int)))
        raise ScenarioError(file, f"{f}.valid[{bad}]", f"expected a boolean, got {valid[bad]!r}")
    valid = np.array(valid, dtype=bool)
    pos = _points(obj["position"], file, f + ".position", n=T)
    heading = _numbers(obj["heading"], file, f + ".heading", T)
    vel = _points(obj["velocity"], file, f + ".velocity", n=T)
    _check_finite(pos, valid, file, f + ".position")
    _check_finite(heading, valid, file, f + ".heading")
    _check_finite(vel, valid, file, f + ".velocity")
    return pos, heading, vel, valid


def _parse_goal(obj: dict, f: str, file: str) -> tuple[float, float]:
    """``goalPosition`` (x, y) in m.

    Raises:
        ScenarioError: if missing, not an object with numeric ``x`` and ``y``, or non-finite.
    """
    if "goalPosition" not in obj:
        raise ScenarioError(file, f + ".goalPosition", "missing")
    g = obj["goalPosition"]
    if not (isinstance(g, dict) and _num(g.get("x")) and _num(g.get("y"))):
        raise ScenarioError(file, f + ".goalPosition", "expected an object with numeric 'x' and 'y'")
    if not (math.isfinite(g["x"]) and math.isfinite(g["y"])):
        raise ScenarioError(file, f + ".goalPosition", "non-finite coordinates")
    return float(g["x"]), float(g["y"])


def _parse_expert(obj: dict, f: str, file: str) -> bool:
    """``mark_as_expert`` (false when absent).

    Raises:
        ScenarioError: if present and not a boolean (or int).
    """
    exp = obj.get("mark_as_expert", False)
    if not isinstance(exp, (bool, int)):
        raise ScenarioError(file, f + ".mark_as_expert", f"expected a boolean, got {exp!r}")
    return bool(exp)


def _wrap_headings(pos_l: list, head_l: list, valid_l: list) -> list:
    """Headings in rad wrapped to [-pi, pi): the file's unit is decided once for all objects by
    :func:`heading_units_of` (lists of per-object [T, 2] positions, [T] raw headings, [T] valid)."""
    heading_units = heading_units_of(np.stack(pos_l), np.stack(head_l), np.stack(valid_l))
    scale = np.pi / 180.0 if heading_units == "deg" else 1.0
    return [np.remainder(h * scale + np.pi, 2 * np.pi) - np.pi for h in head_l]


def _sdc_index(meta, objects: list, file: str) -> int:
    """``metadata.sdc_track_index`` (index into ``objects``), -1 when absent or null.

    Raises:
        ScenarioError: if it is not an int in ``[0, len(objects))``.
    """
    if not (isinstance(meta, dict) and meta.get("sdc_track_index") is not None):
        return -1
    v = meta["sdc_track_index"]
    if not (isinstance(v, int) and not isinstance(v, bool)) or not 0 <= v < len(objects):
        raise ScenarioError(
            file, "metadata.sdc_track_index", f"{v!r} is not an index into the {len(objects)} objects"
        )
    return int(v)


def _parse_roads(roads: list, file) -> tuple[list, list, list, list, collections.Counter]:
    """Validate the ``roads`` list: polylines (``[len, 2]`` float64), type codes, start offsets,
    map ids (-1 when absent) and the count of unknown type names."""
    unknown_roads: collections.Counter = collections.Counter()
    pts, rtypes, starts, rids = [], [], [0], []
    for j, road in enumerate(roads):
        f = f"roads[{j}]"
        if not isinstance(road, dict):
            raise ScenarioError(file, f, f"expected an object, got {type(road).__name__}")
        if "geometry" not in road:
            raise ScenarioError(file, f + ".geometry", "missing")
        xy = _points(road["geometry"], file, f + ".geometry")
        if not np.isfinite(xy).all():
            k = int(np.flatnonzero(~np.isfinite(xy).all(axis=1))[0])
            raise ScenarioError(file, f"{f}.geometry[{k}]", "non-finite coordinates")
        tname = road.get("type")
        if isinstance(tname, str) and tname.lower() in _ROAD_TYPES:
            rt = _ROAD_TYPES[tname.lower()]
        elif isinstance(tname, int) and not isinstance(tname, bool) and 0 <= tname < len(RoadType):
            rt = RoadType(tname)
        else:
            rt = RoadType.OTHER
            unknown_roads[str(tname)] += 1
        rid = road.get("id")
        rids.append(int(rid) if isinstance(rid, int) and not isinstance(rid, bool) else -1)
        pts.append(xy)
        rtypes.append(int(rt))
        starts.append(starts[-1] + len(xy))
    return pts, rtypes, starts, rids, unknown_roads


def _metadata_flags(meta, objects, src, file) -> tuple[np.ndarray, np.ndarray]:
    """[N] bool ``interest`` (object ``id`` in ``metadata.objects_of_interest``) and ``predict``
    (``objects`` index in ``metadata.tracks_to_predict[*].track_index``) of the kept objects."""
    n = len(src)
    interest, predict = np.zeros(n, bool), np.zeros(n, bool)
    if not isinstance(meta, dict):
        return interest, predict
    ooi = meta.get("objects_of_interest") or []
    ttp = meta.get("tracks_to_predict") or []
    if not isinstance(ooi, list) or not isinstance(ttp, list):
        raise ScenarioError(file, "metadata", "objects_of_interest / tracks_to_predict must be lists")
    ids = {v for v in ooi if isinstance(v, int)}
    pred = set()
    for k, e in enumerate(ttp):
        ti = e.get("track_index") if isinstance(e, dict) else None
        if not (isinstance(ti, int) and 0 <= ti < len(objects)):
            raise ScenarioError(file, f"metadata.tracks_to_predict[{k}].track_index", f"{ti!r} is not an object index")
        pred.add(ti)
    for j, i in enumerate(src):
        interest[j] = objects[i].get("id") in ids
        predict[j] = i in pred
    return interest, predict


def read_scenario(path) -> RawScenario:
    """:func:`read_json` then :func:`parse_scenario`. Raises :class:`ScenarioError`."""
    return parse_scenario(read_json(path), path)
