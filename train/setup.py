"""Setting up a training run of ``train/run.py``: the env (data, config reconciliation), the device,
the policy and its optimizer (restored when resuming), the experience hook, the rollout buffers
and the logger.

:func:`build_run` returns everything the training loop needs as one :class:`Run`; the loop itself
is :func:`train.run.train`. The order of the steps matters for reproducibility (each draws from
torch's global generator in turn: env, policy initialisation, restored RNG state) and is the
order written in :func:`build_run`.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from dataclasses import dataclass

import torch

from gpusim.config import EnvConfig
from policy.actor_critic import ActorCritic, PolicyConfig
from train.checkpoint import clean_stale_temp_files
from train.config import TrainConfig, UserError, env_config_from_dict, memory_task_experience, resolve_path
from train.config import user_set as set_by_user
from train.coplayer import coplayer_env_config
from train.distributed import NullLogger
from train.experience import hook_context, make_hook
from train.human import human_policy, init_policy
from train.logger import Logger
from train.packs import PACK_FIELDS, adapt_env_config, data_problems, load_pack, over_cap
from train.ppo import make_optimizer
from train.resume import CHECKPOINT_FILE, announce, resolve_out, restore
from train.rollout import RolloutBatch


def make_env(cfg: TrainConfig, env_config: EnvConfig, user_set: set[str] | None = None, say=print,
             resuming: bool = False):
    """Build the :class:`gpusim.env.DriveEnv` for ``cfg``: load/convert ``cfg.data`` (or open a
    streaming pool with ``cfg.pool_size``), list skipped files (``say``), adapt ``env_config`` to a
    saved pack (:func:`train.packs.adapt_env_config`; ``user_set`` None = the ``--env.*`` fields
    ``cfg`` sets).

    Raises:
        UserError: a negative ``--pool-size`` or ``--resample-every`` < 1; as
        :func:`train.packs.load_pack` and :func:`train.packs.adapt_env_config`.
    """
    from gpusim.env import DriveEnv

    if cfg.pool_size < 0 or cfg.resample_every < 1:
        raise UserError(f"--pool-size {cfg.pool_size} / --resample-every {cfg.resample_every}: need a pool size "
                        f">= 0 (0 = no streaming) and resample-every >= 1")
    pool = None
    if cfg.pool_size > 0:  # streaming: a resident pool refreshed from the data
        from gpusim.data.pool import ScenarioPool
        from gpusim.data.shards import is_sharded

        path = resolve_path(cfg.data)
        src = path if is_sharded(path) else load_pack(cfg.data, env_config, "cpu")
        pool = ScenarioPool(src, cfg.pool_size, cfg.device, seed=cfg.seed, resample_every=cfg.resample_every)
        say(f"streaming: pool of {pool.pool_size} of {pool.num_scenarios} scenarios, {pool.replace} replaced "
            f"every {cfg.resample_every} episode(s)")
    pack = pool.current if pool is not None else load_pack(cfg.data, env_config, cfg.device)
    for line in data_problems(pack) + over_cap(pack, env_config):
        say(line)
    env_config, notes = adapt_env_config(env_config, pack, set_by_user(cfg, "env") if user_set is None
                                         else user_set, resuming=resuming)
    for line in notes:
        say(line)
    return DriveEnv(pool if pool is not None else pack, cfg.num_worlds, config=env_config, device=cfg.device,
                    seed=cfg.seed)


def find_metric_log(env):
    """The env's :class:`gpusim.metrics.EpisodeMetrics` (per-agent EMA state, saved in checkpoints),
    or None when the env has none with ``state_dict``/``load_state_dict``.

    Looked up as ``env.episode_metrics`` (preferred, public), ``env.sim.metrics`` (the
    ``gpusim.sim`` pipeline) or ``env._metrics`` (older DriveEnv and test envs)."""
    sim = getattr(env, "sim", None)
    for m in (getattr(env, "episode_metrics", None), getattr(sim, "metrics", None) if sim is not None else None,
              getattr(env, "_metrics", None)):
        if m is not None and callable(getattr(m, "state_dict", None)) and callable(getattr(m, "load_state_dict", None)):
            return m
    return None


@dataclass
class Run:
    """What the training loop needs, built by :func:`build_run`.

    Attributes:
        cfg: this rank's :class:`TrainConfig` (under torchrun: seed + rank, ``cuda:LOCAL_RANK``).
        env: the env; env_config: its :class:`EnvConfig`. device: ``torch.device``.
        policy: the :class:`ActorCritic` the rollouts use; train_policy: the one the update trains
            (DDP-wrapped under torchrun, else ``policy``). optimizer: Adam over its parameters.
        hook: the experience hook. buffer: the :class:`RolloutBatch` [R = W*C rows, H steps].
        cache: the policy's KV cache for R rows. generator: minibatch permutations (seeded
            ``seed + update``).
        logger: :class:`train.logger.Logger` (rank 0) or a ``NullLogger``. metric_log: the env's
            metric state (saved in checkpoints) or None.
        config_dict: the run's configuration as saved in ``config.json`` and checkpoints.
        ckpt_path: where checkpoints are written. global_step, update: counters (restored on resume).
        problems: lines naming the data files left out.
        human, human_sha: HR-PPO's frozen BC policy and its file's SHA-256 (None without
            ``--ppo.human-policy``; :mod:`train.human`).
    """

    cfg: TrainConfig
    env: object
    env_config: EnvConfig
    device: torch.device
    policy: ActorCritic
    train_policy: torch.nn.Module
    optimizer: torch.optim.Optimizer
    hook: object
    buffer: RolloutBatch
    cache: object
    generator: torch.Generator
    logger: object
    metric_log: object
    config_dict: dict
    ckpt_path: pathlib.Path
    global_step: int = 0
    update: int = 0
    problems: list = dataclasses.field(default_factory=list)
    human: object = None
    human_sha: str | None = None


def _settings(cfg: TrainConfig, ckpt: dict | None) -> tuple[EnvConfig, PolicyConfig]:
    """The env and policy settings of the run: the checkpoint's when resuming, else the flags';
    with co-players the env gets one ego per world unless ``--env.*`` says otherwise."""
    env_config, policy_config = cfg.env, cfg.policy
    if ckpt is not None:
        env_config = env_config_from_dict(ckpt["env_config"])
        policy_config = ActorCritic.from_description(ckpt["policy"]).config
    return coplayer_env_config(env_config, cfg.coplayer, set_by_user(cfg, "env")), policy_config


def _build_env(cfg: TrainConfig, ranks, env_config: EnvConfig, resuming: bool, problems: list):
    """The env of :func:`make_env` built on rank 0 first (it may convert the data); skipped files
    are printed to stderr on rank 0 and collected in ``problems`` on every rank."""
    say = (lambda line: problems.append(line) or print(line, file=sys.stderr))
    # on resume the checkpoint's env settings are fixed: a pack that disagrees is named, never adopted
    pack_set = set(PACK_FIELDS) if resuming else None
    return ranks.main_first(lambda: make_env(cfg, env_config, user_set=pack_set, resuming=resuming,
                                             say=say if ranks.is_main else problems.append))


def _config_dict(cfg: TrainConfig, env_config: EnvConfig, policy_config: PolicyConfig) -> dict:
    """The saved configuration: ``cfg``'s fields with the env and policy settings actually used."""
    out = cfg.to_dict()
    out["env"] = TrainConfig(env=env_config).to_dict()["env"]
    out["policy"] = dataclasses.asdict(policy_config)
    return out


def build_run(cfg: TrainConfig, ranks, ckpt: dict | None, ckpt_file, run_dir: pathlib.Path, env=None,
              hook=None) -> Run:
    """Everything :func:`train.run.train` needs, in the order that makes a run reproducible.

    Args:
        cfg: the prepared config (:func:`train.resume.prepare_run`). ranks: the
            :class:`train.distributed.Distributed` of the job. ckpt, ckpt_file: the checkpoint being
            resumed (None: a new run). run_dir: the run directory. env: an env to train in (None:
            built from ``cfg.data``). hook: an experience hook object (None: ``cfg.experience``).

    Raises:
        as :func:`make_env`, :func:`train.resume.restore` and :func:`train.experience.make_hook`.
    """
    cfg_saved, cfg = cfg, ranks.rank_config(cfg)  # under torchrun: seed + rank, cuda:LOCAL_RANK
    ckpt = ranks.rank_checkpoint(ckpt, cfg_saved.seed) if ckpt is not None else None  # this rank's metric/RNG state
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    env_config, policy_config = _settings(cfg, ckpt)
    problems: list[str] = []
    if env is None:
        env = _build_env(cfg, ranks, env_config, ckpt is not None, problems)
    if isinstance(getattr(env, "config", None), EnvConfig):
        env_config = env.config

    ckpt_dir = resolve_out(cfg.checkpoint_dir) if cfg.checkpoint_dir else run_dir
    ckpt_path = ckpt_dir / CHECKPOINT_FILE if ckpt_file is None or cfg.checkpoint_dir else ckpt_file
    stale = clean_stale_temp_files(ckpt_path) if ranks.is_main else []
    metric_log = find_metric_log(env)

    policy = ActorCritic.for_env(env, policy_config, env_config).to(device)
    continuous = policy.continuous
    optimizer = make_optimizer(policy.parameters(), cfg.learning_rate, cfg.adam_eps, fused=cfg.ppo.fused_adam)
    global_step, update, elapsed, dropped = 0, 0, 0.0, 0
    if ckpt is not None:
        global_step, update, elapsed, dropped = restore(ckpt, ckpt_file, policy, optimizer, metric_log, run_dir,
                                                        main=ranks.is_main)
    if cfg.init_policy and ckpt is None:  # BC initialisation (train/human.py), before DDP copies the weights
        for line in init_policy(policy, cfg.init_policy, env, env_config):
            if ranks.is_main:
                print(line, file=sys.stderr)
    human, human_sha = human_policy(cfg, env, env_config, ckpt)
    train_policy = ranks.wrap(policy)  # DDP under torchrun (the update trains it); rollouts use `policy`
    if hook is None:
        if isinstance(env_config, EnvConfig):  # the memory task refuses the goal-progress shaping (one rule)
            memory_task_experience(dataclasses.replace(cfg, env=env_config), explicit=True)
        hook = make_hook(cfg.experience, cfg.experience_arg, hook_context(env, cfg.ppo.gamma))

    buffer = RolloutBatch.for_env(env, continuous, device)
    cache = policy.init_cache(env.num_worlds * env.num_slots, env.horizon, device)
    generator = torch.Generator(device=device)
    generator.manual_seed(cfg.seed + update)

    config_dict = _config_dict(cfg_saved, env_config, policy_config)
    logger = NullLogger(elapsed) if not ranks.is_main else Logger(  # rank 0 alone writes (torchrun)
        run_dir, config_dict, cfg.total_timesteps, quiet=cfg.quiet, wandb=cfg.wandb, wandb_mode=cfg.wandb_mode,
        wandb_project=cfg.wandb_project, run_name=cfg.run_name, append=ckpt is not None, elapsed=elapsed)
    n_params = sum(p.numel() for p in policy.parameters())
    logger.info(f"gpusim train: {env.num_worlds} worlds x {env.num_slots} slots, horizon {env.horizon}, obs "
                f"{env.obs_dim}, policy {n_params:,} params, device {device}, run dir {run_dir}")
    announce(logger, stale, ckpt_file if ckpt is not None else None, update, global_step, run_dir, dropped)
    return Run(cfg=cfg, env=env, env_config=env_config, device=device, policy=policy, train_policy=train_policy,
               optimizer=optimizer, hook=hook, buffer=buffer, cache=cache, generator=generator, logger=logger,
               metric_log=metric_log, config_dict=config_dict, ckpt_path=ckpt_path, global_step=global_step,
               update=update, problems=problems, human=human, human_sha=human_sha)
