"""``python train/run.py``: PPO training of the transformer policy on WOMD scenarios.

Loop (DESIGN.md section 7): collect one episode of every world into device buffers
(:mod:`train.rollout`), run the experience hook (:mod:`train.experience`), run the masked PPO update
(:mod:`train.ppo`), report (console, JSONL, optional wandb), checkpoint atomically.

Host reads: per update, four integers after the hook (valid steps before/after the hook, active
slots, and the indices of rows with a valid step — needed to size the minibatches and count the
optimizer steps); per report, the loss statistics and the env metrics. None per env step.

Examples::

    python train/run.py                                   # CPU defaults on data/womd_sample
    python train/run.py --env.goal-behavior trial --env.k-trials 3 --num-worlds 64
    python train/run.py --resume runs/<name>/checkpoint.pt --total-timesteps 600000
    python train/run.py --experience drop --experience-arg agent_type=pedestrian
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import pathlib
import sys
import time
import warnings

if __package__ in (None, ""):  # `python train/run.py` from a checkout without `pip install -e .`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch

from gpusim.config import ActionSpace, EnvConfig
from policy.actor_critic import ActorCritic
from policy.encoders import ObsDims
from train.checkpoint import clean_stale_temp_files, load_checkpoint, save_checkpoint
from train.coplayer import RunExtras, coplayer_env_config
from train.config import TrainConfig, UserError, parse_args, resolve_path
from train.distributed import NullLogger, setup as setup_distributed
from train.experience import hook_context, make_hook
from train.logger import Logger, truncate_jsonl
from train.ppo import optimizer_steps, ppo_update
from train.graphed_rollout import make_rollout
from train.rollout import RolloutBatch

CHECKPOINT_FILE = "checkpoint.pt"
#: Fields of EnvConfig that must equal the pack's DataConfig (env field -> (data field, convert flag)).
PACK_FIELDS = {"max_agents": ("max_agents", "--max-agents"), "max_controlled": ("max_controlled", "--max-controlled"),
               "init_steps": ("init_steps", "--init-steps"), "num_roads": ("grid_k", "--grid-k")}


def _flag(group: str, name: str) -> str:
    return f"--{group}.{name.replace('_', '-')}"


def check_device(device: str) -> torch.device:
    """``torch.device(device)``, refusing a CUDA device when none is available.

    Raises:
        UserError: unknown device string, or ``cuda`` without CUDA (says what to pass instead).
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise UserError(f"--device {device}: not a torch device ({e}); use cpu or cuda") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {device}: no CUDA device is available to torch "
                        f"(torch {torch.__version__}, torch.cuda.is_available() is False); use --device cpu")
    return dev


def load_pack(data: str, env_config: EnvConfig, device="cpu"):
    """Scenario pack from ``data``: a saved pack (``pack.pt`` directory or ``.pt`` file) is loaded,
    anything else is converted from WOMD JSON with ``env_config.data_config()``.

    Raises:
        FileNotFoundError: if ``data`` does not exist. UserError: an unreadable pack file (named).
        gpusim.data.ScenarioError: if no scenario in it is usable.
    """
    from gpusim.data import ScenarioPack
    from gpusim.data.shards import ShardedPack, is_sharded

    path = resolve_path(data)
    if not path.exists():
        raise FileNotFoundError(f"--data {data}: no such file or directory (also tried {path})")
    if is_sharded(path):  # a sharded pack directory (python -m gpusim.data convert ... --shard-size N)
        return ShardedPack.open(path).load_all(device)
    if path.suffix == ".pt" or (path.is_dir() and (path / "pack.pt").exists()):
        file = path if path.suffix == ".pt" else path / "pack.pt"
        if file.is_file() and file.stat().st_size == 0:
            raise UserError(f"--data {file}: the pack file is empty (0 bytes); convert the data again")
        try:
            return ScenarioPack.load(path, device=device)
        except (FileNotFoundError, ValueError):
            raise
        except Exception as e:  # torch.load on a truncated/corrupt file (RuntimeError, UnpicklingError, ...)
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            raise UserError(f"--data {file}: not a readable scenario pack ({reason}); convert the data again") from e
    with warnings.catch_warnings():  # skipped files are listed by data_problems() instead
        warnings.simplefilter("ignore")
        return ScenarioPack.from_json(path, env_config.data_config()).to(device)


def data_problems(pack) -> list[str]:
    """Lines listing every file left out of ``pack`` at conversion (``pack.stats["errors"]`` and
    ``["skipped"]``) with its reason, headed by the count; ``[]`` when none was left out."""
    stats = getattr(pack, "stats", None) or {}
    problems = list(stats.get("errors", [])) + list(stats.get("skipped", []))
    if not problems:
        return []
    total = stats.get("files", len(problems) + getattr(pack, "num_scenarios", 0))
    lines = [f"data: {len(problems)} of {total} file(s) skipped, training on {getattr(pack, 'num_scenarios', '?')} "
             "scenario(s):"]
    lines += [f"  skipped {p.get('file', '?')}: {p.get('reason', '?')}" for p in problems]
    return lines


def adapt_env_config(env_config: EnvConfig, pack, user_set: set[str] = frozenset(),
                     resuming: bool = False) -> tuple[EnvConfig, list[str]]:
    """Make ``env_config`` match the data config the pack was built with.

    A field the user did not set (not in ``user_set``) takes the pack's value; a field the user
    set to another value is an error naming both ways out. ``resuming``: the values come from the
    checkpoint being resumed (the message says so).

    Returns:
        ``(env_config, notes)``: the adapted config and one note per adopted value.

    Raises:
        UserError: a user-set ``--env.*`` flag contradicts the pack.
    """
    data_cfg = getattr(pack, "config", None)
    if data_cfg is None:
        return env_config, []
    changes, notes, clashes = {}, [], []
    for env_field, (data_field, convert_flag) in PACK_FIELDS.items():
        want, have = getattr(env_config, env_field), getattr(data_cfg, data_field, None)
        if have is None or want == have:
            continue
        if env_field in user_set and resuming:
            clashes.append(f"the checkpoint was trained with {env_field}={want} but the pack was built with "
                           f"{data_field}={have} (convert the data with `python -m gpusim.data convert ... "
                           f"{convert_flag} {want}`)")
        elif env_field in user_set:
            clashes.append(f"{_flag('env', env_field)} {want} but the pack was built with {data_field}={have} "
                           f"(drop the flag or pass {have}, or convert again with `python -m gpusim.data convert "
                           f"... {convert_flag} {want}`)")
        else:
            changes[env_field] = have
            notes.append(f"data: the pack was built with {data_field}={have}: using {_flag('env', env_field)} {have}")
    if clashes:
        raise UserError("--data: " + "; ".join(clashes))
    if changes:
        try:
            env_config = env_config.replace(**changes)
        except ValueError as e:
            raise UserError(f"--data: the pack's settings {changes} do not fit the env config: {e}") from e
    check = getattr(pack, "check_compatible", None)
    if callable(check):
        check(env_config)
    return env_config, notes


def _user_set(cfg: TrainConfig, group: str) -> set[str]:
    """Fields of ``cfg.<group>`` that differ from :class:`TrainConfig`'s defaults (= set by the user)."""
    ours, default = getattr(cfg, group), getattr(TrainConfig(), group)
    return {f.name for f in dataclasses.fields(ours) if getattr(ours, f.name) != getattr(default, f.name)}


def make_env(cfg: TrainConfig, env_config: EnvConfig, user_set: set[str] | None = None, say=print,
             resuming: bool = False):
    """Build the :class:`gpusim.env.DriveEnv` for ``cfg``: load/convert ``cfg.data``, list skipped
    files (``say``), adapt ``env_config`` to a saved pack (:func:`adapt_env_config`).

    Raises:
        as :func:`load_pack` and :func:`adapt_env_config`.
    """
    from gpusim.env import DriveEnv

    if cfg.pool_size < 0 or cfg.resample_every < 1:
        raise UserError(f"--pool-size {cfg.pool_size} / --resample-every {cfg.resample_every}: need a pool size "
                        f">= 0 (0 = no streaming) and resample-every >= 1")
    pool = None
    if cfg.pool_size > 0:  # streaming (issue 21): a resident pool refreshed from the data
        from gpusim.data.pool import ScenarioPool
        from gpusim.data.shards import is_sharded

        path = resolve_path(cfg.data)
        src = path if is_sharded(path) else load_pack(cfg.data, env_config, "cpu")
        pool = ScenarioPool(src, cfg.pool_size, cfg.device, seed=cfg.seed, resample_every=cfg.resample_every)
        say(f"streaming: pool of {pool.pool_size} of {pool.num_scenarios} scenarios, {pool.replace} replaced "
            f"every {cfg.resample_every} episode(s)")
    pack = pool.current if pool is not None else load_pack(cfg.data, env_config, cfg.device)
    for line in data_problems(pack):
        say(line)
    env_config, notes = adapt_env_config(env_config, pack, _user_set(cfg, "env") if user_set is None else user_set,
                                         resuming=resuming)
    for line in notes:
        say(line)
    return DriveEnv(pool if pool is not None else pack, cfg.num_worlds, config=env_config, device=cfg.device,
                    seed=cfg.seed)


def _env_config_from_dict(d: dict) -> EnvConfig:
    fields = {f.name for f in dataclasses.fields(EnvConfig)}
    return EnvConfig(**{k: v for k, v in d.items() if k in fields})


def _env_metrics(env) -> dict:
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


def _metric_log(env):
    """The env's :class:`gpusim.metrics.EpisodeMetrics` (per-agent EMA state, saved in checkpoints),
    or None when the env has none with ``state_dict``/``load_state_dict``.

    Looked up as ``env.episode_metrics`` (preferred, public), ``env.sim.metrics`` (the
    ``gpusim.sim`` pipeline) or ``env._metrics`` (older DriveEnv)."""
    sim = getattr(env, "sim", None)
    for m in (getattr(env, "episode_metrics", None), getattr(sim, "metrics", None) if sim is not None else None,
              getattr(env, "_metrics", None)):
        if m is not None and callable(getattr(m, "state_dict", None)) and callable(getattr(m, "load_state_dict", None)):
            return m
    return None


def update_policy(policy, optimizer, batch: RolloutBatch, hook, ppo_cfg, generator=None,
                  dist=None) -> tuple[dict, dict]:
    """Experience hook, then the masked PPO update on one rollout.

    Args:
        policy, optimizer: the model and its optimizer. batch: the rollout.
        hook: an :class:`train.experience.ExperienceHook`, or ``None`` (no hook at all).
        ppo_cfg: :class:`train.ppo.PPOConfig`. generator: for the minibatch permutations.
        dist: a :class:`train.distributed.Distributed` under torchrun (counts become global sums and
            the step count is agreed over the ranks with one all-reduce), else ``None``.

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
    stats = ppo_update(policy, optimizer, batch, ppo_cfg, n_steps, rows_per_mb, active_rows, generator)
    counts = {"nominal_steps": nominal_i, "effective_steps": effective_i, "active_slots": active_slots_i,
              "optimizer_steps": n_steps, "rows_per_minibatch": rows_per_mb}
    return stats, counts


def resume_conflicts(cfg: TrainConfig, ckpt: dict) -> list[str]:
    """``--env.*`` / ``--policy.*`` / ``--num-worlds`` values the user set (they differ from the
    :class:`TrainConfig` defaults) that differ from the checkpoint's, as ``"--env.k-trials 3
    (checkpoint: 2)"`` strings; ``[]`` when there is none."""
    out = []
    saved_env = _env_config_from_dict(ckpt["env_config"])
    for name in sorted(_user_set(cfg, "env")):
        if getattr(cfg.env, name) != getattr(saved_env, name):
            out.append(f"{_flag('env', name)} {getattr(cfg.env, name)} (checkpoint: {getattr(saved_env, name)})")
    saved_policy = ckpt["policy"]["config"]
    for name in sorted(_user_set(cfg, "policy")):
        mine, theirs = getattr(cfg.policy, name), saved_policy.get(name)
        if isinstance(mine, tuple):
            mine = list(mine)
        if mine != theirs:
            out.append(f"{_flag('policy', name)} {getattr(cfg.policy, name)} (checkpoint: {theirs})")
    saved_w = (ckpt.get("config") or {}).get("num_worlds")
    if saved_w is not None and cfg.num_worlds != TrainConfig().num_worlds and cfg.num_worlds != saved_w:
        out.append(f"--num-worlds {cfg.num_worlds} (checkpoint: {saved_w}; the metric state is per world)")
    return out


def _resume_run_dir(ckpt_file: pathlib.Path, ckpt: dict) -> pathlib.Path:
    """The run directory a checkpoint belongs to: the one recorded in it, else the checkpoint's own
    directory (when the run was moved)."""
    recorded = (ckpt.get("extra") or {}).get("run_dir")
    candidates = [pathlib.Path(recorded)] if recorded else []
    candidates.append(ckpt_file.parent)
    for c in candidates:
        if (c / "metrics.jsonl").exists():
            return c
    return candidates[0]


def _prepare(cfg: TrainConfig):
    """Checks and resume bookkeeping done before anything is built or written.

    Returns:
        ``(cfg, ckpt, ckpt_file, run_dir)``; ``ckpt`` None for a new run.

    Raises:
        UserError / FileNotFoundError / CheckpointError: see :func:`train`.
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
    conflicts = resume_conflicts(cfg, ckpt)
    if conflicts:
        raise UserError(f"--resume {ckpt_file}: the env and policy settings come from the checkpoint, and these "
                        f"flags conflict with it: {'; '.join(conflicts)}. Drop them, or start a new run")
    saved_w = (ckpt.get("config") or {}).get("num_worlds")
    if saved_w is not None:
        cfg = dataclasses.replace(cfg, num_worlds=int(saved_w))
    run_dir = _resume_run_dir(ckpt_file, ckpt)
    return dataclasses.replace(cfg, run_name=run_dir.name), ckpt, ckpt_file, run_dir


def train(cfg: TrainConfig, env=None, hook=None) -> dict:
    """Run training (or continue it with ``cfg.resume``).

    Args:
        cfg: :class:`TrainConfig`.
        env: an env to train in (tests pass a small one); default builds ``DriveEnv`` from
            ``cfg.data``.
        hook: an :class:`train.experience.ExperienceHook` object to use instead of the one named by
            ``cfg.experience`` (library use).

    Resume (``cfg.resume``): continues the checkpoint's run directory and ``metrics.jsonl``
    (records after the checkpoint's update, left by a kill between a report and the next
    checkpoint, are dropped first, so no update is logged twice or lost), the ``time`` field, the
    env's metric state (EMA slots), weights, optimizer, step counters and RNG. Env and policy
    settings come from the checkpoint; user-set flags that contradict it are refused. Stale
    ``checkpoint.pt.*.tmp`` files of an interrupted write are removed. When the checkpoint already
    reached ``total_timesteps`` nothing is done (and said).

    Returns:
        Summary dict: ``global_step``, ``update``, ``reports`` (list of report records),
        ``checkpoint`` (path of the last checkpoint), ``run_dir``, ``nothing_to_do`` (bool),
        ``data_problems`` (lines listing skipped data files).

    Raises:
        UserError: bad device, missing wandb, conflicting resume flags, a pack that does not
            match user-set ``--env.*`` flags, a run directory that already holds a run.
        FileNotFoundError: missing ``--data``/``--resume``. train.checkpoint.CheckpointError
            (a ValueError): unreadable checkpoint. gpusim.data.ScenarioError: no usable scenario.
    """
    ranks = setup_distributed(cfg.device)  # torchrun: join the process group (train/distributed.py); else no-op
    cfg, ckpt, ckpt_file, run_dir = ranks.from_main(_prepare, cfg)  # rank 0 checks and reads, the others receive
    if ckpt is not None and ckpt["global_step"] >= cfg.total_timesteps:
        if ranks.is_main:
            print(f"nothing to do: {ckpt_file} is at step {ckpt['global_step']:,} >= --total-timesteps "
                  f"{cfg.total_timesteps:,}; pass a larger --total-timesteps to train further")
        ranks.close()
        return {"global_step": ckpt["global_step"], "update": ckpt["update"], "reports": [],
                "checkpoint": str(ckpt_file), "run_dir": str(run_dir), "nothing_to_do": True, "data_problems": []}
    cfg_saved, cfg = cfg, ranks.rank_config(cfg)  # under torchrun: seed + rank, cuda:LOCAL_RANK
    ckpt = ranks.rank_checkpoint(ckpt, cfg_saved.seed) if ckpt is not None else None  # this rank's metric/RNG state
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    env_config, policy_config = cfg.env, cfg.policy
    if ckpt is not None:
        env_config = _env_config_from_dict(ckpt["env_config"])
        policy_config = ActorCritic.from_description(ckpt["policy"]).config
    env_config = coplayer_env_config(env_config, cfg.coplayer, _user_set(cfg, "env"))  # issue 15: one ego/world
    problems: list[str] = []
    if env is None:
        say = (lambda line: problems.append(line) or print(line, file=sys.stderr))
        # on resume the checkpoint's env settings are fixed: a pack that disagrees is named, never adopted
        pack_set = set(PACK_FIELDS) if ckpt is not None else None
        env = ranks.main_first(lambda: make_env(cfg, env_config, user_set=pack_set, resuming=ckpt is not None,
                                                say=say if ranks.is_main else problems.append))
    if isinstance(getattr(env, "config", None), EnvConfig):
        env_config = env.config

    ckpt_dir = resolve_out(cfg.checkpoint_dir) if cfg.checkpoint_dir else run_dir
    ckpt_path = ckpt_dir / CHECKPOINT_FILE if ckpt_file is None or cfg.checkpoint_dir else ckpt_file
    stale = clean_stale_temp_files(ckpt_path) if ranks.is_main else []
    metric_log = _metric_log(env)

    dims = ObsDims.from_layout(env.obs_layout)
    continuous = int(getattr(env, "config", env_config).action_space) == int(ActionSpace.CONTINUOUS)
    policy = ActorCritic(dims, env.num_actions, continuous, policy_config).to(device)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps)
    global_step, update, elapsed, dropped = 0, 0, 0.0, 0
    if ckpt is not None:
        global_step, update, elapsed, dropped = _restore(ckpt, ckpt_file, policy, optimizer, metric_log, run_dir,
                                                         main=ranks.is_main)
    train_policy = ranks.wrap(policy)  # DDP under torchrun (the update trains it); rollouts use `policy`

    if hook is None:
        hook = make_hook(cfg.experience, cfg.experience_arg, hook_context(env, cfg.ppo.gamma))

    W, C, H = env.num_worlds, env.num_slots, env.horizon
    R = W * C
    buffer = RolloutBatch.for_env(env, continuous, device)
    cache = policy.init_cache(R, H, device)
    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed + update)

    config_dict = cfg_saved.to_dict()
    config_dict["env"] = TrainConfig(env=env_config).to_dict()["env"]
    config_dict["policy"] = dataclasses.asdict(policy_config)
    logger = NullLogger(elapsed) if not ranks.is_main else Logger(  # rank 0 alone writes (torchrun)
        run_dir, config_dict, cfg.total_timesteps, quiet=cfg.quiet, wandb=cfg.wandb, wandb_mode=cfg.wandb_mode,
        wandb_project=cfg.wandb_project, run_name=cfg.run_name, append=ckpt is not None, elapsed=elapsed)
    n_params = sum(p.numel() for p in policy.parameters())
    logger.info(f"gpusim train: {W} worlds x {C} slots, horizon {H}, obs {env.obs_dim}, "
                f"policy {n_params:,} params, device {device}, run dir {run_dir}")
    _announce(logger, stale, ckpt_file if ckpt is not None else None, update, global_step, run_dir, dropped)
    extras = RunExtras(cfg, env, device, say=logger.info)  # co-players, trial logs, periodic eval (issue 15)
    rollout = make_rollout(cfg.cuda_graph, env, policy, buffer, cache, say=logger.info)  # CUDA graph (issue 14)

    obs = env.reset(seed=cfg.seed + update)
    reports: list[dict] = []
    last_report_t, last_report_step = time.time(), global_step
    rollout_time = update_time = 0.0
    saved = None
    while global_step < cfg.total_timesteps:
        t0 = time.time()
        policy.eval()
        obs, batch = rollout(obs, coplayers=extras.pool, trial_log=extras.trial_log)
        t1 = time.time()
        if cfg.anneal_lr:
            frac = max(1.0 - global_step / cfg.total_timesteps, 0.0)
            for g in optimizer.param_groups:
                g["lr"] = cfg.learning_rate * frac
        stats, counts = update_policy(train_policy, optimizer, batch, hook, cfg.ppo, gen, dist=ranks)
        t2 = time.time()
        rollout_time += t1 - t0
        update_time += t2 - t1
        update += 1
        active_slots_i = counts["active_slots"]
        global_step += (active_slots_i if active_slots_i > 0 else R) * H

        last = global_step >= cfg.total_timesteps
        extras.after_update(update, last, policy)
        if update % max(cfg.report_interval, 1) == 0 or last:
            now = time.time()
            record = _report_record(update, global_step, now - logger.start,
                                    (global_step - last_report_step) / max(now - last_report_t, 1e-9),
                                    rollout_time, update_time, counts, optimizer, stats, env)
            record = ranks.reduce_report(record, stats, metric_log)  # every rank: reduced over all ranks' agents
            record.update(extras.report())
            logger.log(record)
            if ranks.is_main:
                reports.append(record)
            last_report_t, last_report_step = now, global_step
            rollout_time = update_time = 0.0
        if (cfg.checkpoint_interval > 0 and update % cfg.checkpoint_interval == 0) or last:
            extra = {"run_dir": str(run_dir.resolve()), "elapsed": logger.elapsed,
                     "env_metrics": metric_log.state_dict() if metric_log is not None else None}
            extra = ranks.checkpoint_extra(extra, metric_log)  # every rank: gathers metric and RNG states
            if ranks.is_main:
                saved = save_checkpoint(ckpt_path, policy=policy, optimizer=optimizer, global_step=global_step,
                                        update=update, config=config_dict, env_config=config_dict["env"],
                                        extra=extra)
    logger.close()
    ranks.close()
    return {"global_step": global_step, "update": update, "reports": reports,
            "checkpoint": str(saved) if saved else None, "run_dir": str(run_dir), "nothing_to_do": False,
            "data_problems": problems}


def _announce(logger, stale, ckpt_file, update: int, global_step: int, run_dir, dropped: int) -> None:
    """Console lines about removed temporary files and the resumed checkpoint."""
    for p in stale:
        logger.info(f"removed {p} (left by an interrupted checkpoint write)")
    if ckpt_file is not None:
        logger.info(f"resumed {ckpt_file} at update {update}, step {global_step:,}: continuing "
                    f"{run_dir / 'metrics.jsonl'}" + (f" ({dropped} record(s) after the checkpoint dropped)"
                                                      if dropped else ""))


def _restore(ckpt: dict, ckpt_file, policy, optimizer, metric_log, run_dir: pathlib.Path, main: bool = True):
    """Load a checkpoint's weights, optimizer, RNG and metric state, and cut ``metrics.jsonl`` back
    to its update (:func:`train.logger.truncate_jsonl`; only when ``main``: rank 0 of a torchrun job).

    Returns:
        ``(global_step, update, elapsed seconds, JSONL lines dropped)``.

    Raises:
        UserError: the saved metric state does not fit the env.
    """
    policy.load_state_dict(ckpt["model"])
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


def resolve_out(path: str) -> pathlib.Path:
    """Output directories: relative paths are relative to the current directory."""
    return pathlib.Path(path).expanduser()


#: Errors that are the user's to fix: printed as one line, exit code 2 (ScenarioError and
#: CheckpointError are ValueErrors).
USER_ERRORS = (UserError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, ValueError,
               ImportError)


def one_line(exc: BaseException) -> str:
    """``exc``'s message on one line (first line; the exception type when there is no message)."""
    text = str(exc).strip()
    if isinstance(exc, KeyError) or not text:
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text.splitlines()[0]


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
    sys.exit(main())
