"""Why does the trainer's rollout step not capture in a CUDA graph? (CUDA only.)

Builds the trainer's rollout as ``train/run.py`` does for the given arguments (env, policy,
buffer, KV cache), collects two rollouts through :class:`train.graphed_rollout.GraphedRollout`,
and prints its counts and its fallback reason: a host sync in a warm-up step is named by file and
line (:func:`gpusim.cuda_graph.host_syncs`), where a real capture would only report
``cudaErrorStreamCaptureInvalidated``.

Usage (from the repository root, on a CUDA machine)::

    python profiling/graph_doctor.py                     # the default training run
    python profiling/graph_doctor.py --num-worlds 8 --experience none

Exit code 2 without a CUDA device.
"""

from __future__ import annotations

import pathlib
import sys

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch


def main(argv=None) -> int:
    """Collect two graphed rollouts; print counts and the fallback reason. Returns 0 when the step
    is captured and replayed, 1 when the rollout fell back to eager."""
    if not torch.cuda.is_available():
        print("graph_doctor: no CUDA device here (CUDA graphs need one)", file=sys.stderr)
        raise SystemExit(2)
    from policy.actor_critic import ActorCritic
    from train.config import parse_args as train_parse
    from train.graphed_rollout import GraphedRollout
    from train.rollout import RolloutBatch
    from train.setup import make_env

    cfg = train_parse(list(sys.argv[1:] if argv is None else argv) + ["--quiet", "--device", "cuda"])
    torch.manual_seed(cfg.seed)
    device = torch.device("cuda")
    env = make_env(cfg, cfg.env)
    policy = ActorCritic.for_env(env, cfg.policy).to(device)
    continuous = policy.continuous
    policy.eval()
    buffer = RolloutBatch.for_env(env, continuous, device)
    cache = policy.init_cache(env.num_worlds * env.num_slots, env.horizon, device)
    said: list[str] = []
    roll = GraphedRollout(env, policy, buffer, cache, say=said.append)
    obs = env.reset(seed=cfg.seed)
    with torch.no_grad():
        for _ in range(2):
            obs, _ = roll(obs)
    torch.cuda.synchronize()
    print(f"rollouts 2: captures {roll.stats['captures']}, replays {roll.stats['replays']}, "
          f"warm steps {roll.stats['warm_steps']}, eager steps {roll.stats['eager_steps']}")
    print(f"fallback: {roll.fallback_reason}")
    if roll.fallback_reason is not None:
        bisect(cfg, policy)
    return 0 if roll.fallback_reason is None else 1


def bisect(cfg, policy) -> None:
    """Capture the parts of the step one at a time (each env stage through ``DriveEnv.stage_hook``,
    the policy's forward/sample, the KV-cache reset) after an eager warm-up step, and print which
    captures fail: the part to fix. Each part also runs eagerly, so the step goes on."""
    from gpusim.cuda_graph import capture_graph
    from train.setup import make_env

    device = torch.device("cuda")
    env = make_env(cfg, cfg.env)
    obs = env.reset(seed=cfg.seed)
    env.step(env.expert_actions())  # lazy set-up and kernel compilation happen eagerly
    results: list[tuple[str, str]] = []

    def try_capture(name, call):
        torch.cuda.synchronize()
        try:
            capture_graph(torch.cuda.CUDAGraph(), call, device)
            results.append((name, "ok"))
        except Exception as e:  # the diagnosis: which part cannot be captured
            results.append((name, f"FAILS: {type(e).__name__}: {str(e).splitlines()[0]}"))
        torch.cuda.synchronize()

    def hook(name, call):
        try_capture(f"env stage {name}", call)
        return call()

    R = env.num_worlds * env.num_slots
    cache = policy.init_cache(R, env.horizon, device)
    removed = torch.zeros(R, dtype=torch.bool, device=device)
    with torch.no_grad():
        o = obs.reshape(R, -1)
        policy.sample(policy.forward_eval(o, cache, removed)[0])
        try_capture("policy forward_eval", lambda: policy.forward_eval(o, cache, removed))
        logits = policy.forward_eval(o, cache, removed)[0]
        try_capture("policy sample + log_prob", lambda: policy.log_prob(logits, policy.sample(logits)))
        try_capture("KV-cache reset", lambda: policy.reset_cache(cache, removed))
        actions = env.expert_actions()
        try_capture("validate_actions", lambda: env.validate_actions(actions))
        env.stage_hook = hook
        env.step(actions)
        env.stage_hook = None
    for name, verdict in results:
        print(f"  {name:32s} {verdict}")


if __name__ == "__main__":
    raise SystemExit(main())
