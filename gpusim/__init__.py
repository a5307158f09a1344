"""gpusim: a multi-agent driving simulator whose whole state lives in torch tensors on one device.

Subpackages: ``gpusim.data`` (WOMD JSON -> ScenarioPack), ``gpusim.kernels`` (one module per
per-step computation: torch reference + Triton kernel), ``gpusim.env`` (DriveEnv).
"""

__version__ = "0.1.0"
