"""``python -m train.plot RUN_DIR [RUN_DIR ...] --out curves.png``: learning curves of training runs.

Reads each run's ``metrics.jsonl`` (written by ``train/run.py``, one record per report; see
``train/logger.py``) and draws, against ``global_step`` (controlled-agent steps), one panel per
metric with one line per run (runs overlaid, labelled by their directory name):

* ``goal_reached`` (goal), ``collided`` (collision), ``offroad``, ``episode_return`` (return) —
  the per-agent EMA population means of the training reports (docs/design.md section 13);
* in trial mode also a panel of the per-trial scores (``trial_k_score``, one line per run and
  trial k) and one of ``ada_delta_trial_k_minus_0``.

A metric logged as ``ego/<name>`` (co-player runs) is used when ``<name>`` itself is absent.
``--source eval`` draws instead the periodic evaluation of training (``--eval-interval``: the
deterministic sweep over ``--eval-data``, logged as ``eval/<mode>/<name>``; ``eval`` is
``eval/self_play``, ``eval/coplayer`` etc. name the mode): the learning curve on held-out
scenarios when ``--eval-data`` is a held-out split.
``--reference EVAL.json`` adds a dashed horizontal line per main panel: the mean of that metric
for the policy ``--reference-policy`` (default ``steer_to_goal``) in an evaluation JSON
(``train/evaluate.py --policy steer_to_goal --json EVAL.json``), so a curve can be read against
the scripted baseline (:func:`reference_values`).
Records without a metric are skipped in that panel; a partial last line (a run killed mid-write)
is ignored. Matplotlib runs with the non-interactive Agg backend (no display needed).

Readable at any run length: the x ticks are at most :data:`MAX_X_TICKS` round numbers written
with a unit suffix (``0, 250K, 500K, 1.5M, 2G``; :func:`step_label`), and a run with at most
:data:`MARKER_MAX_POINTS` reports is drawn with point markers, so a run with a single report still
shows a dot for its legend entry. Every panel names its quantity and unit on the y axis.

Errors (one line, exit code 2): a run directory or file that does not exist, has no
``metrics.jsonl``, or has no record with ``global_step``.
"""

from __future__ import annotations

import json
import pathlib
import sys
from dataclasses import dataclass

if __package__ in (None, ""):  # `python train/plot.py` from a checkout without `pip install -e .`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import tyro

from gpusim.fileio import OutputError, atomic_write, check_output_path
from train.config import UserError

METRICS_FILE = "metrics.jsonl"
#: (metric, panel title, y-axis label with unit) of the main panels, in order.
PANELS = (("goal_reached", "goal reached", "fraction of episodes"),
          ("collided", "collision", "fraction of episodes"),
          ("offroad", "offroad", "fraction of episodes"),
          ("episode_return", "episode return", "reward per episode (sum)"))
#: (panel title, y-axis label) of the trial-mode panels.
TRIAL_PANEL = ("per-trial score (goal in trial k)", "fraction of trials")
ADA_PANEL = ("ada_delta (score of trial k minus trial 0)", "score difference")
X_LABEL = "controlled-agent steps (global_step)"
#: At most this many x ticks per panel (labels never run together on a 5-inch panel).
MAX_X_TICKS = 6
#: Series with at most this many reports are drawn with point markers (one report = one dot).
MARKER_MAX_POINTS = 30


def step_label(x: float, _pos=None) -> str:
    """Tick text of an agent-step count with an engineering suffix and at most 3 significant
    digits: ``0``, ``800``, ``12.5K``, ``250K``, ``1.5M``, ``2G`` (K = 10^3, M = 10^6, G = 10^9).
    ``_pos`` is matplotlib's tick index (unused; the signature of a ``FuncFormatter``)."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}" if x else "0"


def _style_x_axis(ax) -> None:
    """Round x ticks (at most :data:`MAX_X_TICKS`) labelled by :func:`step_label`."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(nbins=MAX_X_TICKS - 1, steps=[1, 2, 2.5, 5, 10]))
    ax.xaxis.set_major_formatter(FuncFormatter(step_label))
    ax.set_xlabel(X_LABEL)


def load_records(run: str | pathlib.Path) -> list[dict]:
    """The JSON records of a run directory's ``metrics.jsonl`` (or of that file given directly),
    in file order, keeping only records with a numeric ``global_step``.

    Raises:
        UserError: no such directory/file, no ``metrics.jsonl``, or no usable record in it.
    """
    path = pathlib.Path(run)
    if not path.exists():
        raise UserError(f"{run}: no such run directory")
    file = path / METRICS_FILE if path.is_dir() else path
    if not file.is_file():
        raise UserError(f"{run}: no {METRICS_FILE} in this directory (is it a train/run.py run directory?)")
    records = []
    for line in file.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a partial line of a run killed mid-write
        if isinstance(rec, dict) and isinstance(rec.get("global_step"), (int, float)):
            records.append(rec)
    if not records:
        raise UserError(f"{file}: no report records (empty, or the run stopped before its first report)")
    return records


def _series(records: list[dict], name: str, prefix: str = "") -> tuple[list[float], list[float]]:
    """``(global_steps, values)`` of metric ``prefix + name`` (or ``ego/<name>`` without a
    prefix) over the records that have it."""
    xs, ys = [], []
    for rec in records:
        v = rec.get(prefix + name, None if prefix else rec.get(f"ego/{name}"))
        if isinstance(v, (int, float)):
            xs.append(float(rec["global_step"]))
            ys.append(float(v))
    return xs, ys


def _trial_names(records: list[dict], prefix: str, suffix: str) -> list[str]:
    """Metric names ``<prefix>k<suffix>`` present in the records, in k order."""
    found = set()
    for rec in records:
        for key in rec:
            key = key[4:] if key.startswith("ego/") else key
            if key.startswith(prefix) and key.endswith(suffix):
                mid = key[len(prefix):len(key) - len(suffix)]
                if mid.isdigit():  # trial_k_clean_score has "k_clean" here and stays out
                    found.add(int(mid))
    return [f"{prefix}{k}{suffix}" for k in sorted(found)]


def reference_values(path: str | pathlib.Path, policy: str = "steer_to_goal") -> dict[str, float]:
    """The means ``{metric: value}`` of ``policy`` in an evaluation JSON of ``train/evaluate.py
    --json`` (its first run labelled ``policy``), for the metrics of :data:`PANELS` it has.

    Raises:
        UserError: no such file, not an evaluation JSON, or no run of ``policy`` in it (the labels
            it has are named).
    """
    file = pathlib.Path(path)
    if not file.is_file():
        raise UserError(f"--reference {path}: no such file (write one with train/evaluate.py --policy {policy} "
                        f"--json {path})")
    try:
        runs = json.loads(file.read_text())["runs"]
        labels = [r["label"] for r in runs]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise UserError(f"--reference {path}: not an evaluation JSON of train/evaluate.py --json ({e})") from None
    if policy not in labels:
        raise UserError(f"--reference {path}: no run of {policy!r} in it (it has {', '.join(labels) or 'none'}); "
                        "pass --reference-policy LABEL")
    summary = runs[labels.index(policy)].get("summary", {})
    return {name: float(summary[name]["mean"]) for name, _, _ in PANELS
            if isinstance(summary.get(name), dict) and isinstance(summary[name].get("mean"), (int, float))}


def _labels(runs: list[str]) -> list[str]:
    """Run labels: the directory names, with the parent added where two are the same."""
    paths = [pathlib.Path(r) for r in runs]
    names = [(p.parent.name if p.is_file() else p.name) or str(p) for p in paths]
    out = []
    for p, n in zip(paths, names):
        d = p.parent if p.is_file() else p
        out.append(f"{d.parent.name}/{n}" if names.count(n) > 1 and d.parent.name else n)
    return out


def _prefix(source: str) -> str:
    """The record-key prefix of ``--source``: ``""`` for ``train``, ``eval/<mode>/`` for ``eval[/<mode>]``.

    Raises:
        UserError: another value.
    """
    if source == "train":
        return ""
    if source == "eval":
        return "eval/self_play/"
    if source.startswith("eval/") and source.count("/") == 1 and source[5:]:
        return source + "/"
    raise UserError(f"--source {source}: use train, eval or eval/<mode> (e.g. eval/coplayer)")


def plot_runs(runs: list[str], out: str | pathlib.Path | None = None, title: str | None = None,
              source: str = "train", reference: str | pathlib.Path | None = None,
              reference_policy: str = "steer_to_goal"):
    """Draw the learning curves of ``runs`` (module docstring) and save them to ``out`` if given.

    Args:
        runs: run directories (or ``metrics.jsonl`` files). out: image path (format from the
            extension, e.g. ``.png``, ``.pdf``, ``.svg``). title: figure title.
        source: ``train`` (the training reports) or ``eval[/<mode>]`` (the periodic evaluation).
        reference: an evaluation JSON (``train/evaluate.py --json``); its ``reference_policy``
            means are drawn as dashed horizontal lines in the main panels (:func:`reference_values`).

    Returns:
        The matplotlib ``Figure`` (axes in panel order; one ``Line2D`` per run and metric, with
        point markers when the run has at most :data:`MARKER_MAX_POINTS` reports).

    Raises:
        UserError: see :func:`load_records`; no run given; an unknown image extension; a bad
            ``source``, or no run with a periodic evaluation for it. OutputError (a ValueError):
            ``out`` cannot be written (checked before any work: :func:`gpusim.fileio.check_output_path`;
            the image is written atomically).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not runs:
        raise UserError("give at least one run directory")
    if out is not None:  # before any work
        check_output_path(out, "--out")
    prefix = _prefix(source)
    refs = reference_values(reference, reference_policy) if reference is not None else {}
    data = [load_records(r) for r in runs]
    if prefix and not any(_series(recs, "goal_reached", prefix)[0] for recs in data):
        raise UserError(f"--source {source}: no run has {prefix}goal_reached records "
                        "(train with --eval-interval N, and --eval-data for held-out scenarios)")
    labels = _labels(list(runs))
    panels = [(title, ylabel, [name]) for name, title, ylabel in PANELS]
    trial_scores = sorted({n for recs in data for n in _trial_names(recs, "trial_", "_score")},
                          key=lambda n: int(n.split("_")[1]))
    deltas = sorted({n for recs in data for n in _trial_names(recs, "ada_delta_trial_", "_minus_0")},
                    key=lambda n: int(n.split("_")[3]))
    if trial_scores:
        panels.append((*TRIAL_PANEL, trial_scores))
    if deltas:
        panels.append((*ADA_PANEL, deltas))
    cols = 2 if len(panels) <= 4 else 3
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.0 * cols, 3.4 * rows), squeeze=False)
    for ax, (ptitle, ylabel, names) in zip(axes.flat, panels):
        for label, recs in zip(labels, data):
            for name in names:
                xs, ys = _series(recs, name, prefix)
                if xs:
                    suffix = f" {name.replace('_score', '').replace('ada_delta_', '')}" if len(names) > 1 else ""
                    marker = "o" if len(xs) <= MARKER_MAX_POINTS else None
                    ax.plot(xs, ys, label=label + suffix, marker=marker, markersize=4 if len(xs) == 1 else 2.5)
        if len(names) == 1 and names[0] in refs:
            ax.axhline(refs[names[0]], color="0.35", linestyle="--", linewidth=1.2,
                       label=f"{reference_policy} (evaluated)")
        ax.set_title(ptitle)
        ax.set_ylabel(ylabel)
        _style_x_axis(ax)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if title or prefix:
        fig.suptitle(title or f"periodic evaluation ({prefix.rstrip('/')})")
    fig.tight_layout()
    if out is not None:
        out = pathlib.Path(out)
        if out.suffix.lstrip(".").lower() not in fig.canvas.get_supported_filetypes():
            raise UserError(f"--out {out}: unknown image format {out.suffix!r}; use .png, .pdf or .svg")
        with atomic_write(out, "wb", flag="--out") as f:
            fig.savefig(f, format=out.suffix.lstrip(".").lower(), dpi=110)
    return fig


@dataclass
class PlotConfig:
    """Arguments of ``python -m train.plot``.

    Attributes:
        runs: run directories of ``train/run.py`` (or their ``metrics.jsonl`` files), overlaid.
        out: image file to write (format from the extension).
        title: figure title.
        source: ``train`` (the training reports, per-agent EMA of sampled episodes) or ``eval``
            / ``eval/<mode>`` (the periodic evaluation of ``--eval-interval``: on held-out
            scenarios when ``--eval-data`` is a held-out split).
        reference: an evaluation JSON (``train/evaluate.py --json``) whose ``--reference-policy``
            means are drawn as dashed reference lines (e.g. ``steer_to_goal`` on the same data).
        reference_policy: the policy label of that JSON to draw (default ``steer_to_goal``).
    """

    runs: tyro.conf.Positional[tuple[str, ...]]
    out: str = "curves.png"
    title: str | None = None
    source: str = "train"
    reference: str | None = None
    reference_policy: str = "steer_to_goal"


def main(argv=None) -> int:
    """CLI entry point: 0 on success, 2 with a one-line message for a user error."""
    cfg = tyro.cli(PlotConfig, args=argv, description=__doc__.split("\n\n")[0])
    try:
        plot_runs(list(cfg.runs), cfg.out, cfg.title, cfg.source, cfg.reference, cfg.reference_policy)
    except (UserError, OutputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {cfg.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
