"""Atomic checkpoints: weights, optimizer, progress counters, RNG state and the full config.

A checkpoint is one ``torch.save`` file written to a temporary file in the same directory and then
renamed over the target (``os.replace``), so a crash never leaves a half-written checkpoint.
"""

from __future__ import annotations

import os
import pathlib
import tempfile

import torch

CHECKPOINT_VERSION = 1


def save_checkpoint(path, *, policy, optimizer, global_step: int, update: int, config: dict,
                    env_config: dict, extra: dict | None = None) -> pathlib.Path:
    """Write a checkpoint atomically.

    Args:
        path: target file. policy: :class:`policy.ActorCritic`. optimizer: its optimizer.
        global_step: controlled-agent steps trained so far. update: rollouts/updates done.
        config: the :class:`train.config.TrainConfig` as plain data. env_config: the env's
            config as plain data. extra: anything else (plain data / tensors).

    Returns:
        The path written.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "version": CHECKPOINT_VERSION,
        "policy": policy.describe(),
        "model": {k: v.detach().cpu() for k, v in policy.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "global_step": int(global_step),
        "update": int(update),
        "config": config,
        "env_config": env_config,
        "rng": torch.get_rng_state(),
        "extra": extra or {},
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def load_checkpoint(path, map_location="cpu") -> dict:
    """Read a checkpoint written by :func:`save_checkpoint`.

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: if it is not a gpusim training checkpoint.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    payload = torch.load(path, map_location=map_location, weights_only=False)
    if not isinstance(payload, dict) or payload.get("version") != CHECKPOINT_VERSION or "model" not in payload:
        raise ValueError(f"{path} is not a gpusim training checkpoint (version {CHECKPOINT_VERSION})")
    return payload
