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
import math
import pathlib
import sys
import time

if __package__ in (None, ""):  # `python train/run.py` from a checkout without `pip install -e .`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch

from gpusim.config import ActionSpace, EnvConfig
from policy.actor_critic import ActorCritic
from policy.encoders import ObsDims
from train.checkpoint import load_checkpoint, save_checkpoint
from train.config import TrainConfig, parse_args, resolve_path
from train.experience import make_hook
from train.logger import Logger
from train.ppo import optimizer_steps, ppo_update
from train.rollout import RolloutBatch, collect_rollout

CHECKPOINT_FILE = "checkpoint.pt"


def load_pack(data: str, env_config: EnvConfig, device="cpu"):
    """Scenario pack from ``data``: a saved pack (``pack.pt`` directory or ``.pt`` file) is loaded,
    anything else is converted from WOMD JSON with ``env_config.data_config()``.

    Raises:
        FileNotFoundError: if ``data`` does not exist. gpusim.data.ScenarioError: if no scenario
        in it is usable.
    """
    from gpusim.data import ScenarioPack

    path = resolve_path(data)
    if not path.exists():
        raise FileNotFoundError(f"--data {data}: no such file or directory (also tried {path})")
    if path.suffix == ".pt" or (path.is_dir() and (path / "pack.pt").exists()):
        return ScenarioPack.load(path, device=device)
    return ScenarioPack.from_json(path, env_config.data_config()).to(device)


def make_env(cfg: TrainConfig, env_config: EnvConfig):
    """Build the :class:`gpusim.env.DriveEnv` for ``cfg``."""
    from gpusim.env import DriveEnv

    pack = load_pack(cfg.data, env_config, cfg.device)
    return DriveEnv(pack, cfg.num_worlds, config=env_config, device=cfg.device, seed=cfg.seed)


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


def update_policy(policy, optimizer, batch: RolloutBatch, hook, ppo_cfg, generator=None) -> tuple[dict, dict]:
    """Experience hook, then the masked PPO update on one rollout.

    Args:
        policy, optimizer: the model and its optimizer. batch: the rollout.
        hook: an :class:`train.experience.ExperienceHook`, or ``None`` (no hook at all).
        ppo_cfg: :class:`train.ppo.PPOConfig`. generator: for the minibatch permutations.

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
    stats = ppo_update(policy, optimizer, batch, ppo_cfg, n_steps, rows_per_mb, active_rows, generator)
    counts = {"nominal_steps": nominal_i, "effective_steps": effective_i, "active_slots": active_slots_i,
              "optimizer_steps": n_steps, "rows_per_minibatch": rows_per_mb}
    return stats, counts


def train(cfg: TrainConfig, env=None, hook=None) -> dict:
    """Run training.

    Args:
        cfg: :class:`TrainConfig`.
        env: an env to train in (tests pass a small one); default builds ``DriveEnv`` from
            ``cfg.data``.
        hook: an :class:`train.experience.ExperienceHook` object to use instead of the one named by
            ``cfg.experience`` (library use).

    Returns:
        Summary dict: ``global_step``, ``update``, ``reports`` (list of report records),
        ``checkpoint`` (path of the last checkpoint), ``run_dir``.

    Raises:
        ValueError: for an unusable configuration; errors from data loading and checkpoints.
    """
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    ckpt = None
    env_config = cfg.env
    policy_config = cfg.policy
    if cfg.resume:
        ckpt = load_checkpoint(resolve_path(cfg.resume))
        env_config = _env_config_from_dict(ckpt["env_config"])
        policy_config = ActorCritic.from_description(ckpt["policy"]).config
    if env is None:
        env = make_env(cfg, env_config)
    if isinstance(getattr(env, "config", None), EnvConfig):
        env_config = env.config

    run_name = cfg.run_name or time.strftime("%Y%m%d-%H%M%S") + f"-s{cfg.seed}"
    run_dir = resolve_out(cfg.log_dir) / run_name
    ckpt_dir = resolve_out(cfg.checkpoint_dir) if cfg.checkpoint_dir else run_dir
    ckpt_path = ckpt_dir / CHECKPOINT_FILE

    dims = ObsDims.from_layout(env.obs_layout)
    continuous = int(getattr(env, "config", env_config).action_space) == int(ActionSpace.CONTINUOUS)
    policy = ActorCritic(dims, env.num_actions, continuous, policy_config).to(device)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps)
    global_step, update = 0, 0
    if ckpt is not None:
        policy.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        global_step, update = ckpt["global_step"], ckpt["update"]
        torch.set_rng_state(ckpt["rng"])

    context = {"scenario_ids": list(getattr(getattr(env, "pack", None), "scenario_ids", []))}
    if hook is None:
        hook = make_hook(cfg.experience, cfg.experience_arg, context)

    W, C, H = env.num_worlds, env.num_slots, env.horizon
    R = W * C
    buffer = RolloutBatch.empty(R, H, env.obs_dim, continuous, env.num_actions if continuous else 1, device)
    cache = policy.init_cache(R, H, device)
    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed + update)

    config_dict = cfg.to_dict()
    config_dict["env"] = TrainConfig(env=env_config).to_dict()["env"]
    config_dict["policy"] = dataclasses.asdict(policy_config)
    logger = Logger(run_dir, config_dict, cfg.total_timesteps, quiet=cfg.quiet, wandb=cfg.wandb,
                    wandb_mode=cfg.wandb_mode, wandb_project=cfg.wandb_project, run_name=run_name,
                    append=ckpt is not None)
    n_params = sum(p.numel() for p in policy.parameters())
    logger.info(f"gpusim train: {W} worlds x {C} slots, horizon {H}, obs {env.obs_dim}, "
                f"policy {n_params:,} params, device {device}, run dir {run_dir}")

    obs = env.reset(seed=cfg.seed + update)
    reports: list[dict] = []
    last_report_t, last_report_step = time.time(), global_step
    rollout_time = update_time = 0.0
    saved = None
    while global_step < cfg.total_timesteps:
        t0 = time.time()
        policy.eval()
        obs, batch = collect_rollout(env, policy, obs, buffer, cache)
        t1 = time.time()
        if cfg.anneal_lr:
            frac = max(1.0 - global_step / cfg.total_timesteps, 0.0)
            for g in optimizer.param_groups:
                g["lr"] = cfg.learning_rate * frac
        stats, counts = update_policy(policy, optimizer, batch, hook, cfg.ppo, gen)
        nominal_i, effective_i, active_slots_i, n_steps = (
            counts["nominal_steps"], counts["effective_steps"], counts["active_slots"], counts["optimizer_steps"])
        t2 = time.time()
        rollout_time += t1 - t0
        update_time += t2 - t1
        update += 1
        global_step += (active_slots_i if active_slots_i > 0 else R) * H

        last = global_step >= cfg.total_timesteps
        if update % max(cfg.report_interval, 1) == 0 or last:
            now = time.time()
            record = {
                "update": update,
                "global_step": global_step,
                "time": now - logger.start,
                "sps": (global_step - last_report_step) / max(now - last_report_t, 1e-9),
                "rollout_s": rollout_time,
                "update_s": update_time,
                "optimizer_steps": n_steps,
                "valid_steps": nominal_i,
                "effective_steps": effective_i,
                "lr": optimizer.param_groups[0]["lr"],
            }
            keys = list(stats)
            vals = torch.stack([stats[k].float() for k in keys]).tolist()
            record.update({k: v for k, v in zip(keys, vals) if k != "valid_steps"})
            record.update(_env_metrics(env))
            logger.log(record)
            reports.append(record)
            last_report_t, last_report_step = now, global_step
            rollout_time = update_time = 0.0
        if (cfg.checkpoint_interval > 0 and update % cfg.checkpoint_interval == 0) or last:
            saved = save_checkpoint(ckpt_path, policy=policy, optimizer=optimizer, global_step=global_step,
                                    update=update, config=config_dict, env_config=config_dict["env"])
    logger.close()
    return {"global_step": global_step, "update": update, "reports": reports,
            "checkpoint": str(saved) if saved else None, "run_dir": str(run_dir)}


def resolve_out(path: str) -> pathlib.Path:
    """Output directories: relative paths are relative to the current directory."""
    return pathlib.Path(path).expanduser()


def main(argv=None) -> int:
    """CLI entry point."""
    cfg = parse_args(argv, description=__doc__.split("\n\n")[0])
    summary = train(cfg)
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
