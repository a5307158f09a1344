"""Confidence intervals of means over agent-episodes (evaluation, docs/evaluation.md).

Two methods, both for the mean of ``n`` values (one per agent-episode; a 0/1 flag for the rates,
the return for ``episode_return``, a per-agent difference ``trial_k - trial_0`` for ``ada_delta``):

* ``"normal"`` (default): ``mean +- z * s / sqrt(n)`` with ``s`` the sample standard deviation
  (``n - 1`` denominator) and ``z`` the standard normal quantile of ``(1 + level) / 2`` (1.96 for
  95%): the textbook large-sample interval of a mean (central limit theorem). It is ``[mean,
  mean]`` when every value is the same (e.g. a rate of exactly 0 or 1) and undefined (NaN bounds)
  for ``n < 2``.
* ``"bootstrap"``: the percentile bootstrap (Efron): ``resamples`` means of ``n`` values drawn
  with replacement from the ``n`` values (seeded), and their ``(1 - level) / 2`` and
  ``(1 + level) / 2`` quantiles.

Both treat agent-episodes as independent draws. They are not: agents of one world interact and a
deterministic policy repeats itself on a repeated scenario, so the intervals are narrower than
the scenario-to-scenario uncertainty (said in docs/evaluation.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import torch

METHODS = ("normal", "bootstrap")


@dataclass(frozen=True)
class Interval:
    """A mean with its confidence interval.

    Attributes:
        mean: sample mean (NaN when ``n == 0``). lo, hi: interval bounds (NaN when undefined).
        n: number of values. method: ``"normal"`` or ``"bootstrap"``. level: e.g. 0.95.
    """

    mean: float
    lo: float
    hi: float
    n: int
    method: str
    level: float

    def to_dict(self) -> dict:
        """Plain data for JSON (NaN written as ``None``)."""
        fin = lambda x: None if not math.isfinite(x) else float(x)  # noqa: E731
        return {"mean": fin(self.mean), "lo": fin(self.lo), "hi": fin(self.hi), "n": self.n}


def mean_interval(values, method: str = "normal", level: float = 0.95, resamples: int = 2000,
                  seed: int = 0, bounds: tuple[float, float] | None = None) -> Interval:
    """Mean of ``values`` and its ``level`` confidence interval (methods in the module docstring).

    Args:
        values: 1-D tensor (any float/bool/int dtype, any device) or sequence of numbers.
        method: ``"normal"`` or ``"bootstrap"``. level: confidence level in (0, 1).
        resamples: bootstrap resamples (``"bootstrap"`` only). seed: bootstrap generator seed.
        bounds: ``(low, high)`` range the mean cannot leave (e.g. ``(0, 1)`` for a rate): the
            interval is clipped to it (the normal interval of a rate near 0 otherwise dips below 0).

    Returns:
        :class:`Interval` (computed in float64 on the CPU).

    Raises:
        ValueError: unknown ``method``, ``level`` outside (0, 1), ``resamples < 1``, values not 1-D.
    """
    if method not in METHODS:
        raise ValueError(f"interval method must be one of {METHODS}, got {method!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), got {level}")
    x = torch.as_tensor(values).detach().to("cpu", torch.float64)
    if x.dim() != 1:
        raise ValueError(f"mean_interval: values must be 1-D, got shape {tuple(x.shape)}")
    n = int(x.numel())
    nan = float("nan")
    if n == 0:
        return Interval(nan, nan, nan, 0, method, level)
    mean = float(x.mean())
    if n < 2:
        return Interval(mean, nan, nan, n, method, level)
    if method == "normal":
        z = NormalDist().inv_cdf(0.5 + level / 2.0)
        half = z * float(x.std(unbiased=True)) / math.sqrt(n)
        return _clip(Interval(mean, mean - half, mean + half, n, method, level), bounds)
    if int(resamples) < 1:
        raise ValueError(f"bootstrap resamples must be >= 1, got {resamples}")
    g = torch.Generator().manual_seed(int(seed))
    idx = torch.randint(n, (int(resamples), n), generator=g)
    means = x[idx].mean(dim=1)
    q = torch.tensor([(1.0 - level) / 2.0, (1.0 + level) / 2.0], dtype=torch.float64)
    lo, hi = torch.quantile(means, q).tolist()
    return _clip(Interval(mean, lo, hi, n, method, level), bounds)


def _clip(iv: Interval, bounds) -> Interval:
    if bounds is None:
        return iv
    lo, hi = bounds
    return Interval(iv.mean, min(max(iv.lo, lo), hi), min(max(iv.hi, lo), hi), iv.n, iv.method, iv.level)
