"""Episode metrics of finished agent-episodes, kept on the device (docs/design.md section 13).

Metrics of one agent-episode, in the column order of :data:`METRIC_NAMES`:

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
:func:`trial_metric_names` columns (``trial_k_score`` = goal reached in trial k,
``trial_k_clean_score`` = the same without collision/offroad) through ``episode_values(..., extra=...)``;
a report then also derives ``ada_delta_trial_k_minus_0 = trial_k_score - trial_0_score`` (exact
for the EMA population mean too, since the EMA and the mean are linear and every column of a slot
is updated together).

Roles (population play, ``gpusim/sim/roles.py``): the env's log holds the *ego* slots' episodes
only (``DriveEnv.metrics()``, reported as the training metrics); with co-players the env keeps a
second :class:`EpisodeMetrics` for the co-player slots (``DriveEnv.metrics(role="coplayer")``), so
partner goals and collisions never enter the ego's figures.
"""

from __future__ import annotations

import torch

from gpusim.kernels.ema import EmaLog

METRIC_NAMES = ("episode_return", "episode_length", "goal_reached", "collided", "offroad", "score",
                "red_light_violation", "collision_or_offroad")


def trial_metric_names(k_trials: int) -> tuple[str, ...]:
    """Names of the per-trial columns of trial mode: ``("trial_0_score", ..., "trial_{k-1}_score",
    "trial_0_clean_score", ..., "trial_{k-1}_clean_score")``.

    ``trial_k_score`` = goal reached in trial k (docs/design.md section 9; ``ada_delta`` is computed from
    it); ``trial_k_clean_score`` = goal reached in trial k without a collision or offroad event in
    that trial (the stricter figure).

    Raises:
        ValueError: if ``k_trials < 1``.
    """
    if int(k_trials) < 1:
        raise ValueError(f"trial_metric_names: k_trials must be >= 1, got {k_trials}")
    k = range(int(k_trials))
    return tuple(f"trial_{i}_score" for i in k) + tuple(f"trial_{i}_clean_score" for i in k)


def clean_goal(goal_reached: torch.Tensor, collided: torch.Tensor, offroad: torch.Tensor) -> torch.Tensor:
    """The ``score`` of an agent-episode (or of one trial): goal reached without a collision or an
    off-road event. Bool tensors of one shape in, the same shape out (bool). The one definition:
    the env's metric log and the evaluator's records both use it."""
    return goal_reached & ~collided & ~offroad


def collision_or_offroad(collided: torch.Tensor, offroad: torch.Tensor) -> torch.Tensor:
    """The ``collision_or_offroad`` flag of an agent-episode: it collided, went offroad, or both
    (the union, so an agent that does both counts once). Bool tensors of one shape in, the same
    shape out (bool). The one definition: the env's metric log and the evaluator's records both use
    it."""
    return collided | offroad


def episode_values(ep_return, ep_length, goal_reached, collided, offroad, extra=None, red_light=None) -> torch.Tensor:
    """Per agent-episode metric values ``[..., 8 + E]`` float32 in the order of :data:`METRIC_NAMES`,
    then the ``E`` columns of ``extra``.

    Args:
        ep_return: ``[W, C]`` float return. ep_length: ``[W, C]`` int number of valid steps.
        goal_reached, collided, offroad: ``[W, C]`` bool episode flags.
        extra: optional ``[W, C, E]`` further columns (e.g. trial scores), cast to float32.
        red_light: optional ``[W, C]`` bool red-light violation flags (None: all 0).

    Raises:
        ValueError: if ``extra`` does not have shape ``[W, C, E]``.
    """
    g, c, o = goal_reached.float(), collided.float(), offroad.float()
    score = clean_goal(goal_reached, collided, offroad).float()
    red = torch.zeros_like(g) if red_light is None else red_light.float()
    either = collision_or_offroad(collided, offroad).float()
    cols = [ep_return.float(), ep_length.float(), g, c, o, score, red, either]
    out = torch.stack(cols, dim=-1)
    if extra is not None:
        if extra.dim() != out.dim() or tuple(extra.shape[:-1]) != tuple(out.shape[:-1]):
            raise ValueError(f"episode_values: extra must be {tuple(out.shape[:-1])} + [E], got {tuple(extra.shape)}")
        out = torch.cat([out, extra.to(torch.float32)], dim=-1)
    return out


def _add_derived(out: dict[str, float]) -> dict[str, float]:
    """Add ``ada_delta_trial_k_minus_0`` for every ``trial_k_score`` (k >= 1) when ``trial_0_score`` exists,
    and ``ada_delta_clean_trial_k_minus_0`` (the same on ``trial_k_clean_score``) when the clean scores exist."""
    if "trial_0_score" not in out:
        return out
    k = 1
    while f"trial_{k}_score" in out:
        out.setdefault(f"ada_delta_trial_{k}_minus_0", out[f"trial_{k}_score"] - out["trial_0_score"])
        if f"trial_{k}_clean_score" in out and "trial_0_clean_score" in out:
            out.setdefault(f"ada_delta_clean_trial_{k}_minus_0",
                           out[f"trial_{k}_clean_score"] - out["trial_0_clean_score"])
        k += 1
    return out


class EpisodeMetrics:
    """Device-side logs of finished agent-episodes: per-slot EMA (docs/design.md section 13) and plain means.

    Args:
        num_worlds: W. num_slots: C (policy slots per world); the EMA has N = W x C rows.
        alpha: EMA smoothing in [0, 1) (``EnvConfig.log_ema_alpha``); 0 keeps only the last episode.
        device: where the logs live.
        names: metric column names (default :data:`METRIC_NAMES`; ``"n"`` is reserved).

    Attributes:
        names: tuple of column names; ema: the :class:`~gpusim.kernels.ema.EmaLog` ([N, M] slots).

    Raises:
        ValueError: negative sizes, bad alpha, empty/duplicate names or a name ``"n"``.
    """

    def __init__(self, num_worlds: int, num_slots: int, alpha: float = 0.707, device="cpu", names=METRIC_NAMES):
        if int(num_worlds) < 0 or int(num_slots) < 0:
            raise ValueError(f"EpisodeMetrics: sizes must be >= 0, got W={num_worlds}, C={num_slots}")
        self.shape = (int(num_worlds), int(num_slots))
        self.ema = EmaLog(self.shape[0] * self.shape[1], names, alpha=alpha, device=device)
        self.names = self.ema.names
        self.sums = torch.zeros(len(self.names), dtype=torch.float64, device=device)
        self.count = torch.zeros((), dtype=torch.int64, device=device)

    def add(self, values: torch.Tensor, finished: torch.Tensor) -> None:
        """Record the agent-episodes where ``finished`` is True (device only, no host sync).

        Args:
            values: ``[W, C, M]`` float32 from :func:`episode_values` (rows not finished are ignored,
                whatever they hold).
            finished: ``[W, C]`` bool (``StepResult.terminal``).

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
        self.ema.update(values.reshape(W * C, M), finished.reshape(W * C))
        f = finished[..., None]
        self.sums += torch.where(f, values, 0.0).sum(dim=(0, 1), dtype=torch.float64)
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
