"""Argument checks shared by the Triton launchers (pure Python, no kernels)."""

from __future__ import annotations

import torch

from gpusim.backend import normalize_device


def check_tensors(fn: str, spec, device: torch.device) -> None:
    """Check each ``(tensor, shape, dtype, name)`` of ``spec``: exact shape and dtype, on ``device``
    (compared after :func:`gpusim.backend.normalize_device`, so ``cuda`` matches ``cuda:0``),
    contiguous (launchers index raw pointers).

    Raises:
        ValueError: naming ``fn`` and the first offending argument.
    """
    device = normalize_device(device)
    for t, shape, dtype, name in spec:
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{fn}: {name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
        if t.dtype != dtype:
            raise ValueError(f"{fn}: {name} has dtype {t.dtype}, expected {dtype}")
        if normalize_device(t.device) != device:
            raise ValueError(f"{fn}: {name} is on {t.device}, expected {device}")
        if not t.is_contiguous():
            raise ValueError(f"{fn}: {name} must be contiguous")
