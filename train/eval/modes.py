"""Evaluation modes: who the evaluated policy (the *ego*) drives and who drives everyone else.

A mode is an :class:`EvalMode`: how it changes the env settings and which policy slots are egos
(their agent-episodes are the ones reported). The evaluator runs the same sweep for every mode
asked (``--mode a b ...``) and prints them side by side.

* ``self_play``: the policy drives every controlled slot (all are egos); other agents replay the log.
* ``human_replay``: one ego per world (the first controlled slot: the self-driving car when it
  qualifies), every other agent log-replayed: the env gets ``max_controlled = 1``.
* ``coplayer`` (issue 15): one ego per world (``EnvConfig.ego_slots = 1``: the self-driving car
  where it is controllable, else a slot drawn with the env's seeded generator), the other
  controlled slots driven by frozen partner checkpoints (``--coplayer PATH ...``, one drawn per
  world per episode, ``train/coplayer.py``); the egos are the env's role mask ``EnvState.ego``.

Every mode sets the role options itself, so a checkpoint trained with co-players runs
``self_play`` with every slot an ego.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


def _all_active(env) -> torch.Tensor:
    return env.state.slot_active.clone()


def _ego_role(env) -> torch.Tensor:
    return env.state.ego.clone()


@dataclass(frozen=True)
class EvalMode:
    """One evaluation mode.

    Attributes:
        name: CLI name. doc: one line for ``--help`` and reports.
        env_changes: ``EnvConfig.replace`` arguments applied to the evaluation env settings.
        egos: ``egos(env) -> [W, C] bool`` ego slots right after a reset.
        partners: the mode needs ``--coplayer`` partner checkpoints.
    """

    name: str
    doc: str
    env_changes: tuple = ()
    egos: Callable = _all_active
    partners: bool = False

    def env_config(self, base):
        """``base`` (an :class:`~gpusim.config.EnvConfig`) with this mode's changes."""
        return base.replace(**dict(self.env_changes)) if self.env_changes else base


_NO_ROLES = (("ego_slots", 0), ("ego_fraction", 0.0))
MODES = {
    "self_play": EvalMode("self_play", "the policy drives every controlled agent", env_changes=_NO_ROLES),
    "coplayer": EvalMode("coplayer", "one ego per world (the SDC where controllable), the other controlled agents "
                         "driven by the --coplayer partners", env_changes=(("ego_slots", 1), ("ego_fraction", 0.0)),
                         egos=_ego_role, partners=True),
    "human_replay": EvalMode("human_replay", "one ego per world (first controlled slot), all others log-replayed",
                             env_changes=(("max_controlled", 1),) + _NO_ROLES),
}
#: Modes named by the design but not built yet, with what is missing (none left).
PLANNED: dict[str, str] = {}


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
