"""The clocks of an episode, each rule written once (kernels, stages, trainer and evaluators read
them from here; the C kernels repeat :func:`log_index` in their pass and are checked against it).

* the **step clock** ``step``: steps since the episode's reset ([W] int32, ``EnvState.step``);
* the **trial clock** (trial mode, docs/trial.md): ``trial_time = step - trial_start``, the steps
  into the current trial, and the trial index ``trial_count``; the observation's ego extras hold
  them normalised (:func:`trial_features`);
* the **log clock**: the index into the scenario's logged trajectory,
  ``init_steps + (step - origin)`` (:func:`log_index`), with ``origin = trial_start`` (every trial
  replays the log from ``init_steps``), less the world's ``start_offset`` with random start
  (``gpusim.sim.random_start.log_origin``).
"""

from __future__ import annotations

import torch


def trial_time(step: torch.Tensor, trial_start: torch.Tensor) -> torch.Tensor:
    """Steps into the current trial, ``step - trial_start`` ([W] int32 each; the result too)."""
    return step - trial_start


def log_index(init_steps: int, step: torch.Tensor, origin: torch.Tensor) -> torch.Tensor:
    """Index into the logged trajectory of the world at episode step ``step``: ``init_steps +
    (step - origin)`` ([W] int32; ``init_steps``: the log index of step 0, ``origin``: the step at
    which the log restarts, ``trial_start`` or ``log_origin``)."""
    return init_steps + (step - origin)


def trial_features(trial_count: torch.Tensor, step: torch.Tensor, trial_start: torch.Tensor, k_trials: int,
                   scenario_length: int) -> tuple:
    """The ego extras ``trial_index`` and ``time_in_trial``: ``(trial_count / k_trials,
    trial_time / scenario_length)``, [W] float32 each (inputs [W] int32)."""
    return (trial_count.to(torch.float32) / k_trials,
            trial_time(step, trial_start).to(torch.float32) / scenario_length)
