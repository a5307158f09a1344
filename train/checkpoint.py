"""Atomic checkpoints: weights, optimizer, progress counters, RNG state, metric state and the config.

A checkpoint is one ``torch.save`` file written through :func:`gpusim.fileio.torch_save` (the one
atomic writer: a temporary file in the same directory, ``<name>.<random>.tmp``, flushed to disk,
then renamed over the target with ``os.replace``), so a crash never leaves a half-written
checkpoint; a crash *during* the write leaves only the temporary file, which
:func:`clean_stale_temp_files` removes on the next start. Loading uses
``torch.load(..., weights_only=True)`` (no arbitrary code from a file), so the payload holds only
tensors and plain data; an experience hook the checkpoint's config names as ``MODULE:CLASS`` is
imported only when the user names it again (``train/resume.py``).

Integrity: a checkpoint carries ``"checksums"``, the CRC-32C of every tensor in it (weights,
optimizer state, RNG and metric state; named by their path, e.g. ``model/actor.weight``) and of
everything else (its plain data as JSON), computed by the scenario packs' functions
(:func:`gpusim.data.integrity.pack_checksums`). :func:`load_checkpoint` verifies them and names
the first part that differs; a checkpoint written before checksums existed loads with a one-line
note. It also refuses weights holding NaN or infinity and env settings that
:class:`gpusim.config.EnvConfig` refuses (a non-finite reward, a radius of 0).
"""

from __future__ import annotations

import pathlib
import pickle
import sys
import zipfile

import torch

from gpusim.data.integrity import checksum_mismatch, file_kind, pack_checksums, payload_kind
from gpusim.fileio import temp_name_glob, torch_save

CHECKPOINT_VERSION = 1
#: ``extra`` key of the scenario ids a run trained on (:func:`training_scenes`); absent or None in
#: checkpoints written before it existed or of runs on more than :data:`TRAINING_SCENES_MAX` scenes.
TRAINING_SCENES_KEY = "training_scenes"
#: At most this many scenario ids are saved (about 20 bytes each).
TRAINING_SCENES_MAX = 5000


def training_scenes(env) -> list[str] | None:
    """The sorted distinct scenario ids ``env`` trains on, for a checkpoint's
    ``extra[TRAINING_SCENES_KEY]`` (``train/evaluate.py`` warns when a checkpoint is evaluated on
    them): the whole dataset of a streaming pool (``env.pool``), else the env's pack; a mirrored
    copy counts as its scene (the id without :data:`gpusim.data.mirror.MIRROR_SUFFIX`). None when
    there are more than :data:`TRAINING_SCENES_MAX` or the env has no pack (a library env)."""
    from gpusim.data.mirror import MIRROR_SUFFIX

    pool = getattr(env, "pool", None)
    if pool is not None:
        data = pool.data
        ids = data.scenario_ids if hasattr(data, "scenario_ids") else data.pack.scenario_ids
    else:
        ids = getattr(getattr(env, "pack", None), "scenario_ids", None)
    if ids is None:
        return None
    out = sorted({i[: -len(MIRROR_SUFFIX)] if i.endswith(MIRROR_SUFFIX) else i for i in ids})
    return out if len(out) <= TRAINING_SCENES_MAX else None


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
        The path written (holding ``"checksums"``, :func:`checkpoint_checksums`).

    Raises:
        gpusim.fileio.OutputError (a ``ValueError``): the file cannot be written (a full disk, a
            read-only file system), one line naming it and the cause; the previous checkpoint is
            left as it was.
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
    payload["checksums"] = checkpoint_checksums(payload)
    return torch_save(payload, path)  # the one atomic writer: temporary file, fsync, rename


def _split(x, prefix: str, tensors: dict):
    """``x`` with every tensor replaced by a description (dtype and shape) and dict keys as strings;
    the tensors go into ``tensors`` under their path (``model/actor.weight``)."""
    if isinstance(x, torch.Tensor):
        tensors[prefix] = x
        return f"tensor {str(x.dtype).removeprefix('torch.')} {list(x.shape)}"
    if isinstance(x, dict):
        return {str(k): _split(v, f"{prefix}/{k}" if prefix else str(k), tensors) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_split(v, f"{prefix}/{i}", tensors) for i, v in enumerate(x)]
    return x


def checkpoint_parts(payload: dict) -> tuple[dict, dict]:
    """``(plain, tensors)`` of a checkpoint payload, without its ``"checksums"``: the plain data
    (tensors described by dtype and shape) and every tensor by its path."""
    tensors: dict = {}
    plain = _split({k: v for k, v in payload.items() if k != "checksums"}, "", tensors)
    return plain, tensors


def checkpoint_checksums(payload: dict) -> dict:
    """The ``"checksums"`` entry of a checkpoint: :func:`gpusim.data.integrity.pack_checksums` of
    :func:`checkpoint_parts` (CRC-32C of every tensor's bytes and of the plain data's JSON)."""
    plain, tensors = checkpoint_parts(payload)
    return pack_checksums(plain, tensors)


def verify_checksums(payload: dict, path, say=None) -> None:
    """Check a loaded checkpoint's ``"checksums"`` against its contents.

    Args:
        payload: the ``torch.load`` result. path: its file (for messages).
        say: where the note about a checkpoint without checksums goes (default: stderr).

    Raises:
        CheckpointError: a part differs from its checksum (the message names the file and the
            part: ``the plain data`` or a tensor path such as ``model/actor.weight``).
    """
    stored = payload.get("checksums")
    if stored is None:
        (say or (lambda m: print(m, file=sys.stderr)))(
            f"note: checkpoint {path} has no checksum (written before checkpoints carried one); loaded unverified")
        return
    plain, tensors = checkpoint_parts(payload)
    bad = checksum_mismatch({**plain, "checksums": stored}, tensors)
    if bad is not None:
        part = "the plain data (configs, counters)" if bad == "meta" else \
            "the checksum entry" if bad == "checksums" else f"tensor {bad}"
        raise CheckpointError(f"checkpoint {path}: {part} does not match its checksum: the file is corrupt or was "
                              "changed after it was written; use another copy or an earlier checkpoint")


def check_weights(payload: dict, path) -> None:
    """Refuse a checkpoint whose model weights hold NaN or infinity (one reduction per tensor).

    Raises:
        CheckpointError: naming the file, the first such tensor and how many of its values.
    """
    weights = {k: t for k, t in payload["model"].items() if isinstance(t, torch.Tensor) and t.is_floating_point()}
    if not weights:
        return
    counts = torch.stack([(~torch.isfinite(t)).sum() for t in weights.values()]).tolist()  # one host read
    for (name, t), n_bad in zip(weights.items(), counts):
        if n_bad:
            raise CheckpointError(f"checkpoint {path}: weight {name} holds {n_bad} of {t.numel()} values NaN or "
                                  "infinite; the policy cannot act. Use an earlier checkpoint")


def stale_temp_files(path) -> list[pathlib.Path]:
    """Temporary files left by an interrupted :func:`save_checkpoint` of ``path``
    (``<dir>/<name>.*.tmp``), sorted."""
    path = pathlib.Path(path)
    if not path.parent.is_dir():
        return []
    return sorted(path.parent.glob(temp_name_glob(path)))


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


def load_checkpoint(path, map_location="cpu", say=None) -> dict:
    """Read a checkpoint written by :func:`save_checkpoint` (``torch.load(weights_only=True)``),
    verify its checksums (:func:`verify_checksums`; ``say`` gets the note about a checkpoint
    without any, default stderr), its weights (:func:`check_weights`) and its env settings
    (:class:`gpusim.config.EnvConfig`'s validation, e.g. every number finite).

    Returns:
        The payload dict (see :func:`save_checkpoint`).

    Raises:
        FileNotFoundError: if the file does not exist (message names it).
        CheckpointError (a ``ValueError``): the file is empty, truncated, corrupt, holds something
            other than tensors and plain data, is not a gpusim training checkpoint of this
            version, differs from its checksums, holds NaN or infinite weights, or records env
            settings that are invalid. The message names the file and the problem, in one line.
    """
    path = pathlib.Path(path)
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a directory; pass the checkpoint file (e.g. {path}/checkpoint.pt)")
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes); use an earlier checkpoint or start a new run")
    kind = file_kind(path)
    if kind not in (None, "a torch (zip) file"):  # a data or config file given in the wrong place
        raise CheckpointError(f"{path} is {kind}, not a gpusim training checkpoint; pass the checkpoint.pt "
                              f"that train/run.py writes in its run directory")
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
        what = payload_kind(payload)
        raise CheckpointError(f"{path} is {what}, not a gpusim training checkpoint; pass it as --data" if what else
                              f"{path} is not a gpusim training checkpoint (no model weights in it)")
    if payload.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"{path}: checkpoint version {payload.get('version')!r}, this trainer reads "
                              f"version {CHECKPOINT_VERSION}")
    missing = [k for k in ("policy", "optimizer", "global_step", "update", "env_config") if k not in payload]
    if missing:
        raise CheckpointError(f"{path} is not a complete gpusim training checkpoint (missing {', '.join(missing)})")
    verify_checksums(payload, path, say)
    check_weights(payload, path)
    from train.config import env_config_from_dict  # lazy: train.config imports the policy and PPO modules

    try:
        env_config_from_dict(payload["env_config"] if isinstance(payload["env_config"], dict) else {})
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path}: its env settings are invalid: {e}") from e
    return payload


class PolicyMismatch(CheckpointError):
    """A checkpoint's policy reads other observations or acts in another action space than the env
    it is meant to drive. The message names the file and both sizes; ``detail`` is the message
    without the file (for a caller that names the flag instead)."""

    def __init__(self, path, detail: str):
        super().__init__(f"checkpoint {path}: {detail}")
        self.detail = detail


def policy_from_checkpoint(payload: dict, path, obs_layout=None, num_actions: int | None = None,
                           continuous: bool | None = None):
    """The :class:`policy.ActorCritic` of a loaded checkpoint ``payload`` (:func:`load_checkpoint`),
    weights loaded, frozen (``requires_grad_(False)``) and in eval mode, on the CPU.

    Args:
        payload: the checkpoint's dict. path: its file (for messages).
        obs_layout: the env's observation layout (``env.obs_layout``); None: not checked.
        num_actions: the env's action count (91) or dimension (2); None: not checked.
        continuous: the env's action space is continuous; None: not checked.

    Raises:
        PolicyMismatch (a ``CheckpointError``, ``ValueError``): the policy's observation layout,
            action count or action space differs from the given ones.
        CheckpointError: the weights disagree with the checkpoint's recorded policy description
            (:func:`load_weights`: the file and the first mismatching tensor with both shapes), or
            the description itself is invalid (a missing or unknown field, an impossible size);
            both are checked before the policy takes any memory.
    """
    from policy.actor_critic import ActorCritic
    from policy.encoders import ObsDims

    check_description(payload, path)
    policy = ActorCritic.from_description(payload["policy"])
    have = policy.dims.describe()
    want = have if obs_layout is None else ObsDims.from_layout(obs_layout).describe()
    n = policy.num_actions if num_actions is None else int(num_actions)
    cont = policy.continuous if continuous is None else bool(continuous)
    if have != want or policy.num_actions != n or policy.continuous != cont:
        kind = lambda c: "continuous" if c else "discrete"  # noqa: E731
        raise PolicyMismatch(path, f"the policy reads observations {have} with {policy.num_actions} "
                                   f"{kind(policy.continuous)} actions, the env gives {want} with {n} {kind(cont)}")
    load_weights(policy, payload["model"], path)
    policy.requires_grad_(False)
    return policy.eval()


def check_description(payload: dict, path) -> None:
    """Check a loaded checkpoint's recorded policy description against its weights before any
    policy is built from it: the policy is built on the ``meta`` device (shapes, no memory) and
    :func:`load_weights` compares the shapes.

    Raises:
        CheckpointError: the description is invalid (a missing or unknown field, an impossible
            size), or the weights disagree with it (the first mismatching tensor, both shapes).
    """
    from policy.actor_critic import ActorCritic

    try:
        with torch.device("meta"):
            shell = ActorCritic.from_description(payload["policy"])
    except (TypeError, KeyError, ValueError, AttributeError) as e:
        raise CheckpointError(f"checkpoint {path}: its recorded policy description is invalid "
                              f"({type(e).__name__}: {e}); use another copy or an earlier checkpoint") from e
    load_weights(shell, payload["model"], path, check_only=True)


def load_weights(policy, state, path, check_only: bool = False) -> None:
    """Load a checkpoint's ``"model"`` tensors into ``policy`` (built from the same checkpoint's
    recorded description, :meth:`policy.ActorCritic.from_description`), after checking that they
    fit it: the same tensor names, each a tensor of the shape the description gives.

    Args:
        policy: the :class:`policy.ActorCritic` to fill (in place). state: the checkpoint's
            ``"model"`` dict (name -> tensor). path: its file (for messages).
        check_only: check the shapes and load nothing (``policy`` may live on the ``meta``
            device: a description is checked against its weights before any memory is taken).

    Raises:
        CheckpointError: the weights disagree with the description (an edited or mixed-up file):
            one line naming the file and the first tensor that differs, with both shapes (or the
            tensor that is missing, extra or not a tensor).
    """
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path}: its weights ('model') are {type(state).__name__}, not a dict of "
                              "tensors; use another copy or an earlier checkpoint")
    head = f"checkpoint {path}: its weights do not fit its recorded policy description:"
    tail = "the file was edited or mixed from two runs; use another copy or an earlier checkpoint"
    for name, want in policy.state_dict().items():
        have = state.get(name)
        if have is None:
            raise CheckpointError(f"{head} tensor {name} {list(want.shape)} is missing; {tail}")
        if not isinstance(have, torch.Tensor):
            raise CheckpointError(f"{head} {name} is {type(have).__name__}, not a tensor; {tail}")
        if tuple(have.shape) != tuple(want.shape):
            raise CheckpointError(f"{head} tensor {name} is {list(have.shape)} in the file, {list(want.shape)} by the "
                                  f"description; {tail}")
    extra = [name for name in state if name not in policy.state_dict()]
    if extra:
        raise CheckpointError(f"{head} tensor {extra[0]} ({len(extra)} in all) is not in the described policy; {tail}")
    if not check_only:
        policy.load_state_dict(state)


def load_policy(path, device="cpu", obs_layout=None, num_actions: int | None = None,
                continuous: bool | None = None):
    """The one way to load a trained policy to act with (evaluation, co-players, rendering):
    :func:`load_checkpoint` then :func:`policy_from_checkpoint`, moved to ``device``.

    Args:
        path: a checkpoint file, or a run directory holding ``checkpoint.pt``.
        device: where the policy goes. obs_layout, num_actions, continuous: what the env gives
            (checked when given; see :func:`policy_from_checkpoint`).

    Returns:
        ``(policy, payload)``: the frozen :class:`policy.ActorCritic` in eval mode, and the
        checkpoint's dict (``global_step``, ``env_config``, ...).

    Raises:
        FileNotFoundError, CheckpointError: as :func:`load_checkpoint`. PolicyMismatch and
            CheckpointError (weights that disagree with the description): as
            :func:`policy_from_checkpoint`.
    """
    path = pathlib.Path(path)
    if path.is_dir() and (path / "checkpoint.pt").is_file():
        path = path / "checkpoint.pt"
    payload = load_checkpoint(path, map_location="cpu")
    policy = policy_from_checkpoint(payload, path, obs_layout, num_actions, continuous)
    return policy.to(device), payload
