"""Summaries of evaluation records (means with confidence intervals) and their rich tables.

Input: the per agent-episode records of :func:`train.eval.sweep.run_sweep` (1-D CPU tensors per
column). Reported metrics (labels in brackets):

* the metrics of the registry ``gpusim.metrics.METRICS`` (:func:`summary_metrics`, each with its
  label and range): ``episode_return`` (return), ``goal_reached`` (goal), ``collided``
  (collision), ``offroad`` (offroad), ``score`` (goal reached without collision or offroad),
  ``red_light_violation`` (red-light violation), ``collision_or_offroad`` (collision or offroad:
  the union per agent-episode, an agent that does both counts once);
* trial mode: ``trial_k_score`` (goal reached in trial k, docs/design.md section 9),
  ``trial_k_clean_score`` (goal in trial k without collision/offroad), the per-trial metrics of
  the registry, and ``ada_delta_trial_k_minus_0`` (``gpusim.metrics.ADAPTATION``) = the mean over
  agent-episodes of ``trial_k_score - trial_0_score`` (paired, so its interval is that of the
  per-agent differences), ``ada_delta_clean_trial_k_minus_0`` the same on the clean scores,
  plus per world-episode trial logs (trials completed, share ended before
  the timeout, mean trial length in steps); on the memory task also ``trial_k_decoy`` (reached a
  wrong candidate in trial k) and, over the agent-episodes whose trial 0 ended at a wrong
  candidate, ``decoy_then_goal_trial_k`` (reached the true goal in trial k) and
  ``decoy_then_decoy_trial_k`` (a wrong candidate again): a policy that remembers trial 0 turns
  the second into the first, a memoryless deterministic one repeats trial 0;
* reward conditioning (driving styles): ``mean_speed`` (m/s), ``min_gap`` (m) and
  ``time_to_goal`` (s, over the agents that reached the goal) when the records have them
  (:data:`train.eval.styles.STYLE_METRICS`).

Every mean comes with a confidence interval over agent-episodes clustered by scenario
(:mod:`train.eval.stats`: the scenario, not the agent-episode, is the independent draw), clipped
to the metric's range (``[0, 1]`` for rates, ``[-1, 1]`` for ``ada_delta``); each
:class:`~train.eval.stats.Interval` carries the agent-episode count ``n`` and the scenario count
``clusters``. A repetition of a scenario whose every agent-episode record equals that of an
earlier repetition (a deterministic policy in a deterministic env replays the same episode) is
counted once in ``n`` (:func:`repeated_episodes`): it adds no information. Every row still enters
the means (each scenario keeps the weight of its ``--episodes-per-scenario`` runs, as the sweep
ran them), and the clustered intervals are not narrowed by repetition: their width is set by the
number of scenarios.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from gpusim import metrics as registry
from gpusim.metrics import ADAPTATION, collision_or_offroad, derived_columns
from train.eval.stats import Interval, mean_interval
from train.eval.styles import STYLE_METRICS


def summary_metrics() -> tuple:
    """The per-episode metrics of the registry (``gpusim.metrics.METRICS``, read at call time)
    the summaries report, in table order: :class:`~gpusim.metrics.Metric` s with ``summary`` set
    and no ``per_trial``, the bounded ones (rates) first, each group in registry order."""
    chosen = [m for m in registry.METRICS if m.summary and not m.per_trial]
    return tuple(sorted(chosen, key=lambda m: m.bounds is None))


def metric_labels() -> dict[str, str]:
    """``{column: table label}`` of the registry's metrics and the style metrics."""
    return {**{m.name: m.label or m.name for m in registry.METRICS if not m.per_trial}, **dict(STYLE_METRICS)}


def _with_union(agents: dict) -> dict:
    """``agents`` with the ``collision_or_offroad`` column derived from ``collided`` and ``offroad``
    (:func:`gpusim.metrics.collision_or_offroad`) when the records lack it (records built by hand
    or written before the column existed)."""
    if "collision_or_offroad" in agents or "collided" not in agents or "offroad" not in agents:
        return agents
    either = collision_or_offroad(agents["collided"] > 0, agents["offroad"] > 0).to(torch.float32)
    return {**agents, "collision_or_offroad": either}


def _trial_count(agents: dict) -> int:
    k = 0
    while f"trial_{k}_score" in agents:
        k += 1
    return k


#: Record columns that differ between repetitions of one episode without the episode differing.
_PLACEMENT_COLUMNS = ("world", "repetition")


def repeated_episodes(agents: dict) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """The repetitions that replay an earlier repetition of their scenario exactly.

    Repetition ``r`` of scenario ``s`` repeats repetition ``r' < r`` when both hold the same
    agent-episodes (slots) with equal values in every record column other than ``world`` and
    ``repetition`` (bit for bit, NaN equal to NaN): outcomes, return, length and, where
    recorded, trial scores and style metrics. A deterministic policy in a deterministic env
    gives exactly that; sampled actions, a ``random`` policy or goals drawn again per episode
    practically never do.

    Args:
        agents: per agent-episode columns (1-D tensors of equal length) with ``scenario`` and
            ``repetition`` (records without them have no repetitions: nothing is dropped).

    Returns:
        ``(keep, dropped)``: ``keep`` [n] bool, False for the agent-episodes of a repeated
        repetition; ``dropped``: the ``(scenario, repetition)`` pairs left out, sorted.
    """
    n = len(next(iter(agents.values()))) if agents else 0
    keep = torch.ones(n, dtype=torch.bool)
    if n == 0 or "scenario" not in agents or "repetition" not in agents:
        return keep, []
    names = sorted(k for k in agents if k not in _PLACEMENT_COLUMNS)
    table = torch.stack([agents[k].detach().to("cpu", torch.float64) for k in names], 1)  # [n, columns]
    scen, reps = agents["scenario"].to("cpu", torch.int64), agents["repetition"].to("cpu", torch.int64)
    slot = agents["slot"].to("cpu", torch.int64) if "slot" in agents else torch.zeros(n, dtype=torch.int64)
    order = torch.arange(n)
    for key in (slot, reps, scen):  # lexicographic (scenario, repetition, slot): stable sorts, last key first
        order = order[torch.argsort(key[order], stable=True)]
    pairs = torch.stack([scen[order], reps[order]], 1)
    _, sizes = torch.unique_consecutive(pairs, dim=0, return_counts=True)
    seen: set[tuple[int, bytes]] = set()
    dropped = []
    for rows in torch.split(order, sizes.tolist()):
        s, r = int(scen[rows[0]]), int(reps[rows[0]])
        key = (s, table[rows].numpy().tobytes())
        if key in seen:
            keep[rows] = False
            dropped.append((s, r))
        else:
            seen.add(key)
    return keep, sorted(dropped)


def summarise(agents: dict, worlds: dict | None = None, method: str = "normal", level: float = 0.95,
              resamples: int = 2000, seed: int = 0, repeats: list | None = None) -> dict[str, Interval]:
    """Means with intervals of every reported metric (module docstring): intervals clustered by
    ``scenario``; ``n`` counts repeated identical episodes once (:func:`repeated_episodes`).

    Args:
        agents: per agent-episode columns (1-D tensors of equal length); ``scenario`` (the
            cluster id) and ``repetition`` when present (records without ``scenario`` are
            treated as independent agent-episodes).
        worlds: per world-episode trial columns (``trials``, ``trials_ended_early``,
            ``trial_steps``, ``scenario``, ``repetition``) or empty / None outside trial mode.
        method, level, resamples, seed: see :func:`train.eval.stats.mean_interval`.
        repeats: if a list, the ``(scenario, repetition)`` pairs counted once are appended to it.

    Returns:
        ``{metric name: Interval}`` in table order (trial metrics after the main ones).
    """
    agents = _with_union(agents)
    keep, dropped = repeated_episodes(agents)
    if repeats is not None:
        repeats.extend(dropped)
    wkeep = None
    if worlds:  # the world-episodes of the repetitions counted once
        wkeep = torch.ones(len(worlds["trials"]), dtype=torch.bool)
        if dropped and "scenario" in worlds and "repetition" in worlds:
            gone = set(dropped)
            wkeep = torch.tensor([(s, r) not in gone for s, r in zip(worlds["scenario"].tolist(),
                                                                     worlds["repetition"].tolist())], dtype=torch.bool)
    clusters = agents.get("scenario")

    def ci(x, bounds=(0.0, 1.0), where=None, groups=clusters, distinct=keep):
        """The clustered interval of ``x`` (rows ``where`` of the records), ``n`` = its distinct
        agent-episodes (every row enters the mean: the sweep's weights are kept)."""
        c = None if groups is None else (groups if where is None else groups[where])
        iv = mean_interval(x, method=method, level=level, resamples=resamples, seed=seed, bounds=bounds,
                           clusters=c)
        return dataclasses.replace(iv, n=int((distinct if where is None else distinct[where]).sum()))

    out = {m.name: ci(agents[m.name], m.bounds) for m in summary_metrics() if m.name in agents}
    for name, _ in STYLE_METRICS:
        if name in agents:  # time_to_goal: NaN for agents that did not reach the goal, left out
            x = agents[name]
            out[name] = ci(x[~torch.isnan(x)], None, ~torch.isnan(x))
    K = _trial_count(agents)
    for m in registry.METRICS:  # the per-trial metrics of the registry
        if m.per_trial and m.summary:
            for k in range(K):
                if m.name.format(k=k) in agents:
                    out[m.name.format(k=k)] = ci(agents[m.name.format(k=k)], m.bounds)
    # ada_delta (gpusim.metrics.ADAPTATION): per agent-episode differences, so the interval is paired
    deltas = derived_columns(agents)
    for name, _ in ADAPTATION:
        for k in range(1, K):
            if name.format(k=k) in deltas:
                out[name.format(k=k)] = ci(deltas[name.format(k=k)], (-1.0, 1.0))
    if "trial_0_decoy" in agents:  # the memory task: what follows a wrong candidate in trial 0
        for k in range(K):
            out[f"trial_{k}_decoy"] = ci(agents[f"trial_{k}_decoy"])
        after = agents["trial_0_decoy"].to(torch.bool)
        for k in range(1, K):
            out[f"decoy_then_goal_trial_{k}"] = ci(agents[f"trial_{k}_score"][after], where=after)
            out[f"decoy_then_decoy_trial_{k}"] = ci(agents[f"trial_{k}_decoy"][after], where=after)
    if worlds:
        trials = worlds["trials"].to(torch.float64)
        wc = worlds.get("scenario")
        out["trials_per_episode"] = ci(trials, (0.0, float(trials.max())), groups=wc, distinct=wkeep)
        out["trials_ended_early"] = ci(worlds["trials_ended_early"].to(torch.float64) / trials.clamp_min(1), groups=wc,
                                       distinct=wkeep)
        n_trials = float(trials.sum())
        steps = float(worlds["trial_steps"].sum()) / n_trials if n_trials else float("nan")
        out["mean_trial_length"] = Interval(steps, float("nan"), float("nan"), int(n_trials), method, level)
    return out


def per_scenario(agents: dict, num_scenarios: int) -> list[dict]:
    """Plain means per scenario index ``s`` in ``[0, num_scenarios)``: ``{"index", "agent_episodes",
    "episodes", <metric>: mean}`` (``episodes`` = distinct repetitions; NaN means when empty)."""
    rows = []
    agents = _with_union(agents)
    scen = agents["scenario"].to(torch.int64)
    for s in range(num_scenarios):
        m = scen == s
        n = int(m.sum())
        row = {"index": s, "agent_episodes": n, "episodes": int(agents["repetition"][m].unique().numel())}
        for name in (x.name for x in summary_metrics() if x.name in agents):
            row[name] = float(agents[name][m].to(torch.float64).mean()) if n else float("nan")
        rows.append(row)
    return rows


def _fmt(x: float, digits: int = 3) -> str:
    return "—" if not math.isfinite(x) else f"{x:.{digits}f}"


def format_interval(iv: Interval, digits: int = 3) -> str:
    """``"0.650 [0.585, 0.715]"`` (or just the mean when the interval is undefined)."""
    if not math.isfinite(iv.lo):
        return _fmt(iv.mean, digits)
    return f"{_fmt(iv.mean, digits)} [{_fmt(iv.lo, digits)}, {_fmt(iv.hi, digits)}]"


def summary_table(runs: list[dict], title: str):
    """A rich Table: one row per metric, one column per run (``run["label"]``, ``run["summary"]``)."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title), title_justify="left")
    table.add_column("metric")
    for run in runs:
        table.add_column(escape(run["label"]), justify="right")
    labels = metric_labels()
    names = []
    for run in runs:
        names += [k for k in run["summary"] if k not in names]
    for name in names:
        # a conditional rate (decoy_then_*) is over a subset: its size goes with it
        cells = [(format_interval(r["summary"][name]) + (f" (n {r['summary'][name].n})" if name.startswith("decoy_then")
                                                        else "")) if name in r["summary"] else "" for r in runs]
        table.add_row(labels.get(name, name), *cells)
    n = [str(r["summary"]["goal_reached"].n) for r in runs]
    table.add_row("agent-episodes", *n, style="dim")
    g = [str(r["summary"]["goal_reached"].clusters or "—") for r in runs]
    table.add_row("scenarios (interval clusters)", *g, style="dim")
    return table


def scenario_table(runs: list[dict], scenario_ids: list[str], title: str):
    """A rich Table: one row per scenario (id, agent-episodes), per run ``goal / collision / offroad``."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title), title_justify="left", caption="cells: goal / collision / offroad (plain means)")
    table.add_column("#", justify="right")
    table.add_column("scenario")
    table.add_column("agent-eps", justify="right")
    for run in runs:
        table.add_column(escape(run["label"]), justify="right")
    for s, sid in enumerate(scenario_ids):
        rows = [r["per_scenario"][s] for r in runs]
        cells = [f"{_fmt(x['goal_reached'], 2)} / {_fmt(x['collided'], 2)} / {_fmt(x['offroad'], 2)}" for x in rows]
        table.add_row(str(s), escape(sid), str(rows[0]["agent_episodes"]), *cells)
    return table
