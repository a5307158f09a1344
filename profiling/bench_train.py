"""End-to-end training throughput of the ``train/run.py`` loop, with a time split.

Runs the trainer's own pieces (``train.setup.make_env``, ``train.rollout.collect_rollout``,
``train.run.update_policy``) on the configuration ``train/run.py`` would use (its defaults, or the
trainer flags given after ``--``), and reports per iteration (one rollout + one PPO update):

* ``sps``: controlled-agent steps per second, counted as ``train/run.py`` counts them (active slots x
  horizon per rollout);
* the split in seconds per iteration: ``env_step`` (``env.step``), ``policy_rollout``
  (``forward_eval`` + ``sample`` + ``log_prob`` while collecting), ``rollout_other`` (buffer writes,
  cache resets), ``advantage`` (GAE / V-trace inside the PPO loss), ``ppo_update`` (the rest of the
  update: hook, forward/backward, optimizer);
* ``peak_rss_mb`` (CPU, process high-water mark) or ``peak_cuda_mb`` (CUDA).

The timers wrap the calls from outside (instance attributes and the ``advantage`` name in
``train.ppo``); the trainer is not modified. On CUDA the wrappers synchronise the device.

``--compare REF`` measures this tree against another commit side by side: it checks ``REF`` out
with ``git worktree add`` (in ``/tmp/bt_<hash>``, reused if present) and runs the benchmark of each
tree in a fresh subprocess, interleaved A/B/A/B for ``--rounds`` rounds, so that a load change on a
shared machine hits both alike; it prints per-tree medians, the ratio of agent-steps/s and the 1-minute
load average before and after (only same-run ratios mean something on a shared machine). Each tree
runs its *own* ``profiling/bench_train.py --json`` with the same trainer flags (so the flags must
exist in both trees), i.e. each tree's default configuration.

Usage (from the repository root)::

    python profiling/bench_train.py                          # default train/run.py config, table
    python profiling/bench_train.py --iters 3 --json
    python profiling/bench_train.py -- --num-worlds 64 --env.max-controlled 8
    python profiling/bench_train.py --compare HEAD~5 --rounds 2 -- --num-threads 1

The trainer flags are parsed as ``train/run.py`` parses them, recipe included (``train/recipes.py``):
on a CUDA device the GPU recipe applies unless ``-- --recipe cpu`` is given. Its update levers are
measured one at a time by switching each off: ``-- --ppo.autocast off``, ``-- --ppo.no-fused-adam``,
``-- --ppo.num-minibatches N``. ``meta`` names the recipe and the levers in use (``recipe``,
``autocast``, ``fused_adam`` = the optimizer really is the fused one, ``num_minibatches``,
``update_epochs``, ``d_model``); every iteration records its ``rows_per_minibatch``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch

PHASES = ("env_step", "policy_rollout", "rollout_other", "advantage", "ppo_update")


def parse_args(argv=None):
    from profiling.cli import split_train_argv

    argv, train_argv = split_train_argv(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="arguments after -- go to train/run.py's parser")
    ap.add_argument("--iters", type=int, default=2, help="timed iterations (rollout + update)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--compare", metavar="REF", default=None,
                    help="also benchmark git commit REF (a worktree in /tmp), interleaved A/B/A/B in subprocesses")
    ap.add_argument("--rounds", type=int, default=2, help="A/B rounds with --compare")
    ap.add_argument("--profile-update", type=int, default=0, metavar="N",
                    help="after the timed iterations, run one more rollout and profile its PPO update "
                         "(torch.profiler); print the N ops with the most self time on the device (CPU: on the host)")
    args = ap.parse_args(argv)
    args.train_argv = train_argv
    return args


ROOT = pathlib.Path(__file__).resolve().parents[1]


def _worktree(ref: str) -> pathlib.Path:
    """A checkout of ``ref`` in ``/tmp/bt_<short hash>`` (``git worktree add --detach``; reused)."""
    import subprocess

    sha = subprocess.run(["git", "rev-parse", "--short=10", f"{ref}^{{commit}}"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    path = pathlib.Path(f"/tmp/bt_{sha}")
    if not (path / "profiling" / "bench_train.py").is_file():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=ROOT, check=True,
                       capture_output=True, text=True)
    return path


def _run_tree(tree: pathlib.Path, args) -> dict:
    """One benchmark of ``tree`` in a subprocess (its own bench_train.py, JSON output)."""
    import subprocess

    cmd = [sys.executable, str(tree / "profiling" / "bench_train.py"), "--json", "--iters", str(args.iters),
           "--warmup", str(args.warmup), "--", *args.train_argv]
    out = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench_train --compare: {tree} failed:\n{out.stderr[-2000:]}")
    text = out.stdout
    return json.loads(text[text.index("{"):])


def compare(args) -> dict:
    """Interleaved A/B benchmark of this tree (A) and ``args.compare`` (B); prints a table."""
    import subprocess

    trees = {"this tree": ROOT, args.compare: _worktree(args.compare)}
    head = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    runs: dict[str, list[dict]] = {k: [] for k in trees}
    load_before = os.getloadavg()[0]
    for r in range(max(args.rounds, 1)):
        for name, tree in trees.items():
            res = _run_tree(tree, args)
            runs[name].append(res["median"])
            print(f"round {r + 1} {name:<12} sps {res['median']['sps']:8,.0f}", file=sys.stderr, flush=True)
    med = {name: {k: statistics.median(m[k] for m in ms) for k in ms[0]} for name, ms in runs.items()}
    a, b = med["this tree"], med[args.compare]
    load_after = os.getloadavg()[0]
    print(f"# bench_train --compare {args.compare}: this tree (HEAD {head} + working changes) vs {args.compare}; "
          f"{args.rounds} interleaved round(s) x {args.iters} iteration(s); trainer flags {args.train_argv}; "
          f"1-min load average {load_before:.1f} before, {load_after:.1f} after")
    print(f"{'':<16}{'this tree':>12}{args.compare:>14}")
    print(f"{'agent-steps/s':<16}{a['sps']:>12,.0f}{b['sps']:>14,.0f}   ratio {a['sps'] / b['sps']:.2f}x")
    for k in ("seconds", *PHASES):
        print(f"{k + ' s':<16}{a[k]:>12.3f}{b[k]:>14.3f}")
    print("per round sps: " + "; ".join(f"{n}: " + ", ".join(f"{m['sps']:.0f}" for m in ms) for n, ms in runs.items()))
    return {"this": a, "ref": b, "ratio": a["sps"] / b["sps"], "runs": runs, "load": (load_before, load_after)}


def _build(cfg) -> dict:
    """The trainer's pieces for ``cfg`` (a parsed ``train.config`` config), as ``train/run.py`` builds them.

    Seeds torch, sets the thread count, builds the env, the policy on ``cfg.device``, the optimizer,
    the experience hook, the rollout buffer, the policy's KV cache (``W x C`` rows, horizon ``H``)
    and the update's generator. Returns them in a dict (keys ``device``, ``env``, ``policy``,
    ``optimizer``, ``hook``, ``buffer``, ``cache``, ``gen``, ``R`` = ``W x C`` policy rows, ``H``).
    """
    from policy.actor_critic import ActorCritic
    import train.ppo as ppo_mod
    from train.experience import hook_context, make_hook
    from train.rollout import RolloutBatch
    from train.setup import make_env

    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    env = make_env(cfg, cfg.env)
    policy = ActorCritic.for_env(env, cfg.policy).to(device)
    continuous = policy.continuous
    optimizer = ppo_mod.make_optimizer(policy.parameters(), cfg.learning_rate, cfg.adam_eps, fused=cfg.ppo.fused_adam)
    hook = make_hook(cfg.experience, cfg.experience_arg, hook_context(env, cfg.ppo.gamma))
    R, H = env.num_worlds * env.num_slots, env.horizon
    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed)
    return {"device": device, "env": env, "policy": policy, "optimizer": optimizer, "hook": hook,
            "buffer": RolloutBatch.for_env(env, continuous, device), "cache": policy.init_cache(R, H, device),
            "gen": gen, "R": R, "H": H}


def _iteration_row(timer, counts: dict, R: int, H: int, t0: float, t1: float, t2: float) -> dict:
    """The record of one timed iteration: agent-steps (active slots x ``H``, or all ``R`` rows when
    the update reports none active), seconds, agent-steps/s and the split of :data:`PHASES` in
    seconds (``t0``/``t1``/``t2``: ``time.perf_counter`` at the rollout's start, the update's start
    and the update's end; ``timer``: the :class:`profiling.timers.KernelTimer` of the iteration)."""
    sec = dict(timer.seconds)
    steps = (counts["active_slots"] if counts["active_slots"] > 0 else R) * H
    rollout = t1 - t0
    update = t2 - t1
    return {
        "agent_steps": steps, "seconds": t2 - t0, "sps": steps / (t2 - t0),
        "env_step": sec.get("env_step", 0.0), "policy_rollout": sec.get("policy_rollout", 0.0),
        "rollout_other": rollout - sec.get("env_step", 0.0) - sec.get("policy_rollout", 0.0),
        "advantage": sec.get("advantage", 0.0), "ppo_update": update - sec.get("advantage", 0.0),
        "optimizer_steps": counts["optimizer_steps"], "rows_per_minibatch": counts["rows_per_minibatch"],
    }


def _timed_iterations(cfg, parts: dict, warmup: int, iters: int) -> list[dict]:
    """Run ``warmup`` untimed then ``iters`` timed iterations (``collect_rollout`` + ``update_policy``)
    on the pieces of :func:`_build`, with timers wrapped around ``env.step``, the policy's rollout
    calls and ``train.ppo.advantage`` (restored afterwards). Returns one :func:`_iteration_row` per
    timed iteration. On CUDA the device is synchronised at each boundary."""
    import train.ppo as ppo_mod
    from train.rollout import collect_rollout
    from train.run import update_policy

    from profiling.timers import KernelTimer

    device, env, policy = parts["device"], parts["env"], parts["policy"]
    timer = KernelTimer(sync_cuda=device.type == "cuda")
    env.step = timer.wrap("env_step", env.step)
    for name in ("forward_eval", "sample", "log_prob"):
        setattr(policy, name, timer.wrap("policy_rollout", getattr(policy, name)))
    saved_adv = ppo_mod.advantage
    ppo_mod.advantage = timer.wrap("advantage", saved_adv)
    obs = env.reset(seed=cfg.seed)
    rows = []
    try:
        for it in range(warmup + iters):
            timer.reset()
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            policy.eval()
            obs, batch = collect_rollout(env, policy, obs, parts["buffer"], parts["cache"])
            if device.type == "cuda":
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            policy.log_prob = policy.log_prob.__wrapped__  # the PPO loss calls it too: time it there as update
            _, counts = update_policy(policy, parts["optimizer"], batch, parts["hook"], cfg.ppo, parts["gen"])
            policy.log_prob = timer.wrap("policy_rollout", policy.log_prob)
            if device.type == "cuda":
                torch.cuda.synchronize()
            t2 = time.perf_counter()
            if it >= warmup:
                rows.append(_iteration_row(timer, counts, parts["R"], parts["H"], t0, t1, t2))
    finally:
        ppo_mod.advantage = saved_adv
    return rows


def _profile_update(cfg, parts: dict, top: int) -> None:
    """Collect one more rollout, then run its PPO update under ``torch.profiler`` and print the
    ``top`` ops by self time on the device (on CUDA; on the CPU by self CPU time), with the
    update's wall time, so that the update's cost can be read op by op."""
    from torch.profiler import ProfilerActivity, profile

    from train.rollout import collect_rollout
    from train.run import update_policy

    device, env, policy = parts["device"], parts["env"], parts["policy"]
    obs = env.reset(seed=cfg.seed + 1)
    policy.eval()
    _, batch = collect_rollout(env, policy, obs, parts["buffer"], parts["cache"])
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        update_policy(policy, parts["optimizer"], batch, parts["hook"], cfg.ppo, parts["gen"])
        if cuda:
            torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(f"# one PPO update under torch.profiler: {wall:.3f} s wall (profiler overhead included); "
          f"top {top} ops by {key}")
    print(prof.key_averages().table(sort_by=key, row_limit=top, max_name_column_width=60))


def _print_table(meta: dict, med: dict, peak: dict) -> None:
    """Print the human-readable summary: agent-steps/s, the per-phase split and the peak memory."""
    print(f"# end-to-end training (train/run.py loop); {meta}")
    if med:
        print(f"SPS {med['sps']:,.0f} controlled-agent-steps/s ({med['agent_steps']:.0f} steps in {med['seconds']:.2f} s "
              f"per iteration, {med['optimizer_steps']:.0f} optimizer steps)")
        for k in PHASES:
            print(f"  {k:<15} {med[k]:8.3f} s  {100 * med[k] / med['seconds']:5.1f}%")
    print(" ".join(f"{k} {v:.0f}" for k, v in peak.items()))


def main(argv=None) -> dict:
    """Run the benchmark; print a table (or JSON) and return the result dict."""
    args = parse_args(argv)
    if args.compare:
        return compare(args)
    from train.config import parse_args as train_parse

    cfg = train_parse(args.train_argv + ["--quiet"])
    parts = _build(cfg)
    device, env, policy = parts["device"], parts["env"], parts["policy"]
    iters = _timed_iterations(cfg, parts, args.warmup, args.iters)
    if args.profile_update > 0:
        _profile_update(cfg, parts, args.profile_update)
    med = {k: statistics.median(i[k] for i in iters) for k in iters[0]} if iters else {}
    peak = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
    if device.type == "cuda":
        peak["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    meta = {"device": str(device), "threads": torch.get_num_threads(), "worlds": env.num_worlds,
            "slots": env.num_slots, "horizon": parts["H"],
            "policy_params": sum(p.numel() for p in policy.parameters()), "iters": args.iters,
            "warmup": args.warmup, "train_argv": args.train_argv, "torch": torch.__version__,
            "recipe": cfg.recipe, "autocast": cfg.ppo.autocast,
            "fused_adam": bool(parts["optimizer"].defaults.get("fused")),
            "num_minibatches": cfg.ppo.num_minibatches, "update_epochs": cfg.ppo.update_epochs,
            "d_model": cfg.policy.d_model}
    result = {"meta": meta, "median": med, "iterations": iters, **peak}
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        print()
        return result
    _print_table(meta, med, peak)
    return result


if __name__ == "__main__":
    main()
