"""WOMD scenario data: parse GPUDrive/PufferDrive JSON, validate, select agents, build roads and
the nearest-segment grid, and pack many scenarios into padded tensors (:class:`ScenarioPack`)."""

from gpusim.data.pack import ScenarioPack

__all__ = ["ScenarioPack"]
