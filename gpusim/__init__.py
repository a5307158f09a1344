"""gpusim: a multi-agent driving simulator whose whole state lives in torch tensors on one device.

Public names at the top level: ``from gpusim import DriveEnv, EnvConfig, ScenarioPack`` (also
``StepResult``, ``EnvState``, ``DataConfig``). They are imported lazily, on first access, so that
importing a leaf module (``gpusim.kernels.*``, ``gpusim.data``) does not pull in the env.

Subpackages: ``gpusim.data`` (WOMD -> ScenarioPack), ``gpusim.kernels`` (one module per per-step
computation: torch reference + Triton kernel), ``gpusim.sim`` (the stages of a step and their
order, ``PIPELINE``), ``gpusim.env`` (DriveEnv), ``gpusim.render``. Layout: docs/architecture.md.
"""

__version__ = "0.1.0"

_EXPORTS = {
    "DriveEnv": "gpusim.env",
    "StepResult": "gpusim.env",
    "EnvConfig": "gpusim.config",
    "DataConfig": "gpusim.config",
    "ScenarioPack": "gpusim.data.pack",
    "EnvState": "gpusim.state",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'gpusim' has no attribute {name!r}")
