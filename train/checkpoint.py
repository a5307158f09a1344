"""Atomic checkpoints: weights, optimizer, progress counters, RNG state, metric state and the config.

A checkpoint is one ``torch.save`` file written to a temporary file in the same directory
(``<name>.<random>.tmp``), flushed to disk, then renamed over the target (``os.replace``), so a
crash never leaves a half-written checkpoint; a crash *during* the write leaves only the temporary
file, which :func:`clean_stale_temp_files` removes on the next start. Loading uses
``torch.load(..., weights_only=True)`` (no arbitrary code from a file), so the payload holds only
tensors and plain data.
"""

from __future__ import annotations

import os
import pathlib
import pickle
import tempfile
import zipfile

import torch

CHECKPOINT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used; the message names the file and what is wrong."""


def save_checkpoint(path, *, policy, optimizer, global_step: int, update: int, config: dict,
                    env_config: dict, extra: dict | None = None) -> pathlib.Path:
    """Write a checkpoint atomically.

    Args:
        path: target file. policy: :class:`policy.ActorCritic`. optimizer: its optimizer.
        global_step: controlled-agent steps trained so far. update: rollouts/updates done.
        config: the :class:`train.config.TrainConfig` as plain data. env_config: the env's
            config as plain data. extra: anything else (plain data / tensors), e.g. the run
            directory, the elapsed wall time and the env's metric state (``train/run.py``).

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
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def stale_temp_files(path) -> list[pathlib.Path]:
    """Temporary files left by an interrupted :func:`save_checkpoint` of ``path``
    (``<dir>/<name>.*.tmp``), sorted."""
    path = pathlib.Path(path)
    if not path.parent.is_dir():
        return []
    return sorted(path.parent.glob(path.name + ".*.tmp"))


def clean_stale_temp_files(path) -> list[pathlib.Path]:
    """Delete :func:`stale_temp_files` of ``path``; returns the files removed."""
    removed = []
    for p in stale_temp_files(path):
        try:
            p.unlink()
            removed.append(p)
        except FileNotFoundError:
            pass
    return removed


def load_checkpoint(path, map_location="cpu") -> dict:
    """Read a checkpoint written by :func:`save_checkpoint` (``torch.load(weights_only=True)``).

    Returns:
        The payload dict (see :func:`save_checkpoint`).

    Raises:
        FileNotFoundError: if the file does not exist (message names it).
        CheckpointError (a ``ValueError``): the file is empty, truncated, corrupt, holds something
            other than tensors and plain data, or is not a gpusim training checkpoint of this
            version. The message names the file and the problem, in one line.
    """
    path = pathlib.Path(path)
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a directory; pass the checkpoint file (e.g. {path}/checkpoint.pt)")
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes); use an earlier checkpoint or start a new run")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {path} holds objects other than tensors and plain data, refused for "
                              f"safety ({first[:160]})") from e
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, KeyError, IndexError) as e:
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {path} ({size} bytes) is truncated or corrupt: {reason}") from e
    if not isinstance(payload, dict) or "model" not in payload:
        raise CheckpointError(f"{path} is not a gpusim training checkpoint (no model weights in it)")
    if payload.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"{path}: checkpoint version {payload.get('version')!r}, this trainer reads "
                              f"version {CHECKPOINT_VERSION}")
    missing = [k for k in ("policy", "optimizer", "global_step", "update", "env_config") if k not in payload]
    if missing:
        raise CheckpointError(f"{path} is not a complete gpusim training checkpoint (missing {', '.join(missing)})")
    return payload
