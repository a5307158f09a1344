"""WOMD scenario data: read GPUDrive/PufferDrive JSON or Waymo's own TFRecord files of
``Scenario`` protos (no TensorFlow), validate, select agents, build roads, the nearest-segment
grid and traffic-signal states, and pack many scenarios into padded tensors (:class:`ScenarioPack`).

Entry points: ``ScenarioPack.from_json(paths, config)`` (JSON and TFRecord sources alike),
:func:`load_scenario` (one JSON file), ``ScenarioPack.load(dir_or_pt)``, and the CLI
``python -m gpusim.data convert|info``.

Module layering (no cycles): ``errors`` ← ``signals``, ``tfrecord``, ``womd_proto`` ← ``parse``,
``parse_proto`` ← ``roads``, ``grid_tables`` ← ``build`` ← ``convert`` ← ``pack`` ← ``__main__``;
``integrity`` (checksums, invariants, dataset directories; imports ``signals``, and ``tfrecord``
lazily) ← ``convert``, ``pack_file`` ← ``pack`` ← ``shards`` ← ``pool``.
"""

from gpusim.data.build import ScenarioData, load_scenario
from gpusim.data.convert import convert_sources, expand_sources
from gpusim.data.errors import NoControllableAgentError, PackFileError, ScenarioError
from gpusim.data.pack import ScenarioPack, convert, pack_scenarios
from gpusim.data.signals import SignalState

__all__ = [
    "ScenarioPack",
    "ScenarioData",
    "ScenarioError",
    "NoControllableAgentError",
    "PackFileError",
    "SignalState",
    "load_scenario",
    "convert",
    "convert_sources",
    "expand_sources",
    "pack_scenarios",
]
