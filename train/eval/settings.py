"""The evaluation rule for a checkpoint's env settings: task options kept, training randomisations dropped.

A checkpoint records the env settings it was trained with (``env_config``). Every evaluation of a
checkpoint (``train/evaluate.py``, the periodic evaluation of training, ``train/render.py``) goes
through :func:`evaluation_config`, so figures stay comparable between checkpoints:

* kept, because they define the task the policy was trained for: trial mode and its trials, the
  memory task's candidates, reward conditioning (its ranges normalise the observation), the
  observation and action settings, behaviours and rewards;
* dropped, because they only widen the training distribution (:data:`TRAINING_RANDOMISATIONS`):
  random start (evaluation starts at the log step ``init_steps``, with the full episode length
  when the length was the derived default), goal resampling (the logged goals) and the memory
  task's practice episodes (every agent plays the task). The third
  randomisation, the reward-conditioning draw of the egos' styles, is replaced by a fixed style by
  :func:`train.eval.styles.eval_styles` (``--style``, ``default`` when not given), which every
  evaluation path applies after this rule.
"""

from __future__ import annotations

#: ``(EnvConfig field, its value when off)`` of the training randomisations evaluation drops.
TRAINING_RANDOMISATIONS = (("random_start_steps", 0), ("goal_resample", False), ("candidate_practice", 0.0))


def evaluation_config(env_config) -> tuple:
    """``(config, notes)``: ``env_config`` (an :class:`~gpusim.config.EnvConfig`, e.g. a
    checkpoint's) with the training randomisations turned off (module docstring), and one note
    line saying what was dropped (no note when nothing was).

    ``scenario_length`` follows ``EnvConfig.replace``: a length equal to its derived default
    (``91 - init_steps - random_start_steps``) becomes the full ``91 - init_steps``.
    """
    dropped = {name: off for name, off in TRAINING_RANDOMISATIONS if getattr(env_config, name, off) != off}
    if not dropped:
        return env_config, []
    was = ", ".join(f"{name}={getattr(env_config, name)}" for name in dropped)
    config = env_config.replace(**dropped)
    what = [f"episodes start at log step {config.init_steps}"]
    what += ["with the logged goals"] if "goal_resample" in dropped else []
    what += ["every agent plays the memory task"] if "candidate_practice" in dropped else []
    note = (f"note: evaluation drops the training randomisations {was} ({', '.join(what)}, "
            f"{config.scenario_length} steps)")
    return config, [note]
