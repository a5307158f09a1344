"""WOMD scenario data: parse GPUDrive/PufferDrive JSON, validate, select agents, build roads and
the nearest-segment grid, and pack many scenarios into padded tensors (:class:`ScenarioPack`).

Entry points: ``ScenarioPack.from_json(paths, config)``, :func:`load_scenario` (one file),
``ScenarioPack.load(dir_or_pt)``, and the CLI ``python -m gpusim.data convert|info``.
"""

from gpusim.data.build import ScenarioData, convert, expand_sources, load_scenario, pack_scenarios
from gpusim.data.errors import NoControllableAgentError, ScenarioError
from gpusim.data.pack import ScenarioPack

__all__ = [
    "ScenarioPack",
    "ScenarioData",
    "ScenarioError",
    "NoControllableAgentError",
    "load_scenario",
    "convert",
    "expand_sources",
    "pack_scenarios",
]
