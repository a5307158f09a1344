"""Command line of ``python -m gpusim.render`` (:func:`main`) and its helpers: scenario selection,
data loading, ``--set`` overrides.

Part of :mod:`gpusim.render` (see the package docstring). The simulator never imports the trainer
or the policy: rendering a trained checkpoint is ``python -m train.render`` (``train/render.py``),
which reuses :func:`build_parser` and :func:`render_from_args` with its own ``make_policy``
(an ``env -> act`` factory, ``act(obs [W, C, D]) -> actions``).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Callable

import numpy as np

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
    return pack.select([i])


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


def build_parser(prog: str = "python -m gpusim.render", description: str | None = None) -> argparse.ArgumentParser:
    """The ``python -m gpusim.render`` argument parser (``train/render.py`` adds its flags to it)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description=description or "Render a WOMD scenario top-down: the log, or a rollout driven by expert "
                                   "actions or random actions; optionally with one agent's ego view "
                                   "(a trained checkpoint: python -m train.render).")
    p.add_argument("--data", required=True, help="WOMD JSON file/directory, or a saved pack (dir with pack.pt / .pt)")
    p.add_argument("--scenario", default=None,
                   help="scenario id or file stem (default: the first scenario of --data, in file-name order)")
    mode = p.add_mutually_exclusive_group()
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
    p.add_argument("--no-legend", action="store_true",
                   help="leave out the in-image legend of the top-down view (docs/render.md)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                   help="EnvConfig override, repeatable (e.g. --set goal_behavior=stop)")
    return p


def main(argv=None) -> int:
    """Command line: ``python -m gpusim.render --data DIR --scenario ID [--expert | --random | --log]
    --out FILE [--ego-view --agent K] [--steps N]``.

    Returns 0 on success; prints a one-line error and returns 2 for bad input (missing data or
    scenario, bad arguments, ``--policy`` / ``--checkpoint``, which are ``python -m train.render``'s).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a.split("=")[0] in ("--policy", "--checkpoint") for a in argv):
        print("gpusim.render: error: a trained policy is rendered by the trainer: python -m train.render --policy ...",
              file=sys.stderr)
        return 2
    return render_from_args(build_parser().parse_args(argv))


def render_from_args(args: argparse.Namespace, *, config=None, make_policy: Callable | None = None,
                     prog: str = "gpusim.render") -> int:
    """Run a parsed :func:`build_parser` command line.

    Args:
        args: the parsed arguments.
        config: the :class:`~gpusim.config.EnvConfig` to start from (default ``EnvConfig()``);
            ``--set`` overrides are applied on top.
        make_policy: optional ``make_policy(env) -> act`` with ``act(obs [W, C, D] float32) ->
            actions`` (the shape ``env.step`` takes); when given it drives the controlled agents
            instead of ``--expert`` / ``--random``. Its errors (FileNotFoundError, ValueError,
            RuntimeError, ...) are reported like the CLI's own.
        prog: name printed before a one-line error.

    Returns:
        0 on success, 2 after printing ``<prog>: error: ...`` for bad input.
    """
    from gpusim.config import EnvConfig

    from gpusim.fileio import check_output_path

    out = pathlib.Path(args.out)
    still = out.suffix.lower() == ".png"
    legend = not getattr(args, "no_legend", False)
    try:
        check_output_path(out, "--out")  # before any frame is rendered
        overrides = _parse_overrides(args.set)
        cfg = (config.replace(**overrides) if overrides else config) if config is not None else EnvConfig(**overrides)
        pack = _load_data(args.data, args.scenario, cfg.data_config())
        if args.log:
            if args.ego_view:
                raise ValueError("--ego-view needs an env mode (--expert or --random), not --log")
            if still:
                t = pack.config.init_steps + (args.steps or 0)
                img = render_log_frame(pack, 0, t, figsize=args.size, dpi=args.dpi, legend=legend)
                _write_png(out, img)
            else:
                print(f"{prog}: scenario {pack.scenario_ids[0]} from the log -> {out}", file=sys.stderr)
                _, out = render_log_episode(pack, 0, steps=args.steps, out=out, fps=args.fps, figsize=args.size,
                                            dpi=args.dpi, legend=legend, progress=progress_printer(prog))
            print(f"wrote {out}")
            return 0
        from gpusim.env import DriveEnv

        if args.scenario is None and pack.num_scenarios > 1:  # the first scenario, as --help says (not a seeded draw)
            pack = pack.select([0])
        env = DriveEnv(pack, 1, config=cfg, device="cpu", seed=args.seed)
        if make_policy is not None:
            policy = make_policy(env)
        else:
            policy = "random" if args.random else "expert"
        ego = args.agent if args.ego_view else None
        frames_total = (args.steps or 0) + 1 if still else (env.horizon if args.steps is None else args.steps + 1)
        print(f"{prog}: scenario {pack.scenario_ids[0]}, {frames_total} frame(s) to draw -> {out}", file=sys.stderr)
        show = progress_printer(prog)
        if still:
            frames, _ = render_episode(env, policy, steps=args.steps or 0, out=None, seed=args.seed, ego_agent=ego,
                                       figsize=args.size, dpi=args.dpi, legend=legend, progress=show)
            _write_png(out, frames[-1])
        else:
            _, out = render_episode(env, policy, steps=args.steps, out=out, fps=args.fps, seed=args.seed,
                                    ego_agent=ego, figsize=args.size, dpi=args.dpi, legend=legend, progress=show)
        print(f"wrote {out}")
        return 0
    except (FileNotFoundError, KeyError, ValueError, RuntimeError, IndexError, ImportError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"{prog}: error: {msg}", file=sys.stderr)
        return 2


def progress_printer(prog: str, stream=None, parts: int = 10) -> Callable[[int, int], None]:
    """A ``progress(done, total)`` callback that prints ``<prog>: frame DONE/TOTAL`` to ``stream``
    (default stderr) about ``parts`` times over a render (every ``ceil(total / parts)`` frames and at
    the last), so a render of a whole episode (about 90 s on a CPU) is not silent."""

    def show(done: int, total: int) -> None:
        every = max(1, -(-total // parts))
        if done == total or done % every == 0:
            print(f"{prog}: frame {done}/{total}", file=stream if stream is not None else sys.stderr, flush=True)

    return show


def _write_png(out: pathlib.Path, img: np.ndarray) -> None:
    import imageio.v3 as iio

    from gpusim.fileio import write_bytes

    write_bytes(out, iio.imwrite("<bytes>", img, extension=".png"), flag="--out")
