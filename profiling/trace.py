"""Export a ``torch.profiler`` trace (Chrome trace JSON) of a few env steps, optionally of one
training iteration too.

Open the file in https://ui.perfetto.dev or ``chrome://tracing``. Each env step is a
``gpusim.step`` range and every stage of the step (``motion``, ``contacts``, ``observe``, ...;
``gpusim.sim.pipeline.PIPELINE``) is a named range inside it (``torch.profiler.record_function``),
with the aten ops below.

Usage (from the repository root)::

    python profiling/trace.py                                 # 64 worlds, 5 steps -> trace_env.json
    python profiling/trace.py --worlds 256 --steps 3 --out /tmp/env.json
    python profiling/trace.py --train --out /tmp/train.json -- --num-worlds 8   # + one training iteration
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch
from torch.profiler import ProfilerActivity, profile, record_function


class _Ranges:
    """Stage ranges: a stand-in for :class:`profiling.timers.KernelTimer` whose stage ``hook``
    puts each stage of the step in a ``record_function`` range instead of timing it."""

    def hook(self, name, call):
        with record_function(name):
            return call()


def parse_args(argv=None):
    from profiling.cli import split_train_argv

    argv, train_argv = split_train_argv(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="arguments after -- go to train/run.py's parser (with --train)")
    ap.add_argument("--data", default=None, help="saved pack or WOMD JSON dir (default data/womd_sample)")
    ap.add_argument("--worlds", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5, help="profiled env steps (after --warmup)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--max-controlled", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--train", action="store_true", help="also profile one training iteration")
    ap.add_argument("--out", default="trace_env.json", help="Chrome trace JSON file to write")
    args = ap.parse_args(argv)
    args.train_argv = train_argv
    return args


def main(argv=None) -> dict:
    """Write the trace; returns ``{"out": path, "events": n, "steps": steps}``."""
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from gpusim.config import EnvConfig
    from gpusim.env import DriveEnv

    from profiling.bench_env import load_pack
    from profiling.timers import instrument_env

    config = EnvConfig(max_controlled=args.max_controlled)
    pack = load_pack(args.data, config)
    env = DriveEnv(pack, args.worlds, config, device=args.device, seed=0)
    env.reset()
    g = torch.Generator(device=env.device).manual_seed(0)

    def actions():
        return torch.randint(0, env.num_actions, (args.worlds, env.num_slots), generator=g, device=env.device)

    for _ in range(args.warmup):
        env.step(actions())
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if env.device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as prof:
        with instrument_env(_Ranges(), env):
            for _ in range(args.steps):
                a = actions()
                with record_function("gpusim.step"):
                    env.step(a)
        if args.train:
            with record_function("train.iteration"):
                _train_iteration(args.train_argv)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out))
    with open(out) as f:
        n = len(json.load(f).get("traceEvents", []))
    print(f"wrote {out} ({n} events, {args.steps} env steps{' + 1 training iteration' if args.train else ''}); "
          f"open it in https://ui.perfetto.dev or chrome://tracing")
    return {"out": str(out), "events": n, "steps": args.steps}


def _train_iteration(train_argv):
    """One rollout + PPO update of the train/run.py configuration (``train_argv`` = trainer flags)."""
    from policy.actor_critic import ActorCritic
    from train.config import parse_args as train_parse
    from train.experience import hook_context, make_hook
    from train.rollout import RolloutBatch, collect_rollout
    from train.run import update_policy
    from train.setup import make_env

    cfg = train_parse(list(train_argv) + ["--quiet"])
    device = torch.device(cfg.device)
    env = make_env(cfg, cfg.env)
    policy = ActorCritic.for_env(env, cfg.policy).to(device)
    continuous = policy.continuous
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps)
    R, H = env.num_worlds * env.num_slots, env.horizon
    buf = RolloutBatch.for_env(env, continuous, device)
    cache = policy.init_cache(R, H, device)
    obs = env.reset(seed=cfg.seed)
    with record_function("train.rollout"):
        policy.eval()
        obs, batch = collect_rollout(env, policy, obs, buf, cache)
    with record_function("train.update"):
        hook = make_hook(cfg.experience, cfg.experience_arg, hook_context(env, cfg.ppo.gamma))
        update_policy(policy, opt, batch, hook, cfg.ppo)


if __name__ == "__main__":
    main()
