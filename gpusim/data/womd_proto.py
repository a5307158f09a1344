"""A minimal schema of Waymo's ``Scenario`` protocol buffer, built at run time (no ``protoc``).

Only the fields gpusim reads are declared; the protobuf runtime skips every other field of a
real WOMD record (it keeps them as unknown fields), so a real record parses with this schema.
Field numbers and meanings follow the public ``scenario.proto`` and ``map.proto`` of the
``waymo-research/waymo-open-dataset`` repository (looked up, not copied: the schema below is
written here as a ``FileDescriptorProto`` in Python). Enums are declared as plain ``int32``
fields (same wire encoding as a proto2 enum), so unknown enum values are kept as numbers.

Declared (message: field = number):

* ``Scenario``: timestamps_seconds = 1 (repeated double), tracks = 2, objects_of_interest = 4
  (repeated int32, track ids), scenario_id = 5, sdc_track_index = 6, dynamic_map_states = 7,
  map_features = 8, current_time_index = 10, tracks_to_predict = 11.
* ``Track``: id = 1, object_type = 2 (0 unset, 1 vehicle, 2 pedestrian, 3 cyclist, 4 other),
  states = 3. ``ObjectState``: center_x = 2, center_y = 3, center_z = 4 (double, m), length = 5,
  width = 6, height = 7 (float, m), heading = 8 (float, rad), velocity_x = 9, velocity_y = 10
  (float, m/s), valid = 11.
* ``RequiredPrediction``: track_index = 1, difficulty = 2.
* ``DynamicMapState``: lane_states = 1. ``TrafficSignalLaneState``: lane = 1 (int64 lane
  feature id), state = 2 (0..8, see :class:`gpusim.data.signals.SignalState`), stop_point = 3.
* ``MapFeature``: id = 1, lane = 3, road_line = 4, road_edge = 5, stop_sign = 7, crosswalk = 8,
  speed_bump = 9, driveway = 10. ``MapPoint``: x = 1, y = 2, z = 3 (double, m).
  ``LaneCenter``: type = 2, polyline = 8. ``RoadLine`` / ``RoadEdge``: type = 1, polyline = 2.
  ``StopSign``: lane = 1 (repeated int64), position = 2. ``Crosswalk`` / ``SpeedBump`` /
  ``Driveway``: polygon = 1.

Use :func:`messages` for the classes (``messages()["Scenario"]``); the tests use the same classes
to write small TFRecords of their own.
"""

from __future__ import annotations

import functools

PACKAGE = "gpusim.womd"

# (name, number, label, type, message type name or None); label/type use descriptor_pb2 names.
_SCHEMA: dict[str, list[tuple]] = {
    "MapPoint": [("x", 1, "OPTIONAL", "DOUBLE", None), ("y", 2, "OPTIONAL", "DOUBLE", None),
                 ("z", 3, "OPTIONAL", "DOUBLE", None)],
    "ObjectState": [
        ("center_x", 2, "OPTIONAL", "DOUBLE", None), ("center_y", 3, "OPTIONAL", "DOUBLE", None),
        ("center_z", 4, "OPTIONAL", "DOUBLE", None), ("length", 5, "OPTIONAL", "FLOAT", None),
        ("width", 6, "OPTIONAL", "FLOAT", None), ("height", 7, "OPTIONAL", "FLOAT", None),
        ("heading", 8, "OPTIONAL", "FLOAT", None), ("velocity_x", 9, "OPTIONAL", "FLOAT", None),
        ("velocity_y", 10, "OPTIONAL", "FLOAT", None), ("valid", 11, "OPTIONAL", "BOOL", None),
    ],
    "Track": [("id", 1, "OPTIONAL", "INT32", None), ("object_type", 2, "OPTIONAL", "INT32", None),
              ("states", 3, "REPEATED", "MESSAGE", "ObjectState")],
    "RequiredPrediction": [("track_index", 1, "OPTIONAL", "INT32", None),
                           ("difficulty", 2, "OPTIONAL", "INT32", None)],
    "TrafficSignalLaneState": [("lane", 1, "OPTIONAL", "INT64", None), ("state", 2, "OPTIONAL", "INT32", None),
                               ("stop_point", 3, "OPTIONAL", "MESSAGE", "MapPoint")],
    "DynamicMapState": [("lane_states", 1, "REPEATED", "MESSAGE", "TrafficSignalLaneState")],
    "LaneCenter": [("type", 2, "OPTIONAL", "INT32", None), ("polyline", 8, "REPEATED", "MESSAGE", "MapPoint")],
    "RoadLine": [("type", 1, "OPTIONAL", "INT32", None), ("polyline", 2, "REPEATED", "MESSAGE", "MapPoint")],
    "RoadEdge": [("type", 1, "OPTIONAL", "INT32", None), ("polyline", 2, "REPEATED", "MESSAGE", "MapPoint")],
    "StopSign": [("lane", 1, "REPEATED", "INT64", None), ("position", 2, "OPTIONAL", "MESSAGE", "MapPoint")],
    "Crosswalk": [("polygon", 1, "REPEATED", "MESSAGE", "MapPoint")],
    "SpeedBump": [("polygon", 1, "REPEATED", "MESSAGE", "MapPoint")],
    "Driveway": [("polygon", 1, "REPEATED", "MESSAGE", "MapPoint")],
    "MapFeature": [
        ("id", 1, "OPTIONAL", "INT64", None), ("lane", 3, "OPTIONAL", "MESSAGE", "LaneCenter"),
        ("road_line", 4, "OPTIONAL", "MESSAGE", "RoadLine"), ("road_edge", 5, "OPTIONAL", "MESSAGE", "RoadEdge"),
        ("stop_sign", 7, "OPTIONAL", "MESSAGE", "StopSign"), ("crosswalk", 8, "OPTIONAL", "MESSAGE", "Crosswalk"),
        ("speed_bump", 9, "OPTIONAL", "MESSAGE", "SpeedBump"), ("driveway", 10, "OPTIONAL", "MESSAGE", "Driveway"),
    ],
    "Scenario": [
        ("timestamps_seconds", 1, "REPEATED", "DOUBLE", None), ("tracks", 2, "REPEATED", "MESSAGE", "Track"),
        ("objects_of_interest", 4, "REPEATED", "INT32", None), ("scenario_id", 5, "OPTIONAL", "STRING", None),
        ("sdc_track_index", 6, "OPTIONAL", "INT32", None),
        ("dynamic_map_states", 7, "REPEATED", "MESSAGE", "DynamicMapState"),
        ("map_features", 8, "REPEATED", "MESSAGE", "MapFeature"),
        ("current_time_index", 10, "OPTIONAL", "INT32", None),
        ("tracks_to_predict", 11, "REPEATED", "MESSAGE", "RequiredPrediction"),
    ],
}

#: The ``MapFeature`` fields that form its one-of, in declaration order.
FEATURE_KINDS = ("lane", "road_line", "road_edge", "stop_sign", "crosswalk", "speed_bump", "driveway")


def _import_protobuf():
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:  # pragma: no cover - protobuf is a declared dependency
        raise ImportError(
            "reading WOMD TFRecord files needs the 'protobuf' package: pip install protobuf crc32c"
        ) from None
    return descriptor_pb2, descriptor_pool, message_factory


def build_messages(file_name: str, package: str, schema: dict, oneofs: dict | None = None,
                   packed_floats: bool = False) -> dict[str, type]:
    """Message classes from a schema table, built in a private descriptor pool (so they never clash
    with another definition of the same protos loaded in the same process).

    Args:
        file_name, package: the ``.proto`` file name and package the descriptors are declared in.
        schema: ``{message name: [(field name, number, label, type, referenced message or None)]}``
            with ``label`` in ``OPTIONAL``/``REPEATED``/... and ``type`` in ``FLOAT``/``MESSAGE``/...
        oneofs: ``{message name: (one-of name, field names)}``: fields grouped into one one-of.
        packed_floats: declare repeated float fields packed (proto2 default: unpacked).

    Returns:
        ``{message name: class}``.

    Raises:
        ImportError: with a one-line install hint if ``protobuf`` is missing.
    """
    descriptor_pb2, descriptor_pool, message_factory = _import_protobuf()
    fdp = descriptor_pb2.FileDescriptorProto(name=file_name, package=package, syntax="proto2")
    F = descriptor_pb2.FieldDescriptorProto
    for msg_name, fields in schema.items():
        msg = fdp.message_type.add(name=msg_name)
        for name, number, label, typ, ref in fields:
            f = msg.field.add(name=name, number=number, label=getattr(F, "LABEL_" + label),
                              type=getattr(F, "TYPE_" + typ))
            if ref is not None:
                f.type_name = f".{package}.{ref}"
            if packed_floats and label == "REPEATED" and typ == "FLOAT":
                f.options.packed = True
        if msg_name in (oneofs or {}):
            oneof_name, members = oneofs[msg_name]
            msg.oneof_decl.add(name=oneof_name)
            for f in msg.field:
                if f.name in members:
                    f.oneof_index = len(msg.oneof_decl) - 1
    pool = descriptor_pool.DescriptorPool()
    fd = pool.Add(fdp)
    fd = pool.FindFileByName(fdp.name) if fd is None else fd
    get = getattr(message_factory, "GetMessageClass", None)  # protobuf >= 4.22
    if get is None:  # pragma: no cover - older protobuf
        get = message_factory.MessageFactory(pool).GetPrototype
    return {name: get(pool.FindMessageTypeByName(f"{package}.{name}")) for name in schema}


@functools.lru_cache(maxsize=1)
def messages() -> dict[str, type]:
    """The message classes of the schema, by name (``"Scenario"``, ``"Track"``, ...), built once per
    process (:func:`build_messages`; the map feature kinds form a one-of, as in map.proto).

    Raises:
        ImportError: with a one-line install hint if ``protobuf`` is missing.
    """
    return build_messages("gpusim_womd_scenario.proto", PACKAGE, _SCHEMA,
                          oneofs={"MapFeature": ("feature_data", FEATURE_KINDS)})
