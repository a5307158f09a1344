"""``python train/evaluate.py --checkpoint C [--data DIR]``: deterministic (argmax / mean action)
evaluation of a trained policy; prints the metrics as one JSON line.

The env settings come from the checkpoint (the policy was trained for them). Each evaluation
episode runs every world for one full horizon; metrics are the env's means over all agent-episodes
that finished (``episode_return``, ``goal_reached``, ``collided``, ``offroad``, ``score``, ``n``) —
plain means (``env.metrics(kind="mean")``), not the per-agent EMA used in training reports.

Trial mode (docs/trial.md): ``--k-trials K`` evaluates with ``goal_behavior=trial`` and K trials
per episode (whatever the policy was trained with) and adds ``trial_k_score`` and
``ada_delta_trial_k_minus_0``. ``--human-replay`` controls only one agent per world (the first
controlled one: the self-driving car when it qualifies); every other agent is log-replayed. It
builds the pack with ``max_controlled = 1`` (from WOMD JSON; a saved pack built for more slots is
rejected with a clear error).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch

from gpusim.config import ActionSpace
from policy.actor_critic import ActorCritic
from train.checkpoint import load_checkpoint
from train.config import cli_registry, default_device, resolve_path
from train.rollout import RolloutBatch, collect_rollout
from train.run import _env_config_from_dict, load_pack


@dataclasses.dataclass
class EvalConfig:
    """Arguments of ``train/evaluate.py``.

    Attributes:
        checkpoint: checkpoint file written by ``train/run.py``.
        data: scenarios (default ``data/womd_sample``, relative to the cwd or the repo root).
        num_worlds: parallel worlds. episodes: evaluation episodes (each = one horizon of every
            world). seed: scenario draws. device: ``cuda`` if available else ``cpu``.
        stochastic: sample actions instead of argmax.
        k_trials: > 0: evaluate in trial mode with this many trials per episode (0 = as trained).
        human_replay: one controlled agent per world, all others log-replayed.
    """

    checkpoint: str
    data: str = "data/womd_sample"
    num_worlds: int = 16
    episodes: int = 4
    seed: int = 12345
    device: str = dataclasses.field(default_factory=default_device)
    stochastic: bool = False
    k_trials: int = 0
    human_replay: bool = False


def _plain_metrics(env) -> dict:
    """Plain means over the agent-episodes finished since the last call (not the training EMA)."""
    try:
        return env.metrics(kind="mean")
    except TypeError:  # an env whose metrics() has no kinds
        return env.metrics()


@torch.no_grad()
def evaluate(cfg: EvalConfig) -> dict:
    """Run the evaluation and return the metrics dict.

    Raises:
        FileNotFoundError / ValueError: for a missing or invalid checkpoint or data.
    """
    from gpusim.env import DriveEnv

    ck = load_checkpoint(resolve_path(cfg.checkpoint))
    env_config = _env_config_from_dict(ck["env_config"])
    if cfg.k_trials < 0:
        raise ValueError(f"--k-trials must be >= 0, got {cfg.k_trials}")
    if cfg.k_trials > 0:
        env_config = env_config.replace(goal_behavior="trial", k_trials=cfg.k_trials)
    if cfg.human_replay:
        env_config = env_config.replace(max_controlled=1)
    pack = load_pack(cfg.data, env_config, cfg.device)
    env = DriveEnv(pack, cfg.num_worlds, config=env_config, device=cfg.device, seed=cfg.seed)
    policy = ActorCritic.from_description(ck["policy"]).to(cfg.device)
    policy.load_state_dict(ck["model"])
    policy.eval()
    torch.manual_seed(cfg.seed)
    continuous = env_config.action_space == ActionSpace.CONTINUOUS
    R, H = env.num_worlds * env.num_slots, env.horizon
    buf = RolloutBatch.empty(R, H, env.obs_dim, continuous, env.num_actions if continuous else 1, cfg.device)
    cache = policy.init_cache(R, H, cfg.device)
    obs = env.reset(seed=cfg.seed)
    _plain_metrics(env)  # discard anything before the evaluation
    for _ in range(cfg.episodes):
        obs, _ = collect_rollout(env, policy, obs, buf, cache, deterministic=not cfg.stochastic)
    out = {k: float(v) for k, v in _plain_metrics(env).items()}
    out.update({"checkpoint": str(cfg.checkpoint), "global_step": ck["global_step"], "episodes": cfg.episodes,
                "num_worlds": cfg.num_worlds, "deterministic": not cfg.stochastic,
                "k_trials": env_config.k_trials if env_config.trial_mode else 0, "human_replay": cfg.human_replay})
    return out


def main(argv=None) -> int:
    """CLI entry point."""
    import tyro

    cfg = tyro.cli(EvalConfig, args=argv, registry=cli_registry(), description=__doc__.split("\n\n")[0])
    print(json.dumps(evaluate(cfg)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
