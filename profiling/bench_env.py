"""Env-only throughput: controlled-agent-steps per second of ``DriveEnv.step`` with random actions.

Observations are included (every step builds them). Only controlled agents in active slots count
(DESIGN.md section 9): a world whose scenario has 3 controlled agents adds 3 per step even though
it computes C = 32 slots. Per world count: median over ``--repeats`` timed runs of ``--steps``
steps each, after ``--warmup`` untimed steps.

Usage (from the repository root):

    python profiling/bench_env.py                       # 1, 16, 64, 256 worlds, table
    python profiling/bench_env.py --worlds 64 --json    # one size, JSON on stdout
    python profiling/bench_env.py --pack /tmp/pack      # a saved ScenarioPack (skips conversion)

``--threads`` sets torch's intra-op threads (default 1: on a shared 2-core machine the step is many
small ops, and two threads that wait for each other at every op are much slower than one).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import torch

REPO = pathlib.Path(__file__).resolve().parents[1]


def load_pack(path: str | None, config):
    """A ScenarioPack from a saved pack (dir/.pt) or from a directory of WOMD JSON files."""
    from gpusim.data import ScenarioPack

    p = pathlib.Path(path) if path else REPO / "data" / "womd_sample"
    if (p / "pack.pt").exists() or p.suffix == ".pt":
        return ScenarioPack.load(p)
    files = sorted(f for f in p.glob("*.json*"))
    if not files:
        raise SystemExit(f"no scenario pack or WOMD JSON files in {p}")
    return ScenarioPack.from_json(files, config.data_config())


def bench(pack, config, num_worlds: int, steps: int, repeats: int, warmup: int, device: str, seed: int = 0):
    """Median controlled-agent-steps/s (and seconds per step) of ``num_worlds`` worlds."""
    from gpusim.env import DriveEnv

    env = DriveEnv(pack, num_worlds, config, device=device, seed=seed)
    env.reset()
    g = torch.Generator(device=env.device).manual_seed(seed)
    shape = (num_worlds, env.num_slots) if config.action_space == 0 else (num_worlds, env.num_slots, 2)

    def actions():
        if config.action_space == 0:
            return torch.randint(0, env.num_actions, shape, generator=g, device=env.device)
        return torch.rand(shape, generator=g, device=env.device) * 2 - 1

    for _ in range(warmup):
        env.step(actions())
    rates, per_step = [], []
    for _ in range(repeats):
        count = torch.zeros((), dtype=torch.int64, device=env.device)
        acts = [actions() for _ in range(steps)]
        if env.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for a in acts:
            count += env.state.slot_active.sum()  # the agents that act in this step
            env.step(a)
        if env.device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        rates.append(int(count) / dt)
        per_step.append(dt / steps)
    return {"worlds": num_worlds, "agent_steps_per_s": statistics.median(rates),
            "ms_per_step": 1000 * statistics.median(per_step),
            "agents_per_world": float(env.pack.num_controlled.float().mean())}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pack", default=None, help="saved pack or WOMD JSON dir (default data/womd_sample)")
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--steps", type=int, default=20, help="timed steps per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0 = leave torch's default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--action-space", default="discrete", choices=["discrete", "continuous"])
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from gpusim.backend import backend_for
    from gpusim.config import EnvConfig

    config = EnvConfig(action_space=args.action_space)
    pack = load_pack(args.pack, config)
    rows = [bench(pack, config, w, args.steps, args.repeats, args.warmup, args.device) for w in args.worlds]
    meta = {"device": args.device, "backend": backend_for(torch.empty(0, device=args.device)),
            "threads": torch.get_num_threads(), "scenarios": pack.num_scenarios, "steps": args.steps,
            "repeats": args.repeats, "torch": torch.__version__}
    if args.json:
        json.dump({"meta": meta, "results": rows}, sys.stdout, indent=1)
        print()
        return
    print(f"# env-only, observations included; {meta}")
    print(f"{'worlds':>7} {'agent-steps/s':>14} {'ms/step':>9} {'agents/world':>13}")
    for r in rows:
        print(f"{r['worlds']:>7} {r['agent_steps_per_s']:>14,.0f} {r['ms_per_step']:>9.2f} {r['agents_per_world']:>13.1f}")


if __name__ == "__main__":
    main()
