"""Episode metrics of finished agent-episodes, kept on the device (docs/design.md section 13).

The metric registry :data:`METRICS` holds every per agent-episode metric, each a :class:`Metric`
with its one definition computed from the episode's tallies (:data:`TALLIES`). The env's log
(stage ``accounting``, :func:`episode_rows`) and the evaluator (``train/eval/sweep.py`` reads the
rows the env publishes, :attr:`EpisodeMetrics.last`; ``train/eval/report.py`` summarises the
registry's columns) are both built from it; :data:`ADAPTATION` / :func:`derived_columns` define
``ada_delta`` once. Metrics of one agent-episode, in the column order of :data:`METRIC_NAMES`:

* ``episode_return``: sum of the agent's rewards in the episode (invalid steps pay 0);
* ``episode_length``: number of valid steps (``loss_mask = 1``) of the agent;
* ``goal_reached``: 1 if the agent reached a goal at a valid step;
* ``collided`` / ``offroad``: 1 if it was in collision / offroad at a valid step;
* ``score``: 1 if it reached its goal and never collided nor went offroad;
* ``red_light_violation``: 1 if its centre crossed the stop line of a red signal (stop or red
  arrow) at a valid step (docs/signals.md; not part of ``score``);
* ``collision_or_offroad``: 1 if it collided or went offroad (or both) at a valid step: the union
  per agent-episode (:func:`collision_or_offroad`), so an agent that does both counts once, where
  the sum ``collided + offroad`` counts it twice.

STOP-invalid steps and steps of removed agents never contribute: the env accumulates returns,
lengths and flags only where the agent was in play (``loss_mask``).

:class:`EpisodeMetrics` keeps two device-side logs fed from the same per-episode values:

* the **per-agent EMA** of docs/design.md section 13 (reported by ``DriveEnv.metrics()``): each of the
  N = W x C policy slots keeps an exponential moving average of the metrics of the agent-episodes
  that finished in it (first completion seeds it; later ones blend
  ``slot = alpha * slot + (1 - alpha) * episode`` with ``alpha = EnvConfig.log_ema_alpha``) and a
  has-data flag. A report is the mean over the slots with data plus ``n`` (their number); it never
  resets, and is ``{}`` while no slot has data. Every slot weighs the same, however often it
  finishes (an agent finishing ten short episodes counts once, like one finishing a single long
  one). The kernels are ``gpusim.kernels.ema`` (torch reference, Triton, CUDA C).
* a plain **mean over agent-episodes** finished since its last report (``kind="mean"``; resets at
  every report): what a one-off evaluation wants.

Extensible: the metric columns are ``names`` (default :data:`METRIC_NAMES`); trial mode appends
:func:`trial_metric_names` columns (``trial_k_score`` = goal reached in trial k, from the state's
``trial_reached``; ``trial_k_clean_score`` = the same without collision/offroad, from the state's
``trial_clean``, written by the trial kernel); a report then also derives ``ada_delta_trial_k_minus_0 =
trial_k_score - trial_0_score`` (exact
for the EMA population mean too, since the EMA and the mean are linear and every column of a slot
is updated together).

Roles (population play, ``gpusim/sim/roles.py``): the env's log holds the *ego* slots' episodes
only (``DriveEnv.metrics()``, reported as the training metrics); with co-players the env keeps a
second :class:`EpisodeMetrics` for the co-player slots (``DriveEnv.metrics(role="coplayer")``), so
partner goals and collisions never enter the ego's figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from gpusim.kernels.ema import EmaLog

#: Keys of the per agent-episode *tallies* every metric is computed from (the accumulators of stage
#: ``accounting`` and of the trial kernel; ``[...]`` any shape, one entry per agent-episode):
#: ``return`` float (sum of rewards), ``length`` int (valid steps), ``goal``, ``collided``,
#: ``offroad``, ``red_light`` bool (at a valid step of the episode); trial mode adds
#: ``trial_reached`` and ``trial_clean`` ``[..., K]`` bool (goal reached in trial k; the same
#: without a collision or offroad in that trial, from ``gpusim.kernels.trial``).
TALLIES = ("return", "length", "goal", "collided", "offroad", "red_light", "trial_reached", "trial_clean")


@dataclass(frozen=True)
class Metric:
    """One per agent-episode metric: its name and its one definition.

    Attributes:
        name: the column name (``"n"`` is reserved); with ``per_trial`` a format string with
            ``{k}`` (one column per trial, trial mode only).
        value: ``value(tallies) -> tensor``: the metric of every agent-episode from the tallies
            (:data:`TALLIES`); shape ``[...]``, or ``[..., K]`` with ``per_trial``; any dtype (the
            logs store float32).
        label: the evaluator's table label (None: the name). bounds: the range a mean cannot leave
            (the evaluator clips its interval to it; None: unbounded).
        summary: the evaluator reports its mean with an interval (False: recorded and logged only).
        per_trial: one column per trial (``name.format(k=k)``, k = 0 .. K-1).
    """

    name: str
    value: Callable[[dict], torch.Tensor]
    label: str | None = None
    bounds: tuple[float, float] | None = (0.0, 1.0)
    summary: bool = True
    per_trial: bool = False


def clean_goal(goal_reached: torch.Tensor, collided: torch.Tensor, offroad: torch.Tensor) -> torch.Tensor:
    """The ``score`` of an agent-episode (or of one trial): goal reached without a collision or an
    off-road event. Bool tensors of one shape in, the same shape out (bool)."""
    return goal_reached & ~collided & ~offroad


def collision_or_offroad(collided: torch.Tensor, offroad: torch.Tensor) -> torch.Tensor:
    """The ``collision_or_offroad`` flag of an agent-episode: it collided, went offroad, or both
    (the union, so an agent that does both counts once). Bool tensors of one shape in, the same
    shape out (bool)."""
    return collided | offroad


#: The metric registry: every per agent-episode metric, in column order, each with its one
#: definition. The env's metric log (``DriveEnv.metrics()``, stage ``accounting``) and the
#: evaluator's records and summaries (``train/eval/sweep.py``, ``train/eval/report.py``) are both
#: built from this list, so a metric appended here appears in both with no other edit.
METRICS: list[Metric] = [
    Metric("episode_return", lambda t: t["return"], "return", bounds=None),
    Metric("episode_length", lambda t: t["length"], "length", bounds=None, summary=False),
    Metric("goal_reached", lambda t: t["goal"], "goal"),
    Metric("collided", lambda t: t["collided"], "collision"),
    Metric("offroad", lambda t: t["offroad"], "offroad"),
    Metric("score", lambda t: clean_goal(t["goal"], t["collided"], t["offroad"]), "score"),
    Metric("red_light_violation", lambda t: t["red_light"], "red-light violation"),
    Metric("collision_or_offroad", lambda t: collision_or_offroad(t["collided"], t["offroad"]),
           "collision or offroad"),
    Metric("trial_{k}_score", lambda t: t["trial_reached"], per_trial=True),
    Metric("trial_{k}_clean_score", lambda t: t["trial_clean"], per_trial=True),
]


def metric_columns(k_trials: int | None = None) -> tuple[str, ...]:
    """The column names of :data:`METRICS` (read at call time): the per-episode ones, then in trial
    mode (``k_trials`` >= 1) each per-trial metric's K columns. ``None`` / 0: no per-trial columns.

    Raises:
        ValueError: if ``k_trials < 0``.
    """
    K = int(k_trials or 0)
    if K < 0:
        raise ValueError(f"metric_columns: k_trials must be >= 0, got {k_trials}")
    names = [m.name for m in METRICS if not m.per_trial]
    for m in METRICS:
        if m.per_trial:
            names += [m.name.format(k=k) for k in range(K)]
    return tuple(names)


def metric_values(tallies: dict, k_trials: int | None = None) -> dict[str, torch.Tensor]:
    """Every column of :func:`metric_columns` computed from ``tallies`` (:data:`TALLIES`; the
    per-trial keys are needed only with ``k_trials``): ``{name: tensor [...]}`` in column order,
    dtypes as each :attr:`Metric.value` returns them.

    Raises:
        KeyError: a tally a metric needs is missing.
    """
    K = int(k_trials or 0)
    out = {m.name: m.value(tallies) for m in METRICS if not m.per_trial}
    for m in METRICS:
        if m.per_trial and K:
            v = m.value(tallies)
            out.update({m.name.format(k=k): v[..., k] for k in range(K)})
    return out


def __getattr__(name):
    """``METRIC_NAMES``: the per-episode column names of :data:`METRICS` at the time of the read."""
    if name == "METRIC_NAMES":
        return metric_columns()
    raise AttributeError(f"module 'gpusim.metrics' has no attribute {name!r}")


def trial_metric_names(k_trials: int) -> tuple[str, ...]:
    """Names of the per-trial columns of trial mode (the per-trial metrics of :data:`METRICS`):
    ``("trial_0_score", ..., "trial_{k-1}_score", "trial_0_clean_score", ...)``.

    ``trial_k_score`` = goal reached in trial k (docs/design.md section 9; ``ada_delta`` is computed from
    it); ``trial_k_clean_score`` = goal reached in trial k without a collision or offroad event in
    that trial (the stricter figure).

    Raises:
        ValueError: if ``k_trials < 1``.
    """
    if int(k_trials) < 1:
        raise ValueError(f"trial_metric_names: k_trials must be >= 1, got {k_trials}")
    return metric_columns(k_trials)[len(metric_columns()):]


def episode_rows(tallies: dict, k_trials: int | None = None) -> torch.Tensor:
    """The metric values of agent-episodes as one float32 tensor ``[..., M]``: the columns of
    :func:`metric_columns` (``k_trials``) in order, each computed by :func:`metric_values` from
    ``tallies`` (:data:`TALLIES`, tensors of one shape ``[...]``, per-trial ones ``[..., K]``).

    Raises:
        KeyError: a tally a metric needs is missing.
    """
    return torch.stack([v.to(torch.float32) for v in metric_values(tallies, k_trials).values()], dim=-1)


def episode_values(ep_return, ep_length, goal_reached, collided, offroad, extra=None, red_light=None) -> torch.Tensor:
    """Per agent-episode metric values ``[..., M + E]`` float32: the per-episode columns of
    :data:`METRICS` (:func:`episode_rows`; M = ``len(METRIC_NAMES)``), then the ``E`` columns of
    ``extra``.

    Args:
        ep_return: ``[W, C]`` float return. ep_length: ``[W, C]`` int number of valid steps.
        goal_reached, collided, offroad: ``[W, C]`` bool episode flags.
        extra: optional ``[W, C, E]`` further columns (e.g. trial scores), cast to float32.
        red_light: optional ``[W, C]`` bool red-light violation flags (None: all 0).

    Raises:
        ValueError: if ``extra`` does not have shape ``[W, C, E]``.
    """
    red = torch.zeros_like(goal_reached, dtype=torch.bool) if red_light is None else red_light
    out = episode_rows({"return": ep_return, "length": ep_length, "goal": goal_reached, "collided": collided,
                        "offroad": offroad, "red_light": red})
    if extra is not None:
        if extra.dim() != out.dim() or tuple(extra.shape[:-1]) != tuple(out.shape[:-1]):
            raise ValueError(f"episode_values: extra must be {tuple(out.shape[:-1])} + [E], got {tuple(extra.shape)}")
        out = torch.cat([out, extra.to(torch.float32)], dim=-1)
    return out


#: Derived metrics of trial mode, one per trial k >= 1: ``(name, column)`` with ``name_k =
#: column_k - column_0`` (docs/design.md section 9: the adaptation ``ada_delta``). Linear, so the
#: mean of the per agent-episode differences (the evaluator, with intervals) equals the difference
#: of the means (the env's reports, EMA included).
ADAPTATION = (("ada_delta_trial_{k}_minus_0", "trial_{k}_score"),
              ("ada_delta_clean_trial_{k}_minus_0", "trial_{k}_clean_score"))


def derived_columns(cols: dict) -> dict:
    """The :data:`ADAPTATION` columns of ``cols`` (``{name: float or tensor}``: means or per
    agent-episode values): for every k >= 1 with ``trial_k_...`` and ``trial_0_...`` in ``cols``,
    ``{name_k: cols[column_k] - cols[column_0]}``, ordered by k then by :data:`ADAPTATION`."""
    out = {}
    k = 1
    while any(col.format(k=k) in cols for _, col in ADAPTATION):
        for name, col in ADAPTATION:
            if col.format(k=k) in cols and col.format(k=0) in cols:
                out[name.format(k=k)] = cols[col.format(k=k)] - cols[col.format(k=0)]
        k += 1
    return out


def _add_derived(out: dict[str, float]) -> dict[str, float]:
    """``out`` with its :func:`derived_columns` added (names already in ``out`` kept)."""
    for name, v in derived_columns(out).items():
        out.setdefault(name, v)
    return out


class EpisodeMetrics:
    """Device-side logs of finished agent-episodes: per-slot EMA (docs/design.md section 13) and plain means.

    Args:
        num_worlds: W. num_slots: C (policy slots per world); the EMA has N = W x C rows.
        alpha: EMA smoothing in [0, 1) (``EnvConfig.log_ema_alpha``); 0 keeps only the last episode.
        device: where the logs live.
        names: metric column names (default None: :data:`METRIC_NAMES` at construction; ``"n"`` is
            reserved).

    Attributes:
        names: tuple of column names; ema: the :class:`~gpusim.kernels.ema.EmaLog` ([N, M] slots).
        last: ``[W, C, M]`` float32, the values of the last agent-episode finished in each slot
            (NaN until one finishes; :meth:`clear_last` sets NaN again): the finished rows the env
            publishes, read by the evaluator (``train/eval/sweep.py``). Not part of
            :meth:`state_dict`.

    Raises:
        ValueError: negative sizes, bad alpha, empty/duplicate names or a name ``"n"``.
    """

    def __init__(self, num_worlds: int, num_slots: int, alpha: float = 0.707, device="cpu", names=None):
        if int(num_worlds) < 0 or int(num_slots) < 0:
            raise ValueError(f"EpisodeMetrics: sizes must be >= 0, got W={num_worlds}, C={num_slots}")
        self.shape = (int(num_worlds), int(num_slots))
        names = metric_columns() if names is None else names
        self.ema = EmaLog(self.shape[0] * self.shape[1], names, alpha=alpha, device=device)
        self.names = self.ema.names
        self.sums = torch.zeros(len(self.names), dtype=torch.float64, device=device)
        self.count = torch.zeros((), dtype=torch.int64, device=device)
        self.last = torch.full((*self.shape, len(self.names)), float("nan"), device=device)

    def clear_last(self) -> None:
        """Set every row of :attr:`last` to NaN (in place; before an episode whose rows are read)."""
        self.last.fill_(float("nan"))

    def add(self, values: torch.Tensor, finished: torch.Tensor, backend: str | None = None) -> None:
        """Record the agent-episodes where ``finished`` is True (device only, no host sync).

        Args:
            values: ``[W, C, M]`` float32 from :func:`episode_values` (rows not finished are ignored,
                whatever they hold).
            finished: ``[W, C]`` bool (``StepResult.terminal``).
            backend: the EMA kernel's backend (the step's, ``StepVars.backend``; None: resolved from
                the tensors, ``gpusim.backend.op_backend``).

        Raises:
            ValueError: wrong shapes.
        """
        W, C = self.shape
        M = len(self.names)
        if tuple(values.shape) != (W, C, M):
            raise ValueError(f"EpisodeMetrics.add: values must be {(W, C, M)}, got {tuple(values.shape)}")
        if tuple(finished.shape) != (W, C):
            raise ValueError(f"EpisodeMetrics.add: finished must be {(W, C)}, got {tuple(finished.shape)}")
        finished = finished.to(torch.bool)
        values = values.to(torch.float32)
        self.ema.update(values.reshape(W * C, M), finished.reshape(W * C), backend=backend)
        f = finished[..., None]
        self.sums += torch.where(f, values, 0.0).sum(dim=(0, 1), dtype=torch.float64)
        self.last.copy_(torch.where(f, values, self.last))
        self.count += finished.sum()

    def state_dict(self) -> dict:
        """The logs as plain data + tensors (for training checkpoints; ``torch.load(weights_only=True)``-safe):
        ``names``, ``shape``, ``alpha``, ``slots`` [N, M], ``has_data`` [N], ``sums`` [M], ``count`` []."""
        return {"names": list(self.names), "shape": list(self.shape), "alpha": self.ema.alpha,
                "slots": self.ema.slots.detach().cpu().clone(), "has_data": self.ema.has_data.detach().cpu().clone(),
                "sums": self.sums.detach().cpu().clone(), "count": self.count.detach().cpu().clone()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output (tensors copied in place onto this object's device).

        Raises:
            ValueError: if the names or the ``[W, C]`` shape differ from this object's.
        """
        if list(state.get("names", ())) != list(self.names) or list(state.get("shape", ())) != list(self.shape):
            raise ValueError(f"EpisodeMetrics.load_state_dict: saved metrics {state.get('names')} for "
                             f"[W, C] = {state.get('shape')}, this env has {list(self.names)} for {list(self.shape)}")
        self.ema.slots.copy_(state["slots"])
        self.ema.has_data.copy_(state["has_data"])
        self.sums.copy_(state["sums"])
        self.count.copy_(state["count"])

    def ema_totals(self) -> torch.Tensor:
        """Sum/count form of the EMA report: ``[M + 1]`` float64 device tensor, per column the sum of
        the EMA over the slots with data, then the number of such slots (no host read).

        Summed over several logs (e.g. all-reduced over training processes, ``train/distributed.py``)
        and passed to :func:`report_from_totals`, it gives the population mean over all their slots
        with data, not a mean of the logs' means.
        """
        has = self.ema.has_data
        sums = torch.where(has[:, None], self.ema.slots, 0.0).sum(dim=0, dtype=torch.float64)
        return torch.cat([sums, has.sum().to(torch.float64).view(1)])

    def report(self, kind: str = "ema") -> dict[str, float]:
        """Read the logs to the host (one small transfer).

        Args:
            kind: ``"ema"``: mean over the slots with data of their EMA, plus ``n`` = number of such
                slots; never resets. ``"mean"``: mean over the agent-episodes finished since the last
                ``"mean"`` report, plus ``n`` = their number; resets that accumulator.

        Returns:
            ``{name: value, ..., "n": float}`` (plus derived ``ada_delta_trial_k_minus_0`` when
            trial columns exist), or ``{}`` when there is nothing to report.

        Raises:
            ValueError: unknown ``kind``.
        """
        if kind == "ema":
            return _add_derived(self.ema.report())
        if kind != "mean":
            raise ValueError(f"EpisodeMetrics.report: kind must be 'ema' or 'mean', got {kind!r}")
        host = torch.cat([self.sums, self.count.to(torch.float64).view(1)]).tolist()
        self.sums.zero_()
        self.count.zero_()
        n = host[-1]
        if n == 0:
            return {}
        out = {name: v / n for name, v in zip(self.names, host[:-1])}
        out["n"] = n
        return _add_derived(out)


def report_from_totals(names, totals) -> dict[str, float]:
    """The EMA report built from (possibly summed) :meth:`EpisodeMetrics.ema_totals` values.

    Args:
        names: the metric column names (``EpisodeMetrics.names``), M of them.
        totals: M + 1 numbers (sequence or tensor): column sums over slots with data, then their count.

    Returns:
        ``{name: sum / count, ..., "n": count}`` plus the derived ``ada_delta_trial_k_minus_0``;
        ``{}`` when the count is 0 (as :meth:`EpisodeMetrics.report`).

    Raises:
        ValueError: ``totals`` does not hold ``len(names) + 1`` numbers.
    """
    host = totals.tolist() if isinstance(totals, torch.Tensor) else [float(v) for v in totals]
    if len(host) != len(names) + 1:
        raise ValueError(f"report_from_totals: expected {len(names) + 1} numbers for {len(names)} names, "
                         f"got {len(host)}")
    n = host[-1]
    if n == 0:
        return {}
    out = {name: v / n for name, v in zip(names, host[:-1])}
    out["n"] = n
    return _add_derived(out)
