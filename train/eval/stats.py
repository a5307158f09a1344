"""Confidence intervals of means over agent-episodes, clustered by scenario (docs/evaluation.md).

The values are one per agent-episode (a 0/1 flag for the rates, the return for
``episode_return``, a per-agent difference ``trial_k - trial_0`` for ``ada_delta``, a
policy-minus-baseline difference for :func:`paired_difference`). Agent-episodes of one scenario
are not independent draws: the agents of a world interact, share the map and the log, and a
repeated episode of a deterministic policy is the same episode again. The evaluation's unit of
independent sampling is the scenario, so with ``clusters`` (the scenario of each value) both
methods treat whole scenarios as the draws:

* ``"normal"`` (default): ``mean +- z * se`` with ``z`` the standard normal quantile of
  ``(1 + level) / 2`` (1.96 for 95%) and ``se`` the cluster-robust standard error of a mean
  (Liang and Zeger, 1986; the form in Cameron and Miller, "A Practitioner's Guide to
  Cluster-Robust Inference", J. Human Resources 2015, section II): ``se^2 = G / (G - 1) *
  sum_g (sum_{i in g} (x_i - mean))^2 / n^2`` over the ``G`` scenarios. With one value per
  scenario it is exactly the textbook ``s / sqrt(n)`` (``n - 1`` denominator). Repeating every
  episode of a scenario k times leaves it unchanged (the scenario sums and ``n`` both scale by k).
  Undefined (NaN bounds) for fewer than 2 scenarios. With few scenarios (Cameron and Miller: under
  about 30) it is somewhat narrow; the bootstrap or more scenarios are then the better choice.
* ``"bootstrap"``: the cluster (pairs) bootstrap (Cameron, Gelbach and Miller 2008; Davison and
  Hinkley 1997, section 3.8): ``resamples`` draws of ``G`` scenarios with replacement (fixed
  ``seed``), each giving the mean over all agent-episodes of the scenarios drawn, and the
  ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of those means (percentile interval).

Without ``clusters`` every value is its own cluster: the two formulas above reduce to the plain
normal interval and the plain percentile bootstrap (Efron) over values. Both are ``[mean, mean]``
when every value is the same (e.g. a rate of exactly 0 or 1).
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
        n: number of values (agent-episodes). method: ``"normal"`` or ``"bootstrap"``. level: e.g.
        0.95. clusters: number of clusters (scenarios) the interval is clustered by; 0 when the
        values were treated as independent (no ``clusters`` given).
    """

    mean: float
    lo: float
    hi: float
    n: int
    method: str
    level: float
    clusters: int = 0

    def to_dict(self) -> dict:
        """Plain data for JSON (NaN written as ``None``); ``scenarios`` = :attr:`clusters`."""
        fin = lambda x: None if not math.isfinite(x) else float(x)  # noqa: E731
        return {"mean": fin(self.mean), "lo": fin(self.lo), "hi": fin(self.hi), "n": self.n,
                "scenarios": self.clusters}


def mean_interval(values, method: str = "normal", level: float = 0.95, resamples: int = 2000,
                  seed: int = 0, bounds: tuple[float, float] | None = None, clusters=None) -> Interval:
    """Mean of ``values`` and its ``level`` confidence interval (methods in the module docstring).

    Args:
        values: 1-D tensor (any float/bool/int dtype, any device) or sequence of numbers.
        method: ``"normal"`` or ``"bootstrap"``. level: confidence level in (0, 1).
        resamples: bootstrap resamples (``"bootstrap"`` only). seed: bootstrap generator seed.
        bounds: ``(low, high)`` range the mean cannot leave (e.g. ``(0, 1)`` for a rate): the
            interval is clipped to it (the normal interval of a rate near 0 otherwise dips below 0).
        clusters: None (values independent) or the cluster id of each value (1-D integer tensor
            or sequence, same length; the scenario index in the evaluator): the interval is
            clustered (module docstring) and ``Interval.clusters`` counts the distinct ids.

    Returns:
        :class:`Interval` (computed in float64 on the CPU).

    Raises:
        ValueError: unknown ``method``, ``level`` outside (0, 1), ``resamples < 1``, values not 1-D,
            ``clusters`` of another length.
    """
    if method not in METHODS:
        raise ValueError(f"interval method must be one of {METHODS}, got {method!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), got {level}")
    x = torch.as_tensor(values).detach().to("cpu", torch.float64)
    if x.dim() != 1:
        raise ValueError(f"mean_interval: values must be 1-D, got shape {tuple(x.shape)}")
    n = int(x.numel())
    if clusters is None:
        cid, G = torch.arange(n), 0
    else:
        c = torch.as_tensor(clusters).detach().to("cpu").reshape(-1)
        if c.numel() != n:
            raise ValueError(f"mean_interval: {c.numel()} cluster ids for {n} values")
        _, cid = torch.unique(c, return_inverse=True)
        G = int(cid.max()) + 1 if n else 0
    groups = G if clusters is not None else n  # the independent draws
    nan = float("nan")
    if n == 0:
        return Interval(nan, nan, nan, 0, method, level, G)
    mean = float(x.mean())
    if groups < 2:
        return Interval(mean, nan, nan, n, method, level, G)
    if method == "normal":
        z = NormalDist().inv_cdf(0.5 + level / 2.0)
        sums = torch.zeros(groups, dtype=torch.float64).index_add_(0, cid, x - mean)  # per-cluster residual sums
        se = math.sqrt(groups / (groups - 1) * float((sums * sums).sum())) / n
        half = z * se
        return _clip(Interval(mean, mean - half, mean + half, n, method, level, G), bounds)
    if int(resamples) < 1:
        raise ValueError(f"bootstrap resamples must be >= 1, got {resamples}")
    g = torch.Generator().manual_seed(int(seed))
    sums = torch.zeros(groups, dtype=torch.float64).index_add_(0, cid, x)
    counts = torch.zeros(groups, dtype=torch.float64).index_add_(0, cid, torch.ones_like(x))
    idx = torch.randint(groups, (int(resamples), groups), generator=g)
    means = sums[idx].sum(dim=1) / counts[idx].sum(dim=1)
    q = torch.tensor([(1.0 - level) / 2.0, (1.0 + level) / 2.0], dtype=torch.float64)
    lo, hi = torch.quantile(means, q).tolist()
    return _clip(Interval(mean, lo, hi, n, method, level, G), bounds)


def paired_difference(a, b, clusters=None, method: str = "normal", level: float = 0.95, resamples: int = 2000,
                      seed: int = 0, bounds: tuple[float, float] | None = None) -> Interval:
    """Mean of ``a - b`` over paired agent-episodes and its interval, clustered by scenario.

    For a policy and a baseline evaluated on the same agent-episodes (same scenario, repetition
    and slot, in the same order), the difference per agent-episode removes what the two share
    (the scenario's difficulty), so its interval is far narrower than that of two independent
    means; clustering by scenario keeps it honest about correlated agent-episodes (module
    docstring). Equals ``mean_interval(a - b, ..., clusters=clusters)``.

    Args:
        a, b: 1-D tensors or sequences of equal length, ``a[i]`` and ``b[i]`` the same
            agent-episode (e.g. the policy's and the baseline's ``goal_reached``). clusters: the
            scenario of each pair (1-D, same length), or None to treat the pairs as independent.
        method, level, resamples, seed, bounds: as :func:`mean_interval` (``bounds`` of the
            difference, e.g. ``(-1, 1)`` for rates).

    Returns:
        :class:`Interval` of the mean difference (``n`` pairs, ``clusters`` scenarios).

    Raises:
        ValueError: ``a`` and ``b`` of different lengths or not 1-D; as :func:`mean_interval`.
    """
    xa = torch.as_tensor(a).detach().to("cpu", torch.float64)
    xb = torch.as_tensor(b).detach().to("cpu", torch.float64)
    if xa.dim() != 1 or xb.shape != xa.shape:
        raise ValueError(f"paired_difference: a and b must be 1-D of one length, got {tuple(xa.shape)} and "
                         f"{tuple(xb.shape)}")
    return mean_interval(xa - xb, method, level, resamples, seed, bounds, clusters)


def _clip(iv: Interval, bounds) -> Interval:
    if bounds is None:
        return iv
    lo, hi = bounds
    return Interval(iv.mean, min(max(iv.lo, lo), hi), min(max(iv.hi, lo), hi), iv.n, iv.method, iv.level, iv.clusters)
