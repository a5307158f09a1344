"""Red-light violation rate of logged (expert) driving (docs/signals.md).

Two measurements on the scenarios given (only those with signals count):

1. **Expert driving through the env**: every controlled agent follows its log through inverse
   dynamics (``DriveEnv.expert_actions()``) for one episode; the metric ``red_light_violation``
   (plain mean over agent-episodes) and the number of agent-episodes flagged.
2. **Pure log geometry**: the same stop-line test (``gpusim.kernels.signals.red_light_violation``)
   applied to the logged positions of every valid vehicle of the scene (controlled or not), step
   t-1 -> t with the state at t. Also counts stop-line crossings on any state, so the red share of
   all crossings is visible.

    python profiling/red_light_rate.py /work/shared/data/womd data/womd_tfrecord [--list]

Not a benchmark: no timing. Prints one line per measurement (and per flagged crossing with
``--list``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gpusim.config import EnvConfig  # noqa: E402
from gpusim.data import ScenarioPack  # noqa: E402
from gpusim.enums import ObjectType  # noqa: E402
from gpusim.env import DriveEnv  # noqa: E402
from gpusim.kernels.signals import red_light_violation  # noqa: E402


def _sources(paths: list[str]) -> list[str]:
    out = []
    for p in map(Path, paths):
        files = sorted(p.iterdir()) if p.is_dir() else [p]
        out += [str(f) for f in files if ".json" in f.name or ".tfrecord" in f.name]
    return out


def expert_rate(pack: ScenarioPack) -> dict:
    """Measurement 1: one expert-driven episode of every scenario (one world each)."""
    env = DriveEnv(pack, num_worlds=pack.num_scenarios, config=EnvConfig(), seed=0)
    env.reset(scenarios=torch.arange(pack.num_scenarios))
    flagged = torch.zeros_like(env.state.red_light_now)
    for _ in range(env.config.horizon - 1):
        env.step(env.expert_actions())
        flagged |= env.state.red_light_now
    env.step(env.expert_actions())
    m = env.metrics(kind="mean")
    return {"agent_episodes": int(m["n"]), "red_light_violation": m["red_light_violation"],
            "flagged": int(flagged.sum())}


def log_geometry(pack: ScenarioPack, listing: bool = False) -> dict:
    """Measurement 2: the stop-line test on the logged tracks of every valid vehicle."""
    S, A, T = pack.traj_valid.shape
    pos = pack.traj_pos.permute(0, 2, 1, 3)          # [S, T, A, 2]: worlds = (s, t) pairs below
    head = pack.traj_heading.permute(0, 2, 1)
    valid = pack.traj_valid.permute(0, 2, 1) & (pack.agent_type == int(ObjectType.VEHICLE))[:, None, :]
    moving = (valid[:, 1:] & valid[:, :-1]).reshape(S * (T - 1), A).contiguous()
    scen = torch.arange(S).repeat_interleave(T - 1)
    li = torch.arange(1, T).repeat(S)
    common = dict(pos_before=pos[:, :-1].reshape(S * (T - 1), A, 2).contiguous(),
                  pos=pos[:, 1:].reshape(S * (T - 1), A, 2).contiguous(),
                  heading=head[:, 1:].reshape(S * (T - 1), A).contiguous(), moving=moving, scenario=scen,
                  log_index=li, signal_pos=pack.signal_pos, signal_dir=pack.signal_dir,
                  signal_valid=pack.signal_valid, num_signals=pack.num_signals)
    red = red_light_violation(signal_state=pack.signal_state, **common)
    anything = red_light_violation(signal_state=torch.full_like(pack.signal_state, 4), **common)  # any state
    if listing:
        for w, a in torch.nonzero(red).tolist():
            s, t = divmod(w, T - 1)
            role = "controlled" if a < pack.num_controlled[s] else "expert"
            speed = float((pos[s, t + 1, a] - pos[s, t, a]).norm()) / 0.1
            print(f"  red crossing: {pack.scenario_ids[s]} agent {a} ({role}) at log step {t + 1}, speed {speed:.1f} m/s")
    agents = int(valid.any(dim=1).sum())
    return {"vehicles": agents, "crossings": int(anything.sum()), "red_crossings": int(red.sum()),
            "vehicles_with_red": int(red.view(S, T - 1, A).any(dim=1).sum())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help="JSON / TFRecord files or directories")
    ap.add_argument("--list", action="store_true", help="print every red crossing of the log geometry")
    args = ap.parse_args(argv)
    pack = ScenarioPack.from_json(_sources(args.paths))
    keep = torch.nonzero(pack.num_signals > 0).flatten()
    if len(keep) == 0:
        print("no scenario with traffic signals")
        return 0
    files = [pack.source_files[i] for i in keep.tolist()]
    pack = ScenarioPack.from_json(files)  # only the scenarios with signals
    print(f"{pack.num_scenarios} scenarios with signals ({int(pack.num_signals.sum())} signals)")
    print("expert driving (env):", expert_rate(pack))
    print("log geometry (all valid vehicles):", log_geometry(pack, args.list))
    return 0


if __name__ == "__main__":
    sys.exit(main())
