"""Triton kernel launches per env step and the bytes each kernel moves per agent-step.

Runs a few DriveEnv steps on the sample scenarios under the Triton backend (Triton's interpreter
when there is no GPU), intercepts every kernel launch, and from the launch's tensor arguments
derives the memory traffic of one step:

* dense tensors (leading dimension = worlds W, or the W x C rows of the EMA log): every element
  is read once (inputs) or written once (arguments named ``out_*`` / ``o_*``; the EMA's in-place
  ``slots`` / ``has`` count as read and written) -- the full tensor size. A world's agent arrays
  read by all of its slots' programs (partners, collision pairs) count once: this assumes they
  stay in cache; an input aliasing an output (placeholder for an unused optional input) is skipped;
* scenario tables of the pack (``traj_*``, ``seg``, ``rtype``, ``grid``, ``origin``, ``dims``) are
  gathered, not streamed: they count as ``rows gathered x bytes per row``, with the rows per
  kernel given by :data:`GATHERS` (e.g. observations read the ``K = num_roads`` candidate
  segments of each slot's grid cell).

Bytes are upper bounds for masked-out work (a kernel may skip inactive slots' loads) and assume no
cache reuse for gathers. Normalised per agent-step = per policy slot (W x C) and step. Timings are not
measured here (see ``profiling/bench_env.py``).

Usage::

    python profiling/kernel_costs.py [--worlds 4] [--steps 3] [--data data/womd_sample] [--only launches|graph|bytes]

Prints a Markdown table of kernel launches per env step (Triton launches and the other torch
kernels, ``profiling.launches.count_ops``) for three configurations (env defaults, trainer
defaults, trial mode; docs/performance.md reproduces it), the launches left outside the CUDA graph
by the graphed rollout (:func:`graphed_launch_counts`), then a table per behaviour set with one
row per kernel and its bytes (docs/kernels.md reproduces those). Launches are counted with the GPU
launch sizes (``gpusim.backend.gpu_launch_sizes``).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import pathlib
import statistics
import sys

import torch

if not torch.cuda.is_available():  # must be set before gpusim defines its kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from profiling.launches import count_ops, record_launches  # noqa: E402

#: Table arguments that kernels gather from, and how many rows each processed item reads:
#: kernel -> {argument: function(sizes) -> rows per launch}. ``sizes`` has W, A, C, K, KE, N.
GATHERS = {
    "_replay_kernel": {  # one log index per agent
        "traj_pos_ptr": lambda z: z["W"] * z["A"], "traj_heading_ptr": lambda z: z["W"] * z["A"],
        "traj_vel_ptr": lambda z: z["W"] * z["A"], "traj_valid_ptr": lambda z: z["W"] * z["A"],
    },
    "_offroad_kernel": {  # per controlled slot: its cell's KE road edges
        "seg_ptr": lambda z: z["W"] * z["C"] * z["KE"], "grid_ptr": lambda z: z["W"] * z["C"],
        "origin_ptr": lambda z: z["W"] * z["C"], "dims_ptr": lambda z: z["W"] * z["C"],
    },
    "_reset_agents_kernel": {  # one log step per agent (upper bound: only masked agents read it)
        "traj_pos_ptr": lambda z: z["W"] * z["A"], "traj_heading_ptr": lambda z: z["W"] * z["A"],
        "traj_vel_ptr": lambda z: z["W"] * z["A"], "traj_valid_ptr": lambda z: z["W"] * z["A"],
        "exists_ptr": lambda z: z["W"] * z["A"],
    },
    "_new_goal_kernel": {  # per agent: its cell's K road candidates (upper bound: masked agents only)
        "seg_ptr": lambda z: z["W"] * z["A"] * z["K"], "rtype_ptr": lambda z: z["W"] * z["A"] * z["K"],
        "grid_ptr": lambda z: z["W"] * z["A"], "origin_ptr": lambda z: z["W"] * z["A"],
        "dims_ptr": lambda z: z["W"] * z["A"],
    },
    "_observations_kernel": {  # per slot: its cell's K road candidates
        "seg_ptr": lambda z: z["W"] * z["C"] * z["K"], "rtype_ptr": lambda z: z["W"] * z["C"] * z["K"],
        "grid_ptr": lambda z: z["W"] * z["C"], "origin_ptr": lambda z: z["W"] * z["C"],
        "dims_ptr": lambda z: z["W"] * z["C"],
    },
}
IN_PLACE = {"slots_ptr", "has_ptr"}


def _row_bytes(t: torch.Tensor, arg: str, z: dict) -> int:
    """Bytes of one gathered row of table ``t`` (the grid table row is one cell's candidate list)."""
    if arg == "grid_ptr":
        return t.shape[-1] * t.element_size()
    if arg in ("origin_ptr", "dims_ptr"):
        return t.shape[-1] * t.element_size()
    if arg.startswith("traj_"):  # [S, A, T, ...]: one step of one agent
        return (t[0, 0, 0].numel() if t.dim() > 3 else 1) * t.element_size()
    if arg == "seg_ptr":
        return t.shape[-1] * t.element_size()
    return t.element_size()


def launch_bytes(name: str, args: dict, z: dict) -> tuple[int, int]:
    """(bytes read, bytes written) of one launch, by the rules of the module docstring."""
    read = written = 0
    gathers = GATHERS.get(name, {})
    outs = {v.data_ptr() for a, v in args.items()
            if isinstance(v, torch.Tensor) and (a.startswith("out") or a.startswith("o_"))}
    for arg, v in args.items():
        if not isinstance(v, torch.Tensor):
            continue
        if v.data_ptr() in outs and not (arg.startswith("out") or arg.startswith("o_")):
            continue  # a placeholder pointer aliasing an output (e.g. an unused optional input)
        if arg in gathers:
            read += gathers[arg](z) * _row_bytes(v, arg, z)
        elif arg.startswith("out") or arg.startswith("o_"):
            written += v.numel() * v.element_size()
        elif arg in IN_PLACE:
            read += v.numel() * v.element_size()
            written += v.numel() * v.element_size()
        else:
            read += v.numel() * v.element_size()
    return read, written


def measure(pack, config, worlds: int, steps: int, seed: int = 0):
    """Per kernel: (launches per step, bytes read / written per agent-step) over ``steps`` steps."""
    from gpusim.backend import use_backend
    from gpusim.env import DriveEnv

    env = DriveEnv(pack, worlds, config, seed=seed)
    z = dict(W=worlds, A=config.max_agents, C=config.max_controlled, K=config.num_roads,
             KE=pack.grid_edge.shape[-1], N=worlds * config.max_controlled)
    g = torch.Generator().manual_seed(seed)
    with use_backend("triton"):
        env.reset()
        with record_launches() as log:
            for _ in range(steps):
                env.step(torch.randint(0, env.num_actions, (worlds, env.num_slots), generator=g))
    per = collections.defaultdict(lambda: [0, 0, 0])
    for name, args in log:
        r, w = launch_bytes(name, args, z)
        p = per[name]
        p[0] += 1
        p[1] += r
        p[2] += w
    agent_steps = steps * worlds * config.max_controlled
    return {k: (v[0] / steps, v[1] / agent_steps, v[2] / agent_steps) for k, v in per.items()}


def launch_counts(pack, config, worlds: int, steps: int, seed: int = 0, device="cpu") -> dict:
    """Kernel launches per ``DriveEnv.step`` under the Triton backend (``profiling.launches.count_ops``),
    with the env on ``device`` (``"cpu"``: the Triton interpreter, ``TRITON_INTERPRET=1``; a CUDA
    device: the compiled kernels).

    Returns:
        ``{"triton": [per step], "torch": [per step], "top": [(op, launches per step), ...]}``:
        Triton launches and other torch kernels (device ops outside the Triton kernels) of each of
        ``steps`` steps after a reset (random valid actions drawn outside the count), and the most
        frequent torch ops, averaged over the steps.
    """
    from gpusim.backend import gpu_launch_sizes, use_backend
    from gpusim.env import DriveEnv

    env = DriveEnv(pack, worlds, config, seed=seed, device=device)
    g = torch.Generator().manual_seed(seed)  # CPU draws (the same on every device), moved before counting
    discrete = int(config.action_space) == 0
    res = {"triton": [], "torch": []}
    total = collections.Counter()
    with use_backend("triton"), gpu_launch_sizes():
        env.reset()
        for _ in range(steps):
            if discrete:
                a = torch.randint(0, env.num_actions, (worlds, env.num_slots), generator=g)
            else:
                a = torch.rand((worlds, env.num_slots, 2), generator=g) * 2 - 1
            a = a.to(env.device)
            with count_ops() as c:
                env.step(a)
            res["triton"].append(c["triton"])
            res["torch"].append(c["torch"])
            total.update({k[6:]: v for k, v in c.items() if k.startswith("torch:")})
    res["top"] = [(k, v / steps) for k, v in total.most_common(8)]
    return res


def launch_configs(base):
    """The configurations of the launch-count table: env defaults, trainer defaults, trial mode."""
    sets = {"default `EnvConfig()`": base}
    try:
        from train.config import TrainConfig

        sets["trainer defaults (`train/config.py`)"] = TrainConfig().env
    except ImportError as e:  # pragma: no cover  (train/ not importable)
        print(f"# trainer config unavailable: {e}", file=sys.stderr)
    sets["trial mode (`goal_behavior=trial`)"] = base.replace(goal_behavior="trial")
    return sets


def print_launch_table(pack_for, worlds: int, steps: int, base) -> None:
    """Print the Markdown launch-count table (one row per configuration)."""
    print("### Kernel launches per env step (Triton backend)\n")
    print("| configuration | Triton launches / step | other torch kernels / step | total | most frequent torch ops "
          "(per step) |")
    print("|---|---:|---:|---:|---|")
    for label, cfg in launch_configs(base).items():
        r = launch_counts(pack_for(cfg), cfg, worlds, steps)
        tri, tor = statistics.median(r["triton"]), statistics.median(r["torch"])
        rng = lambda xs: f"{min(xs)}-{max(xs)}" if min(xs) != max(xs) else f"{xs[0]}"  # noqa: E731
        top = ", ".join(f"{k} {v:g}" for k, v in r["top"][:6])
        print(f"| {label} | {tri:g} ({rng(r['triton'])}) | {tor:g} ({rng(r['torch'])}) | {tri + tor:g} | {top} |")
    print(f"\nMedian over {steps} steps after a reset, W = {worlds} (range in brackets).\n")


def _counting_capture():
    """A :class:`gpusim.cuda_graph.FakeGraphCapture` that notes, in its ``marks`` list, the live op
    count (Triton + torch launches of the ``counter`` set on it, a ``count_ops`` counter) at the
    entry and exit of each replay; no marks while ``counter`` is None."""
    from gpusim.cuda_graph import FakeGraphCapture

    class Counting(FakeGraphCapture):
        """Fake capture that notes the live op count at the entry and exit of each replay."""

        counter = None

        def capture(self, fn, roots=None):
            graph = super().capture(fn, roots)
            replay = graph.replay

            def counted():
                c = self.counter
                a = c["triton"] + c["torch"] if c is not None else 0
                replay()
                if c is not None:
                    self.marks.append((a, c["triton"] + c["torch"]))

            graph.replay = counted
            return graph

    capture = Counting()
    capture.marks = []
    return capture


def _default_policy(env, config):
    """The trainer's default policy (``TrainConfig().policy``) for ``env``, in eval mode; its
    ``max_roads`` limit is dropped when ``config`` has fewer roads (a smaller test config)."""
    from policy.actor_critic import ActorCritic
    from train.config import TrainConfig

    pc = TrainConfig().policy
    if pc.max_roads is not None and pc.max_roads > config.num_roads:  # a smaller test config
        pc = dataclasses.replace(pc, max_roads=None)
    return ActorCritic.for_env(env, pc).eval()


def _count_rollouts(env, roll, capture, buf, seed: int) -> tuple[int, list[int]]:
    """Under the Triton backend (GPU launch sizes, no grad): a warm-up graphed rollout that
    captures, a counted graphed rollout (``capture.marks`` filled), then an eager rollout counted
    step by step. Returns (all launches of the counted graphed rollout, the eager rollout's
    launches: ``begin_rollout`` then each of its ``H`` steps)."""
    from gpusim.backend import gpu_launch_sizes, use_backend
    from train.rollout import begin_rollout, rollout_step

    eager = []
    with use_backend("triton"), gpu_launch_sizes(), torch.no_grad():
        obs, _ = roll(env.reset(seed=seed))  # warm-up and capture
        with count_ops() as c:
            capture.counter = c
            obs, _ = roll(obs)
            capture.counter = None
        total = c["triton"] + c["torch"]
        with count_ops() as e:
            ego = begin_rollout(env, roll.actor, buf)  # the same policy.actor.Actor, eagerly
        eager.append(e["triton"] + e["torch"])
        for t in range(env.horizon):
            with count_ops() as e:
                obs = rollout_step(env, roll.actor, t, obs, buf, ego)
            eager.append(e["triton"] + e["torch"])
    return total, eager


def graphed_launch_counts(pack, config, worlds: int, seed: int = 0) -> dict:
    """Launches outside the graph for the CUDA-graph rollout (``train/graphed_rollout.py``), and
    the eager rollout's for comparison.

    Runs :class:`train.graphed_rollout.GraphedRollout` with the trainer's default policy under the
    Triton backend (GPU launch sizes) and a counting stand-in for the CUDA graph
    (:class:`gpusim.cuda_graph.FakeGraphCapture`: a replay re-runs the captured step; here its
    ops are subtracted and the replay counts as **one** launch, which is what a GPU issues). The
    first rollout warms up and captures; the second, counted, is the steady state. Then an eager
    rollout (:func:`train.rollout.begin_rollout` + :func:`train.rollout.rollout_step`, what
    :func:`train.rollout.collect_rollout` runs) is counted step by step.

    Returns:
        ``{"replayed": launches of a replayed step (the replay + the copies outside it, median),
        "before": launches before the first replay of the rollout (``begin_rollout`` and the copy
        of the new episode's state into the static buffers), "end": the eager episode-end step,
        "rollout": all launches of the graphed rollout outside the graph, "horizon": H,
        "eager_begin", "eager_step" (median), "eager_end", "eager_rollout": the eager rollout's,
        "captures", "replays"}``.
    """
    from gpusim.env import DriveEnv
    from train.graphed_rollout import GraphedRollout
    from train.rollout import RolloutBatch

    torch.manual_seed(seed)
    env = DriveEnv(pack, worlds, config, seed=seed)
    policy = _default_policy(env, config)
    R, H = worlds * env.num_slots, env.horizon
    buf = RolloutBatch.for_env(env, policy.continuous)
    cache = policy.init_cache(R, H, env.device)
    capture = _counting_capture()
    roll = GraphedRollout(env, policy, buf, cache, capture=capture)
    total, eager = _count_rollouts(env, roll, capture, buf, seed)
    if roll.fallback_reason is not None:
        raise RuntimeError(f"the graphed rollout fell back to eager: {roll.fallback_reason}")
    marks = capture.marks
    inner = sum(b - a for a, b in marks)
    between = [marks[i + 1][0] - marks[i][1] for i in range(len(marks) - 1)]
    return {"replayed": 1 + statistics.median(between), "before": marks[0][0], "end": total - marks[-1][1],
            "rollout": total - inner + len(marks), "horizon": H, "eager_begin": eager[0],
            "eager_step": statistics.median(eager[1:-1]), "eager_end": eager[-1], "eager_rollout": sum(eager),
            "captures": roll.stats["captures"], "replays": len(marks)}


def print_graphed_table(pack_for, worlds: int, base, scenario_length: int) -> None:
    """Print the Markdown table of launches outside the graph for the graphed rollout. Measured
    with ``scenario_length`` steps per (trial) episode; the per-step counts do not depend on it,
    the last column amortises them over the configuration's own horizon."""
    print("### Launches per env step outside the CUDA graph (graphed rollout, env + policy)\n")
    print("| configuration | eager step (median) | eager episode-end step | replayed step | "
          "before the first replay | graphed episode-end step (eager) | per env step over the horizon H: "
          "eager → graphed |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for label, cfg in launch_configs(base).items():
        short = cfg.replace(scenario_length=min(cfg.scenario_length, scenario_length))
        r = graphed_launch_counts(pack_for(cfg), short, worlds)
        H = cfg.horizon
        eager = (r["eager_begin"] + (H - 1) * r["eager_step"] + r["eager_end"]) / H
        # H - 1 replays, and the copies between them (the first step's are in "before")
        graphed = (r["before"] + (H - 1) + (H - 2) * (r["replayed"] - 1) + r["end"]) / H
        print(f"| {label} | {r['eager_step']:g} | {r['eager_end']} | {r['replayed']:g} | {r['before']} | "
              f"{r['end']} | H = {H}: {eager:.1f} → {graphed:.1f} |")
    print(f"\nW = {worlds}, the trainer's default policy; a replay counts as 1 launch (the captured env step, "
          f"policy forward, sampling and buffer writes). Counted on the second graphed rollout (the first "
          f"warms up and captures), episodes of {scenario_length} steps per trial; the last column puts "
          "the per-step counts over the configuration's horizon.\n")


def main(argv=None) -> int:
    """Print the launch-count table (three configurations) and the bytes tables (four behaviour sets)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(REPO / "data" / "womd_sample"))
    ap.add_argument("--worlds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--graph-steps", type=int, default=6,
                    help="steps per (trial) episode when counting the graphed rollout (per-step counts do not "
                         "depend on it; the interpreter is slow)")
    ap.add_argument("--only", choices=["launches", "graph", "bytes"], default=None,
                    help="print only the launch-count table, the graphed-rollout table or the bytes tables")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from gpusim.config import EnvConfig
    from gpusim.data import ScenarioPack

    files = sorted(pathlib.Path(args.data).glob("*.json*"))
    if not files:
        print(f"no scenarios in {args.data}", file=sys.stderr)
        return 2
    base = EnvConfig()
    packs = {}

    def pack_for(cfg):
        key = cfg.data_config()
        if key not in packs:
            packs[key] = ScenarioPack.from_json(files, key)
        return packs[key]

    if args.only in (None, "launches"):
        print_launch_table(pack_for, args.worlds, args.steps, base)
    if args.only in (None, "graph"):
        print_graphed_table(pack_for, args.worlds, base, args.graph_steps)
    if args.only in ("launches", "graph"):
        return 0
    pack = pack_for(base)
    sets = {
        "contact ignore": base,
        "collision remove, offroad stop": base.replace(collision_behavior="remove", offroad_behavior="stop"),
        "goal respawn": base.replace(goal_behavior="respawn"),
        "goal new_goal": base.replace(goal_behavior="new_goal"),
    }
    print(f"W = {args.worlds} worlds, C = {base.max_controlled} slots, A = {base.max_agents} agents, "
          f"K = {base.num_roads} roads, P = {base.num_partners} partners, KE = {pack.grid_edge.shape[-1]} "
          f"edges per cell; bytes per agent-step (per policy slot and step)\n")
    for label, cfg in sets.items():
        res = measure(pack, cfg, args.worlds, args.steps)
        print(f"### {label}\n")
        print("| kernel | launches / step | bytes read / agent-step | bytes written / agent-step |")
        print("|---|---:|---:|---:|")
        tot = [0.0, 0.0, 0.0]
        for name, (n, r, w) in res.items():
            print(f"| `{name}` | {n:g} | {r:,.0f} | {w:,.0f} |")
            tot = [tot[0] + n, tot[1] + r, tot[2] + w]
        print(f"| **total** | {tot[0]:g} | {tot[1]:,.0f} | {tot[2]:,.0f} |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
