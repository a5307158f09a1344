"""Evaluation internals of ``train/evaluate.py`` (docs/evaluation.md).

* :mod:`train.eval.sweep` — deterministic scenario sweep, drivers, per agent-episode records;
* :mod:`train.eval.modes` — evaluation modes (``self_play``, ``human_replay``; ``coplayer`` later);
* :mod:`train.eval.stats` — confidence intervals (normal approximation or percentile bootstrap);
* :mod:`train.eval.report` — summaries and rich tables.
"""
