"""Evaluation by driving style (``train/evaluate.py --style NAME [NAME ...]``, docs/styles.md).

* :func:`eval_styles` turns ``--style`` into ``[(label, values)]`` for a checkpoint's env settings:
  with reward conditioning, the named styles (default ``default``, the rule for a conditioned
  checkpoint evaluated without ``--style``); without, no style (and ``--style`` is refused).
* :func:`style_env_config` is the env of one style run: the ego slots drive with the style fixed
  (``EnvConfig.style``), the configured ranges kept (they normalise the observation block), the
  co-players' training draw dropped unless partner styles are given.
* :class:`StyleProbe` accumulates, per policy slot and episode, the columns the style table adds:
  ``mean_speed`` (m/s, mean |speed| over the slot's valid steps) and ``min_gap`` (m, the smallest
  centre-to-centre distance to any other agent in the scene over its valid steps, capped at
  ``EnvConfig.partner_radius`` when no agent came closer) and ``time_to_goal`` (s, steps until the
  first goal times ``dt``; NaN when the goal was not reached: its mean is over the agents that
  reached it).
"""

from __future__ import annotations

import torch

from gpusim.styles import style_values
from train.config import UserError
from train.coplayer import partner_styles  # noqa: F401  (--coplayer PATH@STYLE, parsed where co-players are built)

#: Per agent-episode columns added with reward conditioning (name, table label).
STYLE_METRICS = (("mean_speed", "mean speed (m/s)"), ("min_gap", "min gap (m)"),
                 ("time_to_goal", "time to goal (s, reached)"))


def eval_styles(env_config, styles: tuple, policy_label: str) -> list[tuple[str | None, tuple | None]]:
    """``[(style label, values)]`` to evaluate under ``env_config`` (a checkpoint's settings).

    Raises:
        UserError: ``--style`` for a policy trained without reward conditioning; an unknown style
            name or bad explicit weights (one line naming the value and what is allowed).
    """
    if not env_config.reward_conditioning:
        if styles:
            raise UserError(f"--style {' '.join(styles)}: {policy_label} is not reward-conditioned (only a checkpoint "
                            "trained with --env.reward-conditioning takes a style); evaluate it without --style")
        return [(None, None)]
    out = []
    for name in styles or ("default",):
        try:
            out.append((name, style_values(name, env_config.style_ranges, "--style")))
        except ValueError as e:
            raise UserError(str(e)) from None
    return out


def style_env_config(env_config, values):
    """The env settings of one style run (module docstring); ``values`` None: unchanged."""
    if values is None:
        return env_config
    return env_config.replace(style=values)


class StyleProbe:
    """Per-slot ``mean_speed`` and ``min_gap`` of one synchronous episode (module docstring).

    ``step(env, result)`` after every env step; ``columns()`` -> ``{"mean_speed", "min_gap",
    "time_to_goal"}`` [W, C] float32 device tensors (no host read).
    """

    def __init__(self, env):
        W, C, dev = env.num_worlds, env.num_slots, env.device
        self.cap = float(env.config.partner_radius)
        self.speed_sum = torch.zeros(W, C, device=dev)
        self.steps = torch.zeros(W, C, device=dev)
        self.gap = torch.full((W, C), self.cap, device=dev)
        self.dt = float(env.config.dt)
        self.t = 0
        self.goal_step = torch.full((W, C), -1, dtype=torch.int64, device=dev)

    def step(self, env, result) -> None:
        """Accumulate the step that produced ``result`` (the env's state after it)."""
        st, C = env.state, env.num_slots
        valid = result.loss_mask.to(torch.bool)
        self.speed_sum += torch.where(valid, st.speed[:, :C].abs(), 0.0)
        self.steps += valid.to(torch.float32)
        d = torch.cdist(st.pos[:, :C], st.pos)  # [W, C, A] centre-to-centre (m)
        other = st.present[:, None, :].expand_as(d).clone()
        other[:, torch.arange(C), torch.arange(C)] = False  # not itself
        d = torch.where(other, d, torch.full_like(d, float("inf"))).amin(dim=2)
        self.gap = torch.where(valid, torch.minimum(self.gap, d), self.gap)
        self.t += 1
        first = result.info["goal_reached"] & (self.goal_step < 0)
        self.goal_step = torch.where(first, self.t, self.goal_step)

    def columns(self) -> dict:
        """``{"mean_speed", "min_gap", "time_to_goal"}`` [W, C] float32 (0 speed for slots never valid,
        NaN time for slots that never reached the goal)."""
        ttg = torch.where(self.goal_step >= 0, self.goal_step.to(torch.float32) * self.dt, float("nan"))
        return {"mean_speed": self.speed_sum / self.steps.clamp_min(1.0), "min_gap": self.gap, "time_to_goal": ttg}
