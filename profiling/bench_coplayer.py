"""Training throughput with 0, 1 and 4 frozen partner checkpoints (population play).

Runs the trainer's own pieces (``train.setup.make_env``, ``train.rollout.collect_rollout`` with a
:class:`train.coplayer.CoplayerPool`, ``train.run.update_policy``) on the configuration
``train/run.py`` would use (its defaults, or the trainer flags given after ``--``), once per
partner count:

* ``0``: no co-players (every controlled slot is an ego: today's training);
* ``N >= 1``: ``--env.ego-slots 1`` (one ego per world) and N partner checkpoints of the ego's own
  size (random weights, saved to a temporary directory and loaded like ``--coplayer`` files), so a
  step costs the ego forward over all slots plus one ``forward_eval`` per partner over its slots.

Per setting it prints the median over ``--iters`` timed iterations (one rollout + one PPO update,
after ``--warmup``) of: ``agent_sps`` (controlled-agent steps simulated per second, every slot),
``ego_sps`` (trained ego steps per second: what ``train/run.py``'s ``sps`` counts), the rollout and
update seconds.

Usage (from the repository root)::

    python profiling/bench_coplayer.py                       # partners 0 1 4, trainer defaults
    python profiling/bench_coplayer.py --partners 0 1 4 --iters 2 -- --num-worlds 16 --num-threads 1
    python profiling/bench_coplayer.py --json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch


def parse_args(argv=None):
    from profiling.cli import split_train_argv

    argv, train_argv = split_train_argv(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="arguments after -- go to train/run.py's parser")
    ap.add_argument("--partners", type=int, nargs="+", default=[0, 1, 4], help="partner counts to measure")
    ap.add_argument("--iters", type=int, default=2, help="timed iterations (rollout + update)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    return ap.parse_args(argv), train_argv


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(cfg, partners: int, iters: int, warmup: int, tmp: pathlib.Path) -> dict:
    """Median timings of ``iters`` iterations with ``partners`` partner checkpoints."""
    from policy.actor_critic import ActorCritic
    from train.checkpoint import save_checkpoint
    from train.coplayer import make_pool
    from train.rollout import RolloutBatch, collect_rollout
    from train.run import update_policy
    from train.setup import make_env

    env_config = cfg.env.replace(ego_slots=1) if partners else cfg.env.replace(ego_slots=0, ego_fraction=0.0)
    env = make_env(cfg, env_config, say=lambda line: None)
    device = torch.device(cfg.device)
    torch.manual_seed(cfg.seed)
    policy = ActorCritic.for_env(env, cfg.policy).to(device)
    continuous = policy.continuous
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps)
    paths = []
    for i in range(partners):
        torch.manual_seed(1000 + i)
        p = ActorCritic.for_env(env, cfg.policy)
        paths.append(str(save_checkpoint(tmp / f"partner{i}.pt", policy=p, optimizer=torch.optim.Adam(p.parameters()),
                                         global_step=0, update=0, config={}, env_config={})))
    pool = make_pool(paths, env, device, seed=cfg.seed) if paths else None
    W, C, H = env.num_worlds, env.num_slots, env.horizon
    R = W * C
    buffer = RolloutBatch.for_env(env, continuous, device)
    cache = policy.init_cache(R, H, device)
    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed)
    obs = env.reset(seed=cfg.seed)
    rows = []
    for it in range(warmup + iters):
        policy.eval()
        agents = int(env.state.slot_active.sum())  # controlled slots of the episode about to run
        _sync(device)
        t0 = time.perf_counter()
        obs, batch = collect_rollout(env, policy, obs, buffer, cache, coplayers=pool)
        _sync(device)
        t1 = time.perf_counter()
        egos = int(batch.slot_active.sum())
        update_policy(policy, optimizer, batch, None, cfg.ppo, gen)
        _sync(device)
        t2 = time.perf_counter()
        if it >= warmup:
            rows.append({"rollout_s": t1 - t0, "update_s": t2 - t1, "iter_s": t2 - t0,
                         "ego_sps": egos * H / (t2 - t0), "agent_sps": agents * H / (t2 - t0)})
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return {"partners": partners, "worlds": W, "slots": C, "horizon": H, **med}


def main(argv=None) -> int:
    from train.config import parse_args as parse_train

    args, train_argv = parse_args(argv)
    cfg = parse_train(train_argv)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.partners:
            out.append(measure(cfg, n, args.iters, args.warmup, pathlib.Path(tmp)))
    info = {"device": cfg.device, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "config": {"num_worlds": cfg.num_worlds, "policy": dataclasses.asdict(cfg.policy)}, "results": out}
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"device {cfg.device}, {info['threads']} thread(s), {out[0]['worlds']} worlds x {out[0]['slots']} slots, "
          f"horizon {out[0]['horizon']}")
    print(f"{'partners':>8} {'iter s':>8} {'rollout s':>10} {'update s':>9} {'agent steps/s':>14} "
          f"{'ego steps/s':>12}")
    for r in out:
        print(f"{r['partners']:>8} {r['iter_s']:>8.2f} {r['rollout_s']:>10.2f} {r['update_s']:>9.2f} "
              f"{r['agent_sps']:>14.0f} {r['ego_sps']:>12.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
