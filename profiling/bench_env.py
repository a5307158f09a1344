"""Env-only throughput of ``DriveEnv.step`` with random actions, observations included.

Reports, for every (worlds, max_controlled) pair of the sweep:

* ``agent_steps_per_s``: controlled-agent-steps per second. Only controlled agents in active slots
  count (docs/design.md section 15): a world whose scenario has 3 controlled agents adds 3 per step even
  though it has C = ``max_controlled`` slots;
* ``world_steps_per_s``, ``ms_per_step`` and ``us_per_agent_step`` (the cost of one agent-step);
* ``breakdown_ms`` (with ``--breakdown``): milliseconds per step in each stage of the step
  (``motion``, ``replay``, ``contacts``, ``rewards``, ``goals``, ``trial``, ``accounting``,
  ``restart``, ``observe``: ``gpusim.sim.pipeline.PIPELINE``, timed through the env's stage hook by
  ``profiling/timers.py``; synchronised on CUDA) and ``other`` (action check, result);
* memory: ``state_bytes_per_world`` (the ``EnvState`` tensors), ``obs_bytes_per_world`` (the
  observation buffer) and ``pack_bytes`` (the scenario pack, shared by all worlds);
* ``reset_s``: seconds of the first ``env.reset()`` and ``first_step_s`` of the first step (on the
  CPU the first use builds the C kernels unless they are cached);
* ``episode_end_step_ms`` / ``other_step_ms`` (with ``--episode-end``): the step that ends an
  episode (auto-reset) vs the median other step of the same episodes.

``--compare REF`` runs this script twice per round, the current tree (A) and REF (B: a commit-ish,
exported with ``git archive``, or a directory), interleaved A/B, B/A, ... and prints A/B ratios of
agent-steps/s (``profiling/compare.py``); ``--ref-backend`` gives B another backend.

Timing: ``--warmup`` untimed steps, then the median (``--stat min``: the fastest) over ``--repeats``
runs of ``--steps`` steps, wall clock (``--clock cpu``: this process's CPU time).

Usage (from the repository root)::

    python profiling/bench_env.py                                # 1 ... 1024 worlds, table
    python profiling/bench_env.py --worlds 64 256 --max-controlled 8 32 --breakdown
    python profiling/bench_env.py --worlds 64 --json              # JSON on stdout
    python profiling/bench_env.py --data /tmp/pack                # a saved ScenarioPack or WOMD JSON dir

``--threads`` sets torch's intra-op threads (default 1: on a shared 2-core machine the step is many
small ops, and two threads that wait for each other at every op are often slower than one).
``--backend torch`` (default) is the CPU step as the env runs it by default: ``EnvConfig.cpu_kernels``
True, i.e. the hand-written C kernels (``gpusim/kernels/*.c``, ``observations/cpu.c``, built
at first use) with the remaining torch ops around them. ``--scenarios balanced`` gives every size the
same scenario mix (world ``w`` runs scenario ``w mod S``), so per-agent costs compare across sizes.
``--backend triton`` needs CUDA (Triton's CPU interpreter is a test tool, far too slow to time).
``--graphed`` steps through :class:`gpusim.graphed_env.GraphedEnv` (steady steps replayed from a CUDA
graph; only meaningful on CUDA: elsewhere it steps eagerly and prints the reason once); the
``--breakdown`` pass always runs eagerly (its stage hook turns the graph off).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

if __package__ in (None, ""):  # `python profiling/bench_env.py`: make `profiling` importable
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_WORLDS = [1, 16, 64, 256, 1024]


def load_pack(path: str | None, config):
    """A ScenarioPack for ``config``: a saved pack (directory with ``pack.pt`` or ``.pt`` file) or a
    directory / glob of WOMD JSON files converted with ``config.data_config()``.

    Raises:
        SystemExit: nothing usable at ``path``, or a saved pack built for another ``max_controlled``.
    """
    from gpusim.data import ScenarioPack

    p = pathlib.Path(path) if path else REPO / "data" / "womd_sample"
    if (p / "pack.pt").exists() or p.suffix == ".pt":
        pack = ScenarioPack.load(p)
        if pack.config.max_controlled != config.max_controlled or pack.config.max_agents != config.max_agents:
            raise SystemExit(
                f"{p}: saved pack has max_controlled={pack.config.max_controlled}, max_agents={pack.config.max_agents}; "
                f"pass --max-controlled {pack.config.max_controlled} or a WOMD JSON directory")
        return pack
    files = sorted(f for f in p.glob("*.json*")) if p.is_dir() else [p]
    if not files or not files[0].exists():
        raise SystemExit(f"no scenario pack or WOMD JSON files in {p}")
    return ScenarioPack.from_json(files, config.data_config())


def tensor_bytes(obj) -> int:
    """Bytes of all tensors that are attributes of a dataclass-like object."""
    return sum(v.numel() * v.element_size() for v in vars(obj).values() if isinstance(v, torch.Tensor))


def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def bench(pack, config, num_worlds: int, steps: int, repeats: int, warmup: int, device: str, seed: int = 0,
          breakdown: bool = False, episode_end: bool = False, scenarios: str = "drawn",
          clock: str = "wall", stat: str = "median", graphed: bool = False) -> dict:
    """Measure one configuration (see the module docstring for the keys of the returned dict).
    ``scenarios``: ``"drawn"`` (the env's seeded draw) or ``"balanced"`` (world ``w`` runs scenario
    ``w mod S``, the same mix at every size; see ``--scenarios``). ``clock``: ``"wall"``
    (``time.perf_counter``) or ``"cpu"`` (``time.process_time``: this process's CPU time, all its
    threads; for the CPU backends on a machine shared with other jobs) for the timed steps (the
    ``breakdown`` is always wall clock, as :class:`profiling.timers.KernelTimer`). ``stat``:
    ``"median"`` or ``"min"`` of the repeats (the fastest repeat: the least disturbed by other jobs).
    ``graphed``: step through :class:`gpusim.graphed_env.GraphedEnv` (timed steps, warm-up, episode-end
    times; not the breakdown); the row's ``graph`` says ``"captured"`` or why it stepped eagerly."""
    from gpusim.env import DriveEnv

    env = DriveEnv(pack, num_worlds, config, device=device, seed=seed)
    stepper = env
    if graphed:
        from gpusim.graphed_env import GraphedEnv

        stepper = GraphedEnv(env, say=lambda msg: None)  # the reason is printed once by main()
    chosen = (torch.arange(num_worlds, device=env.device) % pack.num_scenarios) if scenarios == "balanced" else None
    if chosen is not None and 1 + warmup + repeats * steps > env.horizon:
        print(f"bench_env: --scenarios balanced: 1 + --warmup + --repeats x --steps = {1 + warmup + repeats * steps} "
              f"steps cross the auto-reset at step {env.horizon}; the repeats after it run redrawn scenarios "
              f"(keep the total <= {env.horizon} to compare sizes on the same mix)", file=sys.stderr)
    _sync(env.device)
    t_reset = time.perf_counter()
    env.reset(scenarios=chosen)
    _sync(env.device)
    t_reset = time.perf_counter() - t_reset
    g = torch.Generator(device=env.device).manual_seed(seed)
    discrete = int(config.action_space) == 0
    shape = (num_worlds, env.num_slots) if discrete else (num_worlds, env.num_slots, 2)

    def actions():
        if discrete:
            return torch.randint(0, env.num_actions, shape, generator=g, device=env.device)
        return torch.rand(shape, generator=g, device=env.device) * 2 - 1

    t_first = time.perf_counter()
    stepper.step(actions())  # the first step builds or loads the C kernels
    _sync(env.device)
    t_first = time.perf_counter() - t_first
    for _ in range(warmup):
        stepper.step(actions())
    rates, per_step, agents = _timed_repeats(env, stepper, actions, steps, repeats, clock)
    best = min(range(repeats), key=lambda i: per_step[i])  # --stat min: the fastest repeat
    pick = (lambda xs: xs[best]) if stat == "min" else statistics.median
    ms = 1000 * pick(per_step)
    row = {
        "worlds": num_worlds,
        "max_controlled": config.max_controlled,
        "agents_per_step": pick(agents),
        "agent_steps_per_s": pick(rates),
        "world_steps_per_s": num_worlds / pick(per_step),
        "ms_per_step": ms,
        "us_per_agent_step": 1000 * ms / max(pick(agents), 1e-9),
        "state_bytes_per_world": tensor_bytes(env.state) / num_worlds,
        "obs_bytes_per_world": env.num_slots * env.obs_dim * 4,
        "pack_bytes": env.pack.nbytes(),
        "reset_s": t_reset,
        "first_step_s": t_first,
    }
    if graphed:
        row["graph"] = "captured" if stepper.fallback_reason is None else stepper.fallback_reason
    if episode_end:
        row.update(_episode_end_times(stepper, actions, repeats))
    if breakdown:
        row.update(_stage_breakdown(env, actions, steps))
    return row


def _timed_repeats(env, stepper, actions, steps: int, repeats: int, clock: str):
    """Time ``repeats`` runs of ``steps`` steps of ``stepper`` (``env`` itself or its GraphedEnv),
    the actions drawn by ``actions()`` before each run's clock starts. ``clock``: ``"wall"``
    (``time.perf_counter``) or ``"cpu"`` (``time.process_time``). Synchronised on CUDA.

    Returns:
        ``(rates, per_step, agents)``: per repeat, controlled-agent-steps per second (active slots
        summed over the steps), seconds per step and active agents per step.
    """
    timer = time.process_time if clock == "cpu" else time.perf_counter
    rates, per_step, agents = [], [], []
    for _ in range(repeats):
        count = torch.zeros((), dtype=torch.int64, device=env.device)
        acts = [actions() for _ in range(steps)]
        _sync(env.device)
        t0 = timer()
        for a in acts:
            count += env.state.slot_active.sum()  # the agents that act in this step
            stepper.step(a)
        _sync(env.device)
        dt = timer() - t0
        n = int(count)
        rates.append(n / dt)
        per_step.append(dt / steps)
        agents.append(n / steps)
    return rates, per_step, agents


def _stage_breakdown(env, actions, steps: int) -> dict:
    """Milliseconds per step in each pipeline stage over ``steps`` eager steps of ``env`` (the
    stage hook of ``profiling.timers.instrument_env``, wall clock as
    :class:`profiling.timers.KernelTimer`), plus ``other`` (total minus the stages, at least 0).

    Returns:
        ``{"breakdown_ms": {stage: ms per step, ..., "other": ms}, "breakdown_total_ms": ms per step}``.
    """
    from profiling.timers import KernelTimer, instrument_env

    clock_fn = time.perf_counter  # wall clock, as KernelTimer's per-stage times
    ktimer = KernelTimer(sync_cuda=env.device.type == "cuda")
    acts = [actions() for _ in range(steps)]
    with instrument_env(ktimer, env):  # per-stage times (gpusim.sim.pipeline.PIPELINE)
        _sync(env.device)
        t0 = clock_fn()
        for a in acts:
            env.step(a)
        _sync(env.device)
        total = 1000 * (clock_fn() - t0) / steps
    rep = ktimer.report(steps)
    rep["other"] = max(0.0, total - sum(rep.values()))
    return {"breakdown_ms": rep, "breakdown_total_ms": total}


def pick_round(rounds: list[dict], stat: str) -> dict:
    """One row of several rounds of the same size: the fastest (``stat="min"``) or the median round
    by ``ms_per_step``; ``rounds_ms`` lists every round's ms/step."""
    order = sorted(rounds, key=lambda r: r["ms_per_step"])
    row = dict(order[0] if stat == "min" else order[(len(order) - 1) // 2])
    row["rounds_ms"] = [r["ms_per_step"] for r in rounds]
    return row


def _episode_end_times(env, actions, repeats: int) -> dict:
    """Milliseconds of the step that ends an episode (auto-reset: new scenarios drawn, initial
    state, observation of the new episode) vs the median other step of the same episodes.

    ``env``: a DriveEnv or a GraphedEnv. Steps the env to the end of its current episode, then through ``max(1, repeats // 2)`` whole
    episodes, timing every step."""
    dev = env.device
    end_ms, other_ms = [], []
    while env.episode_step != 0:
        env.step(actions())
    for _ in range(max(1, repeats // 2)):
        for _ in range(env.horizon):
            a = actions()
            _sync(dev)
            t0 = time.perf_counter()
            env.step(a)
            _sync(dev)
            ms = 1000 * (time.perf_counter() - t0)
            (end_ms if env.episode_step == 0 else other_ms).append(ms)
    med = statistics.median(other_ms)
    end = statistics.median(end_ms)
    return {"episode_end_step_ms": end, "other_step_ms": med, "episode_end_ratio": end / med}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", "--pack", dest="data", default=None,
                    help="saved pack or WOMD JSON dir (default data/womd_sample)")
    ap.add_argument("--worlds", type=int, nargs="+", default=DEFAULT_WORLDS)
    ap.add_argument("--max-controlled", type=int, nargs="+", default=[32])
    ap.add_argument("--steps", type=int, default=20, help="timed steps per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0 = leave torch's default)")
    ap.add_argument("--device", default=None, help="default: cuda for --backend triton, else cpu")
    ap.add_argument("--backend", default="torch", choices=["torch", "triton"],
                    help="torch: the CPU step (EnvConfig.cpu_kernels=True, the default: the hand-written C "
                         "kernels of gpusim/kernels/*.c and observations/cpu.c, built at first use, torch "
                         "ops around them); triton: the kernels (needs CUDA)")
    ap.add_argument("--action-space", default="discrete", choices=["discrete", "continuous"])
    ap.add_argument("--stat", default="median", choices=["median", "min"],
                    help="median (default) or min (the fastest repeat) of the --repeats timed runs")
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                    help="wall: wall-clock time of the timed steps; cpu: this process's CPU time (time.process_time, "
                         "all threads): on a CPU machine shared with other jobs it leaves out the time other "
                         "processes hold the cores (CPU backends only: GPU time is not CPU time)")
    ap.add_argument("--scenarios", default="drawn", choices=["drawn", "balanced"],
                    help="drawn: the env's seeded draw at reset (the mix differs between sizes: with 10 "
                         "scenarios, 64 worlds may draw more of the heavy ones); balanced: world w runs scenario "
                         "w mod S at reset, the same mix at every size (compare per-agent costs across sizes; "
                         "auto-resets still draw)")
    ap.add_argument("--breakdown", action="store_true", help="also time each stage of the step (per-stage ms/step)")
    ap.add_argument("--episode-end", action="store_true",
                    help="also time the step that ends an episode (auto-reset) against the other steps")
    ap.add_argument("--graphed", action="store_true",
                    help="step through gpusim.graphed_env.GraphedEnv (CUDA-graph replay of the steady steps; "
                         "needs CUDA, else eager with the reason printed once; --breakdown stays eager)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--compare", metavar="REF", default=None,
                    help="A/B: this tree vs REF (a git commit-ish of this repository, or a directory holding "
                         "another checkout), interleaved A/B, B/A, ... in one run; prints ratios (profiling/compare.py)")
    ap.add_argument("--ref-backend", default=None, choices=["torch", "triton"],
                    help="with --compare: the backend of the REF side (default: --backend)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="with --compare: A/B rounds (default 3); without: run the whole sweep this many times, "
                         "sizes interleaved, and keep per size the round picked by --stat (min: the fastest; "
                         "default 1)")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    """Run the sweep; print a table (or JSON with ``--json``) and return the result dict."""
    args = parse_args(argv)
    if args.compare is not None:
        from profiling.compare import compare_main

        return compare_main(args, sys.argv[1:] if argv is None else list(argv))
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from gpusim.backend import use_backend
    from gpusim.config import EnvConfig

    device = args.device or ("cuda" if args.backend == "triton" else "cpu")
    if args.backend == "triton" and not device.startswith("cuda"):
        raise SystemExit("--backend triton needs a CUDA device (the CPU interpreter is not a benchmark)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        print(f"bench_env: --device {device}: no CUDA device is available to torch "
              f"(torch {torch.__version__}); use --backend torch on the CPU", file=sys.stderr)
        raise SystemExit(2)
    rows = []
    pack_bytes = {}
    with use_backend(args.backend):
        for mc in args.max_controlled:
            config = EnvConfig(action_space=args.action_space, max_controlled=mc)
            pack = load_pack(args.data, config)
            pack_bytes[mc] = pack.nbytes()
            # rounds: the sweep over sizes is repeated, so a slow spell of a shared machine hits every
            # size alike; per size the --stat of the rounds is kept (min: the least disturbed round)
            runs = {w: [] for w in args.worlds}
            for _ in range(max(1, args.rounds or 1)):
                for w in args.worlds:
                    runs[w].append(bench(pack, config, w, args.steps, args.repeats, args.warmup, device,
                                         breakdown=args.breakdown, episode_end=args.episode_end,
                                         scenarios=args.scenarios, clock=args.clock, stat=args.stat,
                                         graphed=args.graphed))
            rows += [pick_round(runs[w], args.stat) for w in args.worlds]
    for r in rows:  # per-agent cost against the largest size of the same C (flatness across sizes)
        big = max((b for b in rows if b["max_controlled"] == r["max_controlled"]), key=lambda b: b["worlds"])
        r["per_agent_vs_largest"] = r["us_per_agent_step"] / big["us_per_agent_step"]
    meta = {"device": device, "backend": args.backend, "threads": torch.get_num_threads(),
            "mix": args.scenarios, "clock": args.clock, "stat": args.stat,
            "scenarios": pack.num_scenarios, "steps": args.steps, "repeats": args.repeats, "warmup": args.warmup,
            "rounds": max(1, args.rounds or 1), "graphed": args.graphed,
            "torch": torch.__version__, "data": str(args.data or "data/womd_sample"),
            "loadavg_1min": _loadavg()}
    result = {"meta": meta, "results": rows}
    for reason in sorted({r["graph"] for r in rows if r.get("graph", "captured") != "captured"}):
        print(f"bench_env: --graphed: stepping eagerly: {reason}", file=sys.stderr)
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        print()
        return result
    print(f"# env-only, observations included; {meta}")
    print(f"{'worlds':>7} {'C':>3} {'agents':>7} {'agent-steps/s':>14} {'world-steps/s':>14} {'ms/step':>9} "
          f"{'us/agent-step':>14} {'vs largest':>10} {'state KB/w':>10} {'obs KB/w':>9} {'reset s':>8} {'1st step s':>10}")
    for r in rows:
        print(f"{r['worlds']:>7} {r['max_controlled']:>3} {r['agents_per_step']:>7.0f} {r['agent_steps_per_s']:>14,.0f} "
              f"{r['world_steps_per_s']:>14,.0f} {r['ms_per_step']:>9.2f} {r['us_per_agent_step']:>14.2f} "
              f"{r['per_agent_vs_largest']:>9.2f}x "
              f"{r['state_bytes_per_world'] / 1024:>10.1f} {r['obs_bytes_per_world'] / 1024:>9.1f} "
              f"{r['reset_s']:>8.2f} {r['first_step_s']:>10.2f}")
    if args.episode_end:
        print("\n# episode-end step (auto-reset) vs the other steps of the same episodes, ms")
        for r in rows:
            print(f"worlds={r['worlds']} C={r['max_controlled']}: episode end {r['episode_end_step_ms']:.2f}, "
                  f"other {r['other_step_ms']:.2f} (x{r['episode_end_ratio']:.2f})")
    if args.breakdown:
        print("\n# per-kernel ms/step")
        for r in rows:
            parts = " ".join(f"{k}={v:.2f}" for k, v in sorted(r["breakdown_ms"].items(), key=lambda kv: -kv[1]))
            print(f"worlds={r['worlds']} C={r['max_controlled']}: {parts}")
    print(f"\n# pack bytes (shared by all worlds): {pack_bytes}")
    return result


def _loadavg():
    try:
        import os

        return os.getloadavg()[0]
    except OSError:
        return None


if __name__ == "__main__":
    main()
