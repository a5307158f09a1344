"""Scenario files (WOMD TFRecord or GPUDrive JSON) as :class:`~gpusim.wosac.scene.WosacScene` s.

Both go through a ``Scenario`` protocol buffer (JSON via
:func:`gpusim.data.proto_export.scenario_proto_from_json`), so gpusim scores exactly the scenario
that ``python -m gpusim.data export-proto`` writes for Waymo's scorer.
"""

from __future__ import annotations

from gpusim.data.errors import ScenarioError
from gpusim.data.proto_export import scenario_payloads
from gpusim.data.womd_proto import messages
from gpusim.wosac.scene import SceneSkipped, WosacScene, scene_from_proto


def load_scenes(sources, *, limit: int | None = None) -> tuple[list[WosacScene], list[tuple[str, str]]]:
    """Read every scenario of ``sources`` (files, directories or glob patterns).

    Returns:
        ``(scenes, skipped)``; ``skipped`` lists ``(name, one-line reason)`` for unreadable files
        or records and for scenarios WOSAC cannot score (:class:`SceneSkipped` reasons).

    Raises:
        ScenarioError: if no scenario file is found at all.
    """
    from gpusim.data.convert import expand_sources

    files, missing = expand_sources(sources)
    skipped = [(m["file"], m["reason"]) for m in missing]
    if not files:
        raise ScenarioError(", ".join(map(str, sources)) if not isinstance(sources, str) else sources, "",
                            "no scenario file (.json[.gz|.xz] or .tfrecord)")
    scenes = []
    for f in files:
        for index, item in scenario_payloads(f):
            name = f if index == 0 and not str(f).lower().count(".tfrecord") else f"{f}#record[{index}]"
            if isinstance(item, ScenarioError):
                skipped.append((name, str(item)))
                continue
            msg = messages()["Scenario"]()
            msg.ParseFromString(item)
            try:
                scenes.append(scene_from_proto(msg))
            except SceneSkipped as exc:
                skipped.append((f"{name} ({msg.scenario_id})", str(exc)))
            if limit is not None and len(scenes) >= limit:
                return scenes, skipped
    return scenes, skipped
