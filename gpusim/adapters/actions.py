"""Actions handed to an adapter, passed on to :meth:`gpusim.env.DriveEnv.step` unconverted, so
the env's own checks apply (``EnvConfig.check_actions``): a discrete env refuses float actions
(a cast would turn 1.7 into joint 1 and step the worlds), a continuous env refuses integers, NaN
and out-of-range values are refused with the env's message. The one check added here names NaN
in float actions given to a discrete env (the env's message there is about the dtype only)."""

from __future__ import annotations

import torch


def env_actions(actions, device, continuous: bool, where: str) -> torch.Tensor:
    """``actions`` as a tensor on ``device`` with its dtype kept (NumPy / lists through
    ``torch.as_tensor``).

    Args:
        actions: discrete: integers; continuous: floats (any shape; the caller checks it).
        device: the env's device. continuous: the env's action space is continuous.
        where: the caller's name, for messages (``"DriveVectorEnv.step"``).

    Raises:
        ValueError: float actions containing NaN for a discrete env (one host read, on that
            error path only: integer tensors are not inspected here).
    """
    a = torch.as_tensor(actions, device=device)
    if not continuous and a.is_floating_point() and bool(torch.isnan(a).any()):
        raise ValueError(f"{where}: discrete actions contain NaN (expected integer joint indices in [0, 91))")
    return a
