"""Command line of ``python -m gpusim.render`` (:func:`main`) and its helpers: scenario selection,
data loading, ``--set`` overrides, a policy callable from a training checkpoint.

Part of :mod:`gpusim.render` (see the package docstring); split out of the former single module
without behaviour change.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
from typing import Callable

import numpy as np
import torch

from gpusim.render.draw import render_log_frame
from gpusim.render.video import render_episode, render_log_episode


def select_scenario(pack, scenario_id: str):
    """A one-scenario pack holding the scenario ``scenario_id`` of ``pack`` (so a 1-world env runs it).

    ``scenario_id`` matches a pack scenario id exactly, or the stem of its source file.

    Raises:
        KeyError: if no scenario matches; the message lists the ids available.
    """
    ids = list(pack.scenario_ids)
    stems = [pathlib.Path(f).name.split(".json")[0] for f in pack.source_files]
    if scenario_id in ids:
        i = ids.index(scenario_id)
    elif scenario_id in stems:
        i = stems.index(scenario_id)
    else:
        raise KeyError(f"scenario {scenario_id!r} is not in the data; available: {', '.join(ids)}")
    sl = slice(i, i + 1)
    return dataclasses.replace(pack, scenario_ids=[ids[i]], source_files=[pack.source_files[i]],
                               **{k: v[sl] for k, v in pack.tensors().items()})


def _load_data(data: str, scenario: str | None, data_config):
    """Pack for the CLI: a saved pack (``pack.pt`` directory / ``.pt`` file) or WOMD JSON (a file
    or a directory; when ``scenario`` names a file stem in the directory only that file is
    converted)."""
    from gpusim.data import ScenarioPack

    path = pathlib.Path(data)
    if not path.exists():
        raise FileNotFoundError(f"--data {data}: no such file or directory")
    if path.suffix == ".pt" or (path.is_dir() and (path / "pack.pt").exists()):
        pack = ScenarioPack.load(path)
    else:
        src = path
        if path.is_dir() and scenario is not None:
            hits = sorted(c for c in path.iterdir() if c.name.split(".json")[0] == scenario)
            if hits:
                src = hits[0]
        pack = ScenarioPack.from_json(src, data_config)
    if scenario is not None:
        pack = select_scenario(pack, scenario)
    return pack


def _parse_overrides(items) -> dict:
    out = {}
    for it in items or []:
        key, sep, val = it.partition("=")
        if not sep:
            raise ValueError(f"--set expects KEY=VALUE, got {it!r}")
        v: object = val
        for conv in (int, float):
            try:
                v = conv(val)
                break
            except ValueError:
                pass
        if val.lower() in ("true", "false"):
            v = val.lower() == "true"
        if val.lower() == "none":
            v = None
        out[key.strip()] = v
    return out


def checkpoint_policy(path, env, deterministic: bool = True) -> Callable:
    """A ``policy(obs) -> actions`` callable driven by a training checkpoint (``train/checkpoint.py``).

    The actor-critic is rebuilt from the checkpoint's description and weights and run step by step
    with its KV cache (one slot per world and policy slot, ``env.horizon`` steps), passing the
    env's ``removed`` flags as in training; memory is cleared where a slot's episode ended.

    Args:
        path: checkpoint file. env: the env it will drive (its observation size and action count
            must match the checkpoint's). deterministic: argmax / mean actions instead of sampling.

    Raises:
        RuntimeError: if the trainer packages (``policy``, ``train.checkpoint``) are not importable.
        FileNotFoundError / ValueError: from ``train.checkpoint.load_checkpoint``; ValueError when the
            checkpoint's observation size or action count differ from the env's.
    """
    try:
        from policy.actor_critic import ActorCritic
        from train.checkpoint import load_checkpoint
    except ImportError as e:  # pragma: no cover - depends on the tree
        raise RuntimeError(f"--checkpoint needs the trainer packages policy/ and train/checkpoint.py: {e}") from e
    ck = load_checkpoint(path, map_location="cpu")
    pol = ActorCritic.from_description(ck["policy"])
    pol.load_state_dict(ck["model"])
    pol = pol.to(env.device).eval()
    D = getattr(pol.dims, "obs_dim", None)
    if D is not None and int(D) != env.obs_dim:
        raise ValueError(f"checkpoint {path}: policy expects {D} observation features, env gives {env.obs_dim}")
    if int(pol.num_actions) != int(env.num_actions):
        raise ValueError(f"checkpoint {path}: policy has {pol.num_actions} actions, env {env.num_actions}")
    W, C = env.num_worlds, env.num_slots
    cache = pol.init_cache(W * C, env.horizon, env.device)

    @torch.no_grad()
    def act(obs: torch.Tensor) -> torch.Tensor:
        nonlocal cache
        removed = env.state.removed[:, :C].reshape(-1)
        logits, _value, cache = pol.forward_eval(obs.reshape(W * C, -1), cache, removed)
        a = pol.sample(logits, deterministic)
        return a.reshape(W, C, *a.shape[1:])

    return act


def env_config_from_checkpoint(path):
    """The :class:`~gpusim.config.EnvConfig` saved in a training checkpoint (unknown keys ignored)."""
    from gpusim.config import EnvConfig

    try:
        from train.checkpoint import load_checkpoint
    except ImportError as e:  # pragma: no cover - depends on the tree
        raise RuntimeError(f"--checkpoint needs train/checkpoint.py: {e}") from e
    d = load_checkpoint(path, map_location="cpu")["env_config"]
    names = {f.name for f in dataclasses.fields(EnvConfig)}
    return EnvConfig(**{k: v for k, v in d.items() if k in names})


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m gpusim.render`` argument parser."""
    p = argparse.ArgumentParser(
        prog="python -m gpusim.render",
        description="Render a WOMD scenario top-down: the log, or a rollout driven by expert actions, "
                    "random actions or a trained checkpoint; optionally with one agent's ego view.")
    p.add_argument("--data", required=True, help="WOMD JSON file/directory, or a saved pack (dir with pack.pt / .pt)")
    p.add_argument("--scenario", default=None, help="scenario id or file stem (default: the first scenario)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--checkpoint", default=None, help="training checkpoint (train/checkpoint.py) driving the agents")
    mode.add_argument("--expert", action="store_true", help="drive controlled agents with env.expert_actions() (default)")
    mode.add_argument("--random", action="store_true", help="uniformly random actions")
    mode.add_argument("--log", action="store_true", help="replay the log itself (no env)")
    p.add_argument("--out", required=True, help="output: .gif, .mp4 (needs imageio-ffmpeg), or .png (one frame)")
    p.add_argument("--steps", type=int, default=None,
                   help="steps to run (video: default the whole episode; .png: the frame after N steps, default 0)")
    p.add_argument("--ego-view", action="store_true", help="add the ego view of agent --agent (env modes)")
    p.add_argument("--agent", type=int, default=0, help="policy slot for --ego-view (default 0)")
    p.add_argument("--fps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", type=float, default=6.0, help="panel size in inches (x dpi = pixels)")
    p.add_argument("--dpi", type=int, default=100)
    p.add_argument("--sample", action="store_true", help="--checkpoint: sample actions instead of argmax")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                   help="EnvConfig override, repeatable (e.g. --set goal_behavior=stop)")
    return p


def main(argv=None) -> int:
    """Command line: ``python -m gpusim.render --data DIR --scenario ID [--checkpoint C | --expert |
    --random | --log] --out FILE [--ego-view --agent K] [--steps N]``.

    Returns 0 on success; prints a one-line error and returns 2 for bad input (missing data or
    scenario, unusable checkpoint, bad arguments).
    """
    args = build_parser().parse_args(argv)
    from gpusim.config import EnvConfig

    out = pathlib.Path(args.out)
    still = out.suffix.lower() == ".png"
    try:
        if args.checkpoint:
            cfg = env_config_from_checkpoint(args.checkpoint)
            cfg = cfg.replace(**_parse_overrides(args.set)) if args.set else cfg
        else:
            cfg = EnvConfig(**_parse_overrides(args.set))
        pack = _load_data(args.data, args.scenario, cfg.data_config())
        if args.log:
            if args.ego_view:
                raise ValueError("--ego-view needs an env mode (--expert, --random or --checkpoint), not --log")
            if still:
                t = pack.config.init_steps + (args.steps or 0)
                img = render_log_frame(pack, 0, t, figsize=args.size, dpi=args.dpi)
                _write_png(out, img)
            else:
                _, out = render_log_episode(pack, 0, steps=args.steps, out=out, fps=args.fps, figsize=args.size,
                                            dpi=args.dpi)
            print(f"wrote {out}")
            return 0
        from gpusim.env import DriveEnv

        env = DriveEnv(pack, 1, config=cfg, device="cpu", seed=args.seed)
        if args.checkpoint:
            policy = checkpoint_policy(args.checkpoint, env, deterministic=not args.sample)
        else:
            policy = "random" if args.random else "expert"
        ego = args.agent if args.ego_view else None
        if still:
            frames, _ = render_episode(env, policy, steps=args.steps or 0, out=None, seed=args.seed, ego_agent=ego,
                                       figsize=args.size, dpi=args.dpi)
            _write_png(out, frames[-1])
        else:
            _, out = render_episode(env, policy, steps=args.steps, out=out, fps=args.fps, seed=args.seed,
                                    ego_agent=ego, figsize=args.size, dpi=args.dpi)
        print(f"wrote {out}")
        return 0
    except (FileNotFoundError, KeyError, ValueError, RuntimeError, IndexError, ImportError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"gpusim.render: error: {msg}", file=sys.stderr)
        return 2


def _write_png(out: pathlib.Path, img: np.ndarray) -> None:
    import imageio.v3 as iio

    out.parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(out, img)
