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
  task's practice episodes (every agent plays the task) and mirror-image scenes (the scenes as
  logged, traffic on the right; ``gpusim/data/mirror.py``). Another
  randomisation, the reward-conditioning draw of the egos' styles, is replaced by a fixed style by
  :func:`train.eval.styles.eval_styles` (``--style``, ``default`` when not given), which every
  evaluation path applies after this rule.
"""

from __future__ import annotations

#: ``(EnvConfig field, its value when off)`` of the training randomisations evaluation drops.
TRAINING_RANDOMISATIONS = (("random_start_steps", 0), ("goal_resample", False), ("candidate_practice", 0.0),
                           ("mirror", False))


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
    what += ["the scenes as logged, not mirrored"] if "mirror" in dropped else []
    note = (f"note: evaluation drops the training randomisations {was} ({', '.join(what)}, "
            f"{config.scenario_length} steps)")
    return config, [note]


#: The named settings (``train/evaluate.py --setting``; the training flags of docs/training.md):
#: the EnvConfig fields each sets. ``goal``: the goal-conditioned driver's (``train/run.py``'s
#: defaults: vehicles with a goal, from log step 0, stopped at the goal, removed at a contact).
#: ``sim_agent``: the way WOSAC evaluates (``train/eval/wosac.py``): every object valid at step 10
#: controlled (up to 64, the rest log-replayed), from step 10 for 80 steps, the agent drives on
#: through its goal, contacts neither stop nor remove. The policy's memory starts at step 10 (the
#: log's first second is not fed to it).
SETTINGS = {
    "goal": {"control": "vehicles_with_goal", "init_steps": 0, "scenario_length": None, "goal_behavior": "stop",
             "max_agents": 64, "max_controlled": 8, "collision_behavior": "remove", "offroad_behavior": "remove"},
    "sim_agent": {"control": "all_valid", "init_steps": 10, "scenario_length": 80, "goal_behavior": "continue",
                  "max_agents": 128, "max_controlled": 64, "collision_behavior": "ignore",
                  "offroad_behavior": "ignore"},
}


def setting_config(env_config, name: str | None) -> tuple:
    """``(config, notes)``: ``env_config`` with the fields of setting ``name`` (:data:`SETTINGS`)
    set, and a note naming the fields it changed; ``name`` None: unchanged, no note.

    Raises:
        ValueError: an unknown setting name (one line listing the names).
    """
    if name is None:
        return env_config, []
    if name not in SETTINGS:
        raise ValueError(f"--setting {name}: unknown setting; use one of {', '.join(SETTINGS)}")
    config = env_config.replace(**SETTINGS[name])
    changed = [f"{k}={getattr(config, k)}" for k in SETTINGS[name] if getattr(config, k) != getattr(env_config, k)]
    return config, ([f"note: --setting {name}: evaluated with {', '.join(changed)}"] if changed else [])
