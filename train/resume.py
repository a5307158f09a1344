"""Starting or continuing a training run: the run directory, the checkpoint to resume, and what
is restored from it.

A new run gets ``<log_dir>/<run_name>`` (refused when it already holds a ``metrics.jsonl``). A
resumed run (``--resume FILE|DIR``) continues the checkpoint's run directory and
``metrics.jsonl``: records after the checkpoint's update (left by a kill between a report and the
next checkpoint) are dropped first, so no update is logged twice or lost; the ``time`` field, the
env's metric state (EMA slots), weights, optimizer, step counters and RNG are restored. Env and
policy settings come from the checkpoint; user-set flags that contradict it are refused.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import time

import torch

from train.checkpoint import check_description, load_checkpoint, load_weights
from train.config import (TrainConfig, UserError, check_device, env_config_from_dict, flag, memory_task_experience,
                          refuse_file_hook, resolve_path, user_set)
from train.logger import truncate_jsonl

CHECKPOINT_FILE = "checkpoint.pt"


def resolve_out(path: str) -> pathlib.Path:
    """Output directories: relative paths are relative to the current directory."""
    return pathlib.Path(path).expanduser()


def resume_conflicts(cfg: TrainConfig, ckpt: dict) -> list[str]:
    """``--env.*`` / ``--policy.*`` / ``--num-worlds`` values the user set (they differ from the
    :class:`TrainConfig` defaults) that differ from the checkpoint's, as ``"--env.k-trials 3
    (checkpoint: 2)"`` strings; ``[]`` when there is none."""
    out = []
    saved_env = env_config_from_dict(ckpt["env_config"])
    for name in sorted(user_set(cfg, "env")):
        if getattr(cfg.env, name) != getattr(saved_env, name):
            out.append(f"{flag('env', name)} {getattr(cfg.env, name)} (checkpoint: {getattr(saved_env, name)})")
    saved_policy = ckpt["policy"]["config"]
    for name in sorted(user_set(cfg, "policy")):
        mine, theirs = getattr(cfg.policy, name), saved_policy.get(name)
        if isinstance(mine, tuple):
            mine = list(mine)
        if mine != theirs:
            out.append(f"{flag('policy', name)} {getattr(cfg.policy, name)} (checkpoint: {theirs})")
    saved_w = (ckpt.get("config") or {}).get("num_worlds")
    if saved_w is not None and cfg.num_worlds != TrainConfig().num_worlds and cfg.num_worlds != saved_w:
        out.append(f"--num-worlds {cfg.num_worlds} (checkpoint: {saved_w}; the metric state is per world)")
    return out


def resume_run_dir(ckpt_file: pathlib.Path, ckpt: dict) -> pathlib.Path:
    """The run directory a checkpoint belongs to.

    The one recorded in the checkpoint when the file is still where that run wrote it (its run
    directory, or its ``--checkpoint-dir``) and that directory exists; otherwise the checkpoint's
    own directory: a run that was moved, or a checkpoint copied elsewhere to branch off, continues
    beside the file and never appends to (or truncates) the original run's ``metrics.jsonl``.
    """
    recorded = (ckpt.get("extra") or {}).get("run_dir")
    own = ckpt_file.parent
    if not recorded:
        return own
    recorded = pathlib.Path(recorded)
    written_to = (ckpt.get("config") or {}).get("checkpoint_dir") or recorded
    try:
        in_place = own.resolve() == pathlib.Path(written_to).expanduser().resolve()
    except OSError:
        in_place = False
    if in_place and (recorded / "metrics.jsonl").exists():
        return recorded
    return own


def prepare_run(cfg: TrainConfig):
    """Checks and resume bookkeeping done before anything is built or written.

    Returns:
        ``(cfg, ckpt, ckpt_file, run_dir)``: ``cfg`` with its run name (and, resuming, the
        checkpoint's ``num_worlds``, and for a memory-task run its shaping when the flags left the
        default ``progress``, which that task refuses); ``ckpt`` (the loaded checkpoint dict) and ``ckpt_file`` are
        None for a new run.

    Raises:
        UserError: bad device, ``--wandb`` without wandb, a run directory that already holds a run,
            resume flags that contradict the checkpoint, a checkpoint whose recorded experience hook
            imports code (``MODULE:CLASS``) that the command line neither names nor trusts
            (``--trust-checkpoint-code``; :func:`train.config.refuse_file_hook`).
            FileNotFoundError: missing ``--resume``.
        train.checkpoint.CheckpointError (a ValueError): unreadable checkpoint; its policy
            description invalid or disagreeing with its weights.
    """
    check_device(cfg.device)
    if cfg.wandb and importlib.util.find_spec("wandb") is None:
        raise UserError("--wandb needs the wandb package: pip install 'gpusim[wandb]' (or run without --wandb)")
    if not cfg.resume:
        run_name = cfg.run_name or time.strftime("%Y%m%d-%H%M%S") + f"-s{cfg.seed}"
        run_dir = resolve_out(cfg.log_dir) / run_name
        if (run_dir / "metrics.jsonl").is_file() and (run_dir / "metrics.jsonl").stat().st_size > 0:
            raise UserError(f"run directory {run_dir} already holds a run (metrics.jsonl): pass another --run-name, "
                            f"or --resume {run_dir / CHECKPOINT_FILE} to continue it")
        return dataclasses.replace(cfg, run_name=run_name), None, None, run_dir
    ckpt_file = resolve_path(cfg.resume)
    if ckpt_file.is_dir():
        ckpt_file = ckpt_file / CHECKPOINT_FILE
    ckpt = load_checkpoint(ckpt_file)
    check_description(ckpt, ckpt_file)  # before the policy is built from it (shapes on the meta device)
    conflicts = resume_conflicts(cfg, ckpt)
    if conflicts:
        via = f" (--setting {cfg.setting} gives its --env.* values)" if getattr(cfg, "setting", None) else ""
        raise UserError(f"--resume {ckpt_file}: the env and policy settings come from the checkpoint, and these "
                        f"flags conflict with it{via}: {'; '.join(conflicts)}. Drop them, or start a new run")
    saved = ckpt.get("config") or {}
    saved_w = saved.get("num_worlds")
    if saved_w is not None:
        cfg = dataclasses.replace(cfg, num_worlds=int(saved_w))
    default = TrainConfig()
    if cfg.experience == default.experience and tuple(cfg.experience_arg) == tuple(default.experience_arg):
        # no hook named on the command line: the run's own (its shaping must not change under it)
        if saved.get("experience"):  # code it names is imported only when the user says so
            refuse_file_hook(cfg, f"--resume {ckpt_file}", saved["experience"], saved.get("experience_arg") or ())
            cfg = dataclasses.replace(cfg, experience=saved["experience"],
                                      experience_arg=tuple(saved.get("experience_arg") or ()))
        else:  # a checkpoint that recorded none: the default for its env, by parse_args's rule
            with_env = dataclasses.replace(cfg, env=env_config_from_dict(ckpt["env_config"]))
            cfg = dataclasses.replace(cfg, experience=memory_task_experience(with_env, explicit=False).experience)
    run_dir = resume_run_dir(ckpt_file, ckpt)
    return dataclasses.replace(cfg, run_name=run_dir.name), ckpt, ckpt_file, run_dir


def nothing_to_do(ckpt: dict, ckpt_file, run_dir, total_timesteps: int, say=print) -> dict | None:
    """The summary of :func:`train.run.train` when the resumed checkpoint already reached
    ``total_timesteps`` (after saying so with ``say``), else None (there is training to do)."""
    if ckpt is None or ckpt["global_step"] < total_timesteps:
        return None
    if say is not None:
        say(f"nothing to do: {ckpt_file} is at step {ckpt['global_step']:,} >= --total-timesteps "
            f"{total_timesteps:,}; pass a larger --total-timesteps to train further")
    return {"global_step": ckpt["global_step"], "update": ckpt["update"], "reports": [],
            "checkpoint": str(ckpt_file), "run_dir": str(run_dir), "nothing_to_do": True, "data_problems": []}


def restore(ckpt: dict, ckpt_file, policy, optimizer, metric_log, run_dir: pathlib.Path, main: bool = True):
    """Load a checkpoint's weights, optimizer, torch RNG and metric state, and cut
    ``metrics.jsonl`` back to its update (:func:`train.logger.truncate_jsonl`; only when ``main``:
    rank 0 of a torchrun job).

    Returns:
        ``(global_step, update, elapsed seconds, JSONL lines dropped)``.

    Raises:
        UserError: the saved metric state does not fit the env.
        train.checkpoint.CheckpointError: the weights disagree with the checkpoint's recorded
            policy description (:func:`train.checkpoint.load_weights`).
    """
    load_weights(policy, ckpt["model"], ckpt_file)  # one line naming a tensor that disagrees with the description
    optimizer.load_state_dict(ckpt["optimizer"])
    torch.set_rng_state(ckpt["rng"])
    extra = ckpt.get("extra") or {}
    if metric_log is not None and extra.get("env_metrics") is not None:
        try:
            metric_log.load_state_dict(extra["env_metrics"])
        except ValueError as e:
            raise UserError(f"--resume {ckpt_file}: cannot restore the metric state: {e}") from e
    _, dropped = truncate_jsonl(run_dir / "metrics.jsonl", ckpt["update"]) if main else (0, 0)
    return ckpt["global_step"], ckpt["update"], float(extra.get("elapsed", 0.0)), dropped


def announce(logger, stale, ckpt_file, update: int, global_step: int, run_dir, dropped: int) -> None:
    """Console lines about removed temporary checkpoint files and the resumed checkpoint
    (``ckpt_file`` None: a new run, nothing about resuming)."""
    for p in stale:
        logger.info(f"removed {p} (left by an interrupted checkpoint write)")
    if ckpt_file is not None:
        logger.info(f"resumed {ckpt_file} at update {update}, step {global_step:,}: continuing "
                    f"{run_dir / 'metrics.jsonl'}" + (f" ({dropped} record(s) after the checkpoint dropped)"
                                                      if dropped else ""))
