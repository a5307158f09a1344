"""Evaluation modes: who the evaluated policy (the *ego*) drives and who drives everyone else.

A mode is an :class:`EvalMode`: how it changes the env settings and which policy slots are egos
(their agent-episodes are the ones reported). The evaluator runs the same sweep for every mode
asked (``--mode a b ...``) and prints them side by side.

* ``self_play``: the policy drives every controlled slot (all are egos); other agents replay the log.
* ``human_replay``: one ego per world (the first controlled slot: the self-driving car when it
  qualifies), every other agent log-replayed: the env gets ``max_controlled = 1``.
* ``coplayer`` (issue 15, not built yet): one ego per world, the other controlled slots driven by
  frozen partner checkpoints (``--coplayer PATH ...``). It will be one more :class:`EvalMode`
  whose ``egos`` returns the ego role mask and whose driver merges ego and partner actions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


def _all_active(env) -> torch.Tensor:
    return env.state.slot_active.clone()


@dataclass(frozen=True)
class EvalMode:
    """One evaluation mode.

    Attributes:
        name: CLI name. doc: one line for ``--help`` and reports.
        env_changes: ``EnvConfig.replace`` arguments applied to the evaluation env settings.
        egos: ``egos(env) -> [W, C] bool`` ego slots right after a reset.
    """

    name: str
    doc: str
    env_changes: tuple = ()
    egos: Callable = _all_active

    def env_config(self, base):
        """``base`` (an :class:`~gpusim.config.EnvConfig`) with this mode's changes."""
        return base.replace(**dict(self.env_changes)) if self.env_changes else base


MODES = {
    "self_play": EvalMode("self_play", "the policy drives every controlled agent"),
    "human_replay": EvalMode("human_replay", "one ego per world (first controlled slot), all others log-replayed",
                             env_changes=(("max_controlled", 1),)),
}
#: Modes named by the design but not built yet, with what is missing.
PLANNED = {"coplayer": "co-player partner policies are not built yet (issue 15); use self_play or human_replay"}


def get_mode(name: str) -> EvalMode:
    """The mode called ``name``.

    Raises:
        ValueError: a planned mode that does not exist yet, or an unknown name.
    """
    if name in MODES:
        return MODES[name]
    if name in PLANNED:
        raise ValueError(f"--mode {name}: {PLANNED[name]}")
    raise ValueError(f"--mode {name!r}: unknown mode; known: {', '.join(MODES)}")
