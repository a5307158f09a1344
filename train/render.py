"""Render a rollout driven by a trained checkpoint: ``python -m train.render``.

The simulator's renderer (:mod:`gpusim.render`) never imports the trainer or the policy; this
module builds the policy callable from a checkpoint (:func:`checkpoint_policy`) and hands it to
:func:`gpusim.render.render_from_args`, so the command line is ``python -m gpusim.render``'s plus
``--policy`` (required; ``--checkpoint`` is the old spelling), ``--sample`` and ``--style``::

    python -m train.render --policy runs/x/checkpoint.pt --data data/womd_sample \
        --scenario ID --out rollout.gif [--ego-view --agent 0] [--steps N] [--sample]

The env is built with the checkpoint's :class:`~gpusim.config.EnvConfig` (``--set KEY=VALUE``
overrides it). Bad input prints one line and exits with code 2.
"""

from __future__ import annotations

import sys
from typing import Callable

import torch

from gpusim.config import EnvConfig
from gpusim.kernels.clocks import trial_time
from gpusim.render import build_parser, render_from_args
from policy.actor import Actor
from train.checkpoint import load_checkpoint, load_policy


def checkpoint_policy(path, env, deterministic: bool = True) -> Callable:
    """A ``policy(obs) -> actions`` callable driven by a training checkpoint (``train/checkpoint.py``).

    The policy is loaded by :func:`train.checkpoint.load_policy` and acts through a
    :class:`policy.actor.Actor` (KV cache, one slot per world and policy slot, ``env.horizon``
    steps), passing the env's ``removed`` flags as in training. A render stays within one
    episode (:func:`gpusim.render.render_episode`), so the memory is never cleared in between.

    Args:
        path: checkpoint file or run directory. env: the env it will drive (its observation layout
            and action space must match the checkpoint's). deterministic: argmax / mean actions
            instead of sampling.

    Returns:
        ``act(obs [W, C, D] float32) -> actions`` ([W, C] int64 discrete or [W, C, 2] float32
        continuous), the policy-agnostic callable :func:`gpusim.render.render_episode` takes.

    Raises:
        FileNotFoundError / ValueError: from :func:`train.checkpoint.load_policy` (a missing,
            unreadable or mismatched checkpoint: ``CheckpointError`` / ``PolicyMismatch``).
    """
    from gpusim.config import ActionSpace

    continuous = int(env.config.action_space) == int(ActionSpace.CONTINUOUS)
    pol, _ = load_policy(path, env.device, env.obs_layout, env.num_actions, continuous)
    W, C = env.num_worlds, env.num_slots
    actor = Actor(pol, W * C, env.horizon, env.device, deterministic)

    @torch.no_grad()
    def act(obs: torch.Tensor) -> torch.Tensor:
        if actor.reset_at_trial and env.config.trial_mode:  # the memoryless control: forget at a trial start
            st = env.state
            start = (trial_time(st.step, st.trial_start) == 0) & (st.trial_count > 0)  # [W]
            actor.policy.reset_cache(actor.cache, start[:, None].expand(W, C).reshape(-1))
        a = actor.act(obs.reshape(W * C, -1), removed=env.state.removed[:, :C].reshape(-1)).action
        return actor.env_action(a.reshape(W, C, *a.shape[1:]))

    return act


def env_config_from_checkpoint(path) -> EnvConfig:
    """The :class:`~gpusim.config.EnvConfig` saved in a training checkpoint (unknown keys ignored).

    Raises:
        FileNotFoundError / ValueError: from :func:`train.checkpoint.load_checkpoint`, or an invalid
            saved config.
    """
    from train.config import env_config_from_dict

    return env_config_from_dict(load_checkpoint(path, map_location="cpu")["env_config"])


def build_train_parser():
    """:func:`gpusim.render.build_parser` plus ``--policy`` (also spelled ``--checkpoint``, as
    ``train/evaluate.py`` once did), ``--sample`` and ``--style``."""
    p = build_parser(prog="python -m train.render",
                     description="Render a WOMD scenario top-down with the agents driven by a trained checkpoint; "
                                 "optionally with one agent's ego view.")
    p.add_argument("--policy", "--checkpoint", dest="checkpoint", metavar="CHECKPOINT", required=True,
                   help="training checkpoint (train/checkpoint.py) driving the agents (--checkpoint: old spelling)")
    p.add_argument("--sample", action="store_true", help="sample actions instead of argmax / mean")
    p.add_argument("--style", default=None,
                   help="driving style of a reward-conditioned checkpoint's agents: cautious, default, aggressive "
                        "or 9 comma-separated weights (docs/styles.md; default: default)")
    return p


def _with_style(cfg: EnvConfig, style: str | None) -> EnvConfig:
    """``cfg`` with the egos' style fixed to ``style`` (``default`` when None).

    Raises:
        ValueError: a checkpoint without reward conditioning, an unknown style or bad weights.
    """
    from gpusim.styles import style_values

    if not cfg.reward_conditioning:
        raise ValueError(f"--style {style}: the checkpoint is not reward-conditioned (only a checkpoint trained "
                         "with --env.reward-conditioning takes a style)")
    return cfg.replace(style=style_values(style or "default", cfg.style_ranges, "--style"), partner_styles=None)


def main(argv=None) -> int:
    """Command line (see the module docstring). Returns 0, or 2 after a one-line error."""
    args = build_train_parser().parse_args(argv)
    if args.log or args.expert or args.random:
        print("train.render: error: --policy drives the agents; for --log/--expert/--random use "
              "python -m gpusim.render", file=sys.stderr)
        return 2
    try:
        cfg = env_config_from_checkpoint(args.checkpoint)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"train.render: error: {e}", file=sys.stderr)
        return 2
    from train.settings import evaluation_config

    cfg, notes = evaluation_config(cfg)  # the evaluation rule: log start, logged goals
    for note in notes:
        print(f"train.render: {note}", file=sys.stderr)
    if cfg.reward_conditioning or args.style:  # a fixed style (the title names it); refused when unconditioned
        try:
            cfg = _with_style(cfg, args.style)
        except ValueError as e:
            print(f"train.render: error: {e}", file=sys.stderr)
            return 2
    return render_from_args(
        args,
        config=cfg,
        make_policy=lambda env: checkpoint_policy(args.checkpoint, env, deterministic=not args.sample),
        prog="train.render",
    )


if __name__ == "__main__":
    sys.exit(main())
