"""Standard RL interfaces over :class:`gpusim.env.DriveEnv` (thin adapters; optional extras).

* :class:`DriveVectorEnv` (``gpusim.adapters.gym_vector``): a ``gymnasium.vector.VectorEnv`` with
  the ``W x C`` agent slots flattened to ``num_envs = W * C`` sub-environments, torch tensors in
  and out, an ``info["active"]`` mask. Needs ``pip install -e ".[gymnasium]"``.
* :class:`DriveTorchRLEnv` (``gpusim.adapters.torchrl_env``): a TorchRL ``EnvBase`` with batch size
  ``[W, C]`` and device-resident ``TensorDict`` s. Needs ``pip install -e ".[torchrl]"``.

Both are imported lazily: ``import gpusim.adapters`` works without either package, and using
one without its package raises ImportError naming the extra. Semantics: docs/adapters.md.
"""

from __future__ import annotations

import importlib

_LAZY = {"DriveVectorEnv": ("gpusim.adapters.gym_vector", "gymnasium"),
         "DriveTorchRLEnv": ("gpusim.adapters.torchrl_env", "torchrl")}

__all__ = list(_LAZY)


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'gpusim.adapters' has no attribute {name!r}")
    module, extra = _LAZY[name]
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] in (extra, "tensordict"):
            raise ImportError(f"gpusim.adapters.{name} needs the {extra} package: pip install -e \".[{extra}]\"") from e
        raise
