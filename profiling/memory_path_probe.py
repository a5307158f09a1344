"""Does the policy's memory path carry trial 0's outcome into trial 1? A supervised check.

``python profiling/memory_path_probe.py --data DIR [--worlds 16 --batches 6 --steps 300]``

The memory task (docs/trial.md) asks an RL policy to learn two things at once: to drive to a
candidate goal, and to use what its KV cache holds from trial 0 in trial 1. When PPO shows no
adaptation this script separates the two. It drives the memory task with a scripted driver
(:class:`train.baselines.SteerToGoal` pointed, in trial 0, at one candidate drawn per agent; in
trial 1 full braking, so that nothing the agent does or sees in trial 1 hints at the true
candidate: an earlier version drove trial 1 toward the true goal, and the memoryless control then
read the answer off its own heading), records whole episodes as the trainer's rollout does (observations,
terminal, truncation, removed-when-observed), and then trains, by supervised learning, the
policy's own encoder and causal transformer (``policy.ActorCritic``, the training recipe's sizes)
with a linear head to name the true candidate (its index in the observation's candidate block)
at every step of trial 1 of the agents whose trial 0 ended at a candidate (the true one or a
decoy: either tells which one is true when K = 2).

Two variants use the same data and the same model: ``memory`` (the attention spans the episode:
the memory reset is ``terminal``, as ``--policy.memory episode`` trains) and ``control`` (the reset
is ``terminal | truncation``, as the memoryless control ``--policy.memory trial``). The control
can only guess (accuracy 0.5 on balanced labels); a memory path that works lets ``memory`` reach
near 1 on episodes it was not trained on. The printed table gives the accuracy on held-out
episodes (other env seeds) after training.

Everything runs on the CPU in a few minutes (``--threads``). Raises ``SystemExit(2)`` with one
line for a ``--data`` that cannot be loaded.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpusim.env import DriveEnv  # noqa: E402
from gpusim.kernels import dynamics  # noqa: E402
from policy.actor_critic import ActorCritic  # noqa: E402
from train.baselines import SteerToGoal  # noqa: E402
from train.config import TrainConfig  # noqa: E402
from train.packs import load_pack  # noqa: E402


def record(pack, cfg, worlds: int, seed: int) -> dict:
    """One episode of every world, driven by the scripted driver (module docstring).

    Returns a dict of [R, H] tensors (R = worlds x slots rows, H = env.horizon):
    ``obs`` [R, H, D] float32, ``terminal``, ``truncation``, ``removed`` bool, and per row
    ``label`` [R] int64 (the true candidate's index), ``informative`` [R] bool (trial 0 ended at a
    candidate) and ``trial1`` [R, H] bool (the step belongs to trial 1).
    """
    env = DriveEnv(pack, worlds, config=cfg, seed=seed)
    obs = env.reset(seed=seed)
    W, C, H = env.num_worlds, env.num_slots, env.horizon
    gen = torch.Generator().manual_seed(seed)
    aim = torch.randint(0, cfg.goal_candidates, (W, C), generator=gen)
    steer = SteerToGoal()
    brake = dynamics.encode_actions(torch.full((W, C), -dynamics.MAX_ACCEL), torch.zeros(W, C), cfg.action_space)
    out = {k: [] for k in ("obs", "terminal", "truncation", "removed", "trial1")}
    removed = torch.zeros(W, C, dtype=torch.bool)
    reached = torch.zeros(W, C, dtype=torch.bool)
    label = env.state.cand_true.clone()
    active = env.state.slot_active.clone()
    for _ in range(H):
        trial1 = (env.state.trial_count >= 1)[:, None].expand(W, C)
        out["obs"].append(obs.clone())
        out["removed"].append(removed.clone())
        out["trial1"].append(trial1.clone())
        true_goal = env.state.goal.clone()
        target = env.state.goal_cand.gather(2, aim[..., None, None].expand(W, C, 1, 2))[:, :, 0]
        goal = true_goal.clone()
        goal[:, :C] = target
        env.state = env.state.replace(goal=goal)
        actions = torch.where(trial1, brake, steer(env))  # trial 1: stand still (no hint of the truth)
        env.state = env.state.replace(goal=true_goal)
        res = env.step(actions)
        reached |= ~trial1 & (env.state.at_decoy | res.info["goal_reached"])
        obs = res.obs
        removed = res.removed.clone()
        out["terminal"].append(res.terminal.clone())
        out["truncation"].append(res.truncation.clone())
    stacked = {k: torch.stack(v, dim=2).reshape(W * C, H, *v[0].shape[2:]) for k, v in out.items()}
    stacked["label"] = label.reshape(-1)
    stacked["informative"] = (reached & active).reshape(-1)
    return stacked


def probe(train: dict, test: dict, reset: str, steps: int, lr: float, seed: int, env,
          policy_config) -> tuple[float, float, int]:
    """Train model + head on ``train`` rows (a policy for ``env``), return (train accuracy, test
    accuracy, test steps)."""
    torch.manual_seed(seed)
    model = ActorCritic.for_env(env, policy_config)
    head = torch.nn.Linear(policy_config.d_model, 2)
    opt = torch.optim.Adam(list(model.parameters()) + list(head.parameters()), lr=lr)

    def batch(d, rows):
        term = d["terminal"][rows] | (d["truncation"][rows] if reset == "control" else False)
        h = model.hidden(model.prepare_obs(d["obs"][rows], d["removed"][rows]), term, d["removed"][rows], prepared=True)
        mask = d["trial1"][rows] & ~d["removed"][rows] & d["informative"][rows, None]
        return head(h)[mask], d["label"][rows, None].expand_as(mask)[mask]

    rows_all = torch.nonzero(train["informative"]).flatten()
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        rows = rows_all[torch.randint(0, len(rows_all), (min(32, len(rows_all)),), generator=gen)]
        logits, y = batch(train, rows)
        if len(y) == 0:
            continue
        loss = torch.nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        acc = []
        for d in (train, test):
            rows = torch.nonzero(d["informative"]).flatten()
            logits, y = batch(d, rows)
            acc.append(((logits.argmax(-1) == y).float().mean().item(), len(y)))
    return acc[0][0], acc[1][0], acc[1][1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="data/womd_sample")
    ap.add_argument("--worlds", type=int, default=16)
    ap.add_argument("--batches", type=int, default=4, help="recorded training batches (episodes of every world)")
    ap.add_argument("--steps", type=int, default=300, help="supervised optimizer steps per variant")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    tc = TrainConfig()
    cfg = tc.env.replace(goal_behavior="trial", k_trials=2, goal_candidates=2)
    try:
        pack = load_pack(args.data, cfg)
    except (OSError, ValueError) as e:
        print(f"error: --data {args.data}: {e}", file=sys.stderr)
        return 2
    parts = [record(pack, cfg, args.worlds, seed) for seed in range(1, args.batches + 1)]
    train = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    test = record(pack, cfg, args.worlds, 1000)
    env = DriveEnv(pack, 1, config=cfg)
    n_inf = int(train["informative"].sum())
    print(f"{args.data}: {len(train['label'])} training rows, {n_inf} with trial 0 ended at a candidate; "
          f"test rows with one: {int(test['informative'].sum())}")
    print("| variant | memory reset | train accuracy | held-out accuracy | held-out steps |")
    print("|---|---|---:|---:|---:|")
    for reset in ("memory", "control"):
        tr, te, n = probe(train, test, reset, args.steps, args.lr, 0, env, tc.policy)
        what = "terminal" if reset == "memory" else "terminal or truncation"
        print(f"| {reset} | {what} | {tr:.3f} | {te:.3f} | {n} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
