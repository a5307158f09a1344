"""Evaluation internals of ``train/evaluate.py`` (docs/evaluation.md).

* :mod:`train.eval.sweep` — deterministic scenario sweep, drivers, per agent-episode records;
* :mod:`train.eval.modes` — the registry of evaluation modes (``self_play``, ``coplayer``,
  ``human_replay``; a new mode is one ``register_mode`` entry);
* :mod:`train.eval.stats` — confidence intervals (normal approximation or percentile bootstrap);
* :mod:`train.eval.report` — summaries and rich tables.
"""
