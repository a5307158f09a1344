"""``python train/run.py``: PPO training of the transformer policy on WOMD scenarios.

Read top to bottom, :func:`train` is the whole algorithm: set up (:func:`train.setup.build_run`:
data, env, policy, optimizer, buffers, logger; :mod:`train.resume` when continuing a run), then
loop: collect one episode of every world into device buffers (:mod:`train.rollout`, captured in a
CUDA graph where possible: :mod:`train.graphed_rollout`), run the experience hook
(:mod:`train.experience`) and the masked PPO update (:mod:`train.ppo`), report (console, JSONL,
optional wandb), checkpoint atomically (:mod:`train.checkpoint`).

Host reads: per update, four integers after the hook (valid steps before/after the hook, active
slots, and the indices of rows with a valid step — needed to size the minibatches and count the
optimizer steps) and the update's loss statistics (all finite, :func:`train.ppo.check_losses`),
and on CUDA a wait for the device at the end of the rollout and of the update (the reported
split); with ``--ppo.pack-removed`` one count per minibatch; per report, the loss
statistics and the env metrics. None per env step.

Examples::

    python train/run.py                                   # CPU defaults on data/womd_sample
    python train/run.py --env.goal-behavior trial --env.k-trials 3 --num-worlds 64
    python train/run.py --resume runs/<name>/checkpoint.pt --total-timesteps 600000
    python train/run.py --experience drop --experience-arg agent_type=pedestrian
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import sys
import time

if __package__ in (None, ""):  # `python train/run.py` from a checkout without `pip install -e .`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch

from gpusim.fileio import check_output_path, lock_directory, write_errors
from train.checkpoint import TRAINING_SCENES_KEY, save_checkpoint, training_scenes
from train.config import USER_ERRORS, TrainConfig, UserError, keep_best_entry, one_line, parse_args, resolve_path
from train.extras import RunExtras
from train.distributed import setup as setup_distributed
from train.graphed_rollout import make_rollout
from train.human import SHA_KEY
from train.ppo import check_losses, linear_lr, optimizer_steps, ppo_update
from train.resume import nothing_to_do, prepare_run, resolve_out
from train.rollout import RolloutBatch
from train.setup import build_run


def train(cfg: TrainConfig, env=None, hook=None) -> dict:
    """Run training, or continue it with ``cfg.resume`` (:mod:`train.resume`: the run directory,
    ``metrics.jsonl``, weights, optimizer, counters, RNG and metric state carry on; env and policy
    settings come from the checkpoint). When the checkpoint already reached ``total_timesteps``
    nothing is done (and said).

    Args:
        cfg: :class:`TrainConfig`.
        env: an env to train in (tests pass a small one); default builds ``DriveEnv`` from ``cfg.data``.
        hook: an :class:`train.experience.ExperienceHook` object to use instead of the one named by
            ``cfg.experience`` (library use).

    Returns:
        Summary dict: ``global_step``, ``update``, ``reports`` (list of report records),
        ``checkpoint`` (path of the last checkpoint), ``run_dir``, ``nothing_to_do`` (bool),
        ``data_problems`` (lines listing skipped data files).

    Raises:
        UserError: bad device, missing wandb, conflicting resume flags, a pack that does not
            match user-set ``--env.*`` flags, a run directory that already holds a run.
        gpusim.fileio.DirectoryInUse (a ValueError): another live run holds the run directory's
            lock (the message names its pid). gpusim.fileio.OutputError: the run directory cannot
            be written (read-only or full file system, a file in its place).
        FileNotFoundError: missing ``--data``/``--resume``. train.checkpoint.CheckpointError
            (a ValueError): unreadable checkpoint. gpusim.data.ScenarioError: no usable scenario.
    """
    ranks = setup_distributed(cfg.device)  # torchrun: join the process group (train/distributed.py); else no-op
    held = []  # rank 0's lock of the run directory, held while the run writes to it
    ok = False
    try:
        out = _train(cfg, env, hook, ranks, held)
        ok = True
        return out
    finally:  # a run that failed before writing anything leaves no directory behind
        for lock in held:
            lock.release(cleanup=not ok)


def _prepare_locked(cfg: TrainConfig, held: list):
    """:func:`train.resume.prepare_run`, then (rank 0) the run directory checked writable and
    locked (:func:`gpusim.fileio.lock_directory`, the lock appended to ``held``); a new run checks
    again under the lock that no other run finished into the directory meanwhile."""
    cfg, ckpt, ckpt_file, run_dir = prepare_run(cfg)
    cfg = _resumed_data(cfg, ckpt)
    flag = "--resume" if ckpt is not None else "--log-dir"
    check_output_path(run_dir, flag, kind="dir")
    if cfg.checkpoint_dir:
        check_output_path(resolve_out(cfg.checkpoint_dir), "--checkpoint-dir", kind="dir")
    held.append(lock_directory(run_dir, hint="wait for it to end, or pass another --run-name"))
    if ckpt is None:
        prepare_run(cfg)  # the same run name: the directory must still hold no run
    return cfg, ckpt, ckpt_file, run_dir


def _resumed_data(cfg: TrainConfig, ckpt: dict | None) -> TrainConfig:
    """A resumed run without ``--data`` trains on the data its checkpoint recorded, not on the
    default (the bundled sample); ``--data`` given explicitly wins.

    Raises:
        UserError: the recorded data is no longer there (names it; pass ``--data``).
    """
    recorded = ((ckpt or {}).get("config") or {}).get("data")
    if ckpt is None or not recorded or cfg.data != TrainConfig().data or recorded == cfg.data:
        return cfg
    if not resolve_path(recorded).exists():
        raise UserError(f"--resume: the run trained on --data {recorded}, which is not there any more; pass --data "
                        "PATH (the same scenarios) to continue it")
    return dataclasses.replace(cfg, data=recorded)


def _train(cfg: TrainConfig, env, hook, ranks, held: list) -> dict:
    """The body of :func:`train` (``held``: where rank 0 keeps the run directory's lock)."""
    cfg, ckpt, ckpt_file, run_dir = ranks.from_main(_prepare_locked, cfg, held)  # rank 0 checks, locks and reads
    done = nothing_to_do(ckpt, ckpt_file, run_dir, cfg.total_timesteps, say=print if ranks.is_main else None)
    if done is not None:
        ranks.close()
        return done
    run = build_run(cfg, ranks, ckpt, ckpt_file, run_dir, env, hook)
    cfg, env, policy, optimizer, logger = run.cfg, run.env, run.policy, run.optimizer, run.logger
    extras = RunExtras(cfg, env, run.device, say=logger.info)  # co-players, trial logs, periodic evaluation
    rollout = make_rollout(cfg.cuda_graph, env, policy, run.buffer, run.cache, say=logger.info)  # CUDA graph or eager
    rows = env.num_worlds * env.num_slots
    global_step, update, reports, saved = run.global_step, run.update, [], None
    last_report_t, last_report_step, rollout_time, update_time = time.time(), global_step, 0.0, 0.0

    best = BestCheckpoint(cfg, run_dir, ckpt) if cfg.keep_best else None  # --keep-best: best.pt on --eval-data
    obs = env.reset(seed=cfg.seed + update)
    while global_step < cfg.total_timesteps:
        t0 = time.time()
        policy.eval()
        obs, batch = rollout(obs, coplayers=extras.pool, trial_log=extras.trial_log)
        _wait(run.device)  # CUDA runs ahead of the host: wait, so that the rollout/update split is true
        t1 = time.time()
        if cfg.anneal_lr:
            for g in optimizer.param_groups:
                g["lr"] = linear_lr(cfg.learning_rate, global_step / cfg.total_timesteps)
        ppo_now = cfg.ppo.at_progress(global_step / cfg.total_timesteps)  # the entropy schedule (train/ppo.py)
        stats, counts = update_policy(run.train_policy, optimizer, batch, run.hook, ppo_now, run.generator, dist=ranks,
                                      human=run.human, value_only=update < cfg.ppo.value_warmup)
        _wait(run.device)
        t2 = time.time()
        rollout_time, update_time = rollout_time + t1 - t0, update_time + t2 - t1
        update += 1
        check_losses(stats, update)  # one host read; a non-finite loss stops here, before any checkpoint of it
        global_step += (counts["active_slots"] if counts["active_slots"] > 0 else rows) * env.horizon

        last = global_step >= cfg.total_timesteps
        extras.after_update(update, last, policy)
        if best is not None and ranks.is_main:
            best.offer(extras.pending, run, global_step, update)
        if update % max(cfg.report_interval, 1) == 0 or last:
            now = time.time()
            record = _report_record(update, global_step, now - logger.start,
                                    (global_step - last_report_step) / max(now - last_report_t, 1e-9),
                                    rollout_time, update_time, counts, optimizer, stats, env)
            record = ranks.reduce_report(record, stats, run.metric_log)  # every rank: reduced over all ranks' agents
            record.update(extras.report())
            logger.log(record)
            if ranks.is_main:
                reports.append(record)
            last_report_t, last_report_step, rollout_time, update_time = now, global_step, 0.0, 0.0
        if (cfg.checkpoint_interval > 0 and update % cfg.checkpoint_interval == 0) or last:
            saved = _save(run, ranks, run_dir, global_step, update, best.record if best else None) or saved
    logger.close()
    ranks.close()
    return {"global_step": global_step, "update": update, "reports": reports,
            "checkpoint": str(saved) if saved else None, "run_dir": str(run_dir), "nothing_to_do": False,
            "data_problems": run.problems}


def update_policy(policy, optimizer, batch: RolloutBatch, hook, ppo_cfg, generator=None,
                  dist=None, human=None, value_only: bool = False) -> tuple[dict, dict]:
    """Experience hook, then the masked PPO update on one rollout.

    Args:
        policy, optimizer: the model and its optimizer. batch: the rollout.
        hook: an :class:`train.experience.ExperienceHook`, or ``None`` (no hook at all).
        ppo_cfg: :class:`train.ppo.PPOConfig`. generator: for the minibatch permutations.
        dist: a :class:`train.distributed.Distributed` under torchrun (counts become global sums and
            the step count is agreed over the ranks with one all-reduce), else ``None``.
        human, value_only: HR-PPO's frozen BC policy and the value warm-up (:func:`train.ppo.ppo_update`).

    Returns:
        ``(stats, counts)``: PPO statistics (scalar device tensors) and the host integers
        ``nominal_steps`` (valid steps of the rollout), ``effective_steps`` (after the hook),
        ``active_slots`` (rows with an agent), ``optimizer_steps``, ``rows_per_minibatch``.

    The optimizer-step count is :func:`train.ppo.optimizer_steps` (scaled by effective/nominal);
    minibatches hold ``ceil(rows with a valid step before the hook / num_minibatches)`` rows, so
    dropping rows shortens an epoch rather than shrinking the minibatches.
    """
    device = batch.device
    nominal = batch.loss_mask.sum()
    nominal_rows = batch.loss_mask.any(dim=1).sum()
    if hook is None:
        effective = nominal
    else:
        batch, effective = hook.preprocess_unroll_experience(batch)
        effective = torch.as_tensor(effective, device=device)
    # the one host read of the update: counts that size the minibatches and the step count
    nominal_i, nominal_rows_i, effective_i, active_slots_i = torch.stack([
        nominal.to(torch.int64), nominal_rows.to(torch.int64), effective.to(torch.int64),
        batch.slot_active.sum().to(torch.int64),
    ]).tolist()
    active_rows = torch.nonzero(batch.loss_mask.any(dim=1)).flatten()
    n_steps = optimizer_steps(effective_i, nominal_i, ppo_cfg)
    rows_per_mb = max(1, math.ceil(max(nominal_rows_i, 1) / ppo_cfg.num_minibatches))
    if dist is not None and dist.enabled:  # torchrun: global counts, one agreed step count (train/distributed.py)
        totals, n_steps, rows_per_mb, batch, active_rows = dist.agree_update(
            nominal=nominal_i, effective=effective_i, active_slots=active_slots_i, kept_rows=active_rows.numel(),
            rows=batch.rows, batch=batch, active_rows=active_rows, ppo_cfg=ppo_cfg)
        nominal_i, effective_i, active_slots_i = (totals[k] for k in ("nominal_steps", "effective_steps",
                                                                     "active_slots"))
    stats = ppo_update(policy, optimizer, batch, ppo_cfg, n_steps, rows_per_mb, active_rows, generator, human=human,
                       value_only=value_only)
    counts = {"nominal_steps": nominal_i, "effective_steps": effective_i, "active_slots": active_slots_i,
              "optimizer_steps": n_steps, "rows_per_minibatch": rows_per_mb}
    return stats, counts


def _wait(device) -> None:
    """Wait for the device's queued work (CUDA; nothing elsewhere): the reported ``rollout_s`` and
    ``update_s`` then time each phase's device work, not only its launches. One synchronisation per
    phase; the update reads its counts to the host anyway."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _save(run, ranks, run_dir: pathlib.Path, global_step: int, update: int, best: dict | None = None):
    """Write the checkpoint of ``update`` (weights, optimizer, counters, RNG, the run directory, the
    elapsed time, every rank's metric state, ``best``, the ``--keep-best`` record, and the scenario
    ids trained on, :func:`train.checkpoint.training_scenes`) on rank 0;
    returns its path there, None elsewhere.

    Raises:
        OutputError: the checkpoint cannot be written (full disk, read-only file system): one line
            naming the file and the cause; the previous checkpoint is left whole.
    """
    metric_log = run.metric_log
    extra = _run_extra(run, run_dir, best)
    extra["env_metrics"] = metric_log.state_dict() if metric_log is not None else None
    extra = ranks.checkpoint_extra(extra, metric_log)  # every rank: gathers metric and RNG states
    if not ranks.is_main:
        return None
    with write_errors(run.ckpt_path):
        return save_checkpoint(run.ckpt_path, policy=run.policy, optimizer=run.optimizer, global_step=global_step,
                               update=update, config=run.config_dict, env_config=run.config_dict["env"], extra=extra)


def _run_extra(run, run_dir: pathlib.Path, best: dict | None) -> dict:
    """The ``extra`` entries every checkpoint of a run carries (``checkpoint.pt`` and ``best.pt``):
    the run directory, the elapsed time, HR-PPO's BC file SHA-256, the ``--keep-best`` record and
    the scenario ids trained on (:func:`train.checkpoint.training_scenes`)."""
    return {"run_dir": str(pathlib.Path(run_dir).resolve()), "elapsed": run.logger.elapsed, SHA_KEY: run.human_sha,
            BestCheckpoint.KEY: best, TRAINING_SCENES_KEY: training_scenes(run.env)}


class BestCheckpoint:
    """``--keep-best``: writes the policy to ``best.pt`` (beside ``checkpoint.pt``) each time the
    periodic evaluation's entry improves, and records ``{"entry", "value", "update", "global_step"}``
    in both files' ``extra["best"]`` (so a resumed run keeps the best value seen so far).

    Args:
        cfg: the run's :class:`train.config.TrainConfig` (``keep_best``, ``eval_interval``,
            ``eval_mode``). run_dir: the run directory. ckpt: the checkpoint resumed (None: a new run).
    """

    KEY = "best"
    FILE = "best.pt"

    def __init__(self, cfg, run_dir: pathlib.Path, ckpt: dict | None):
        self.entry, self.sign = keep_best_entry(cfg.keep_best, cfg.eval_interval, cfg.eval_mode)
        self.path = pathlib.Path(run_dir) / self.FILE
        saved = ((ckpt or {}).get("extra") or {}).get(self.KEY)
        self.record = saved if saved and saved.get("entry") == self.entry else None

    def offer(self, pending: dict, run, global_step: int, update: int) -> bool:
        """Write ``best.pt`` when ``pending`` (the evaluation just run) holds a finite value of the
        entry better than the best so far; returns whether it did. No evaluation this update: nothing.

        Raises:
            UserError: the evaluation ran but has no such entry (one line listing the mode's entries).
            OutputError: ``best.pt`` cannot be written (one line naming it and the cause).
        """
        mode = self.entry.rsplit("/", 1)[0] + "/"
        names = sorted(k[len(mode):] for k in pending if k.startswith(mode))
        if names and self.entry not in pending:
            raise UserError(f"--keep-best {self.entry}: the periodic evaluation has no such entry; its {mode} "
                            f"entries are {', '.join(names)}")
        value = pending.get(self.entry)
        if value is None or not math.isfinite(float(value)):
            return False
        if self.record is not None and self.sign * float(value) <= self.sign * float(self.record["value"]):
            return False
        self.record = {"entry": self.entry, "value": float(value), "update": int(update),
                       "global_step": int(global_step)}
        with write_errors(self.path):
            save_checkpoint(self.path, policy=run.policy, optimizer=run.optimizer, global_step=global_step,
                            update=update, config=run.config_dict, env_config=run.config_dict["env"],
                            extra=_run_extra(run, self.path.parent, self.record))
        run.logger.info(f"best.pt: {self.entry} {float(value):.3f} at update {update}")
        return True


def _report_record(update, global_step, elapsed, sps, rollout_time, update_time, counts, optimizer, stats, env):
    """One JSONL record (see train/logger.py); reads the loss statistics and env metrics to the host."""
    record = {
        "update": update,
        "global_step": global_step,
        "time": elapsed,
        "sps": sps,
        "rollout_s": rollout_time,
        "update_s": update_time,
        "optimizer_steps": counts["optimizer_steps"],
        "valid_steps": counts["nominal_steps"],
        "effective_steps": counts["effective_steps"],
        "lr": optimizer.param_groups[0]["lr"],
    }
    keys = list(stats)
    vals = torch.stack([stats[k].float() for k in keys]).tolist()
    record.update({k: v for k, v in zip(keys, vals) if k != "valid_steps"})
    record.update(_env_metrics(env))
    return record


def _env_metrics(env) -> dict:
    """The env's running metrics (``env.metrics()``) as plain floats; entries that are not numbers
    are left out; ``{}`` for an env without ``metrics``."""
    fn = getattr(env, "metrics", None)
    if fn is None:
        return {}
    out = {}
    for k, v in (fn() or {}).items():
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            pass
    return out


def main(argv=None) -> int:
    """CLI entry point: 0 on success, 2 on a user error (one line on stderr; ``--debug`` re-raises)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        cfg = parse_args(argv, description=__doc__.split("\n\n")[0])
        summary = train(cfg)
    except USER_ERRORS as e:
        if debug:
            raise
        print(f"error: {one_line(e)}  (--debug shows the traceback)", file=sys.stderr)
        return 2
    if summary["nothing_to_do"]:
        return 0
    first, lastr = (summary["reports"][0], summary["reports"][-1]) if summary["reports"] else ({}, {})
    if "goal_reached" in first and "goal_reached" in lastr and not cfg.quiet:
        print(f"goal_reached: first report {first['goal_reached']:.3f} -> last report {lastr['goal_reached']:.3f}; "
              f"checkpoint {summary['checkpoint']}")
    trial = {k: v for k, v in lastr.items() if k.startswith("trial_") or k.startswith("ada_delta_trial_")}
    if trial and not cfg.quiet:  # trial mode (docs/trial.md): per-trial scores of the last report
        print("trial scores (last report): " + "  ".join(f"{k} {v:.3f}" for k, v in sorted(trial.items())))
    return 0


if __name__ == "__main__":
    from train.config import one_line_warnings

    one_line_warnings("--debug" in sys.argv)  # here, not in main(): the format is process-wide
    sys.exit(main())
