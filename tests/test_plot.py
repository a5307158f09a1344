"""``python -m train.plot``: learning curves from run directories (train/plot.py)."""

from __future__ import annotations

import json
import pathlib

import pytest

from train import plot
from train.plot import load_records, main, plot_runs


def _run(tmp_path, name, trial=False, steps=(1000, 2000, 3000), extra_line=""):
    d = tmp_path / name
    d.mkdir(parents=True)
    lines = []
    for i, s in enumerate(steps):
        rec = {"update": i + 1, "global_step": s, "time": float(i), "sps": 100.0, "goal_reached": 0.1 * i,
               "collided": 0.2, "offroad": 0.1, "episode_return": 0.05 * i, "score": 0.1 * i}
        if trial:
            rec.update(trial_0_score=0.1 * i, trial_1_score=0.15 * i, trial_0_clean_score=0.1 * i,
                       ada_delta_trial_1_minus_0=0.05 * i)
        lines.append(json.dumps(rec))
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n" + extra_line)
    return d


def test_plot_writes_png_with_one_line_per_run(tmp_path):
    a = _run(tmp_path, "a")
    b = _run(tmp_path, "b", trial=True, extra_line='{"update": 4, "global_st')  # partial last line: ignored
    out = tmp_path / "curves.png"
    fig = plot_runs([str(a), str(b)], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    axes = {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}
    ada = "ada_delta (score of trial k minus trial 0)"
    assert set(axes) == {"goal reached", "collision", "offroad", "episode return", "per-trial score (goal in trial k)",
                         ada}
    for title in ("goal reached", "collision", "offroad", "episode return"):
        assert len(axes[title].lines) == 2, title  # runs overlaid
        assert [ln.get_label() for ln in axes[title].lines] == ["a", "b"]
    assert len(axes["per-trial score (goal in trial k)"].lines) == 2  # run b: trials 0 and 1 (clean score left out)
    assert len(axes[ada].lines) == 1
    xs, ys = axes["goal reached"].lines[1].get_data()
    assert list(xs) == [1000.0, 2000.0, 3000.0] and list(ys) == pytest.approx([0.0, 0.1, 0.2])


def test_plot_cli(tmp_path, capsys):
    a = _run(tmp_path, pathlib.Path("x") / "run")
    b = _run(tmp_path, pathlib.Path("y") / "run")
    out = tmp_path / "c.png"
    assert main([str(a), str(b), "--out", str(out)]) == 0
    assert out.exists() and out.stat().st_size > 0
    fig = plot_runs([str(a), str(b)])
    assert [ln.get_label() for ln in fig.axes[0].lines] == ["x/run", "y/run"]  # same names: parent added
    assert main([str(a), "--out", str(tmp_path / "c.xyz")]) == 2
    assert "unknown image format" in capsys.readouterr().err


@pytest.mark.parametrize("case, message", [("missing", "no such run directory"), ("nofile", "no metrics.jsonl"),
                                           ("empty", "no report records")])
def test_plot_bad_run_dir_exit_2(tmp_path, capsys, case, message):
    d = tmp_path / "run"
    if case != "missing":
        d.mkdir()
    if case == "empty":
        (d / "metrics.jsonl").write_text("")
    assert main([str(d), "--out", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "c.png").exists()


def test_load_records_skips_records_without_step(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    (d / "metrics.jsonl").write_text('{"note": 1}\n{"global_step": 5, "goal_reached": 0.5}\n')
    assert load_records(d) == [{"global_step": 5, "goal_reached": 0.5}]
    assert load_records(d / "metrics.jsonl") == load_records(d)


# ------------------------------------------------------------------ readable at any run length
def _tick_texts(fig, ax):
    fig.canvas.draw()
    lo, hi = ax.get_xlim()
    return [t.get_text() for t, v in zip(ax.get_xticklabels(), ax.get_xticks()) if lo <= v <= hi]


def _assert_readable(fig):
    """Every visible panel: x tick labels do not overlap, every legend entry's line has data and a
    single-point line has a marker; axes carry units."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in (a for a in fig.axes if a.get_visible()):
        lo, hi = ax.get_xlim()
        boxes = sorted((t.get_window_extent(renderer) for t, v in zip(ax.get_xticklabels(), ax.get_xticks())
                        if lo <= v <= hi and t.get_text()), key=lambda b: b.x0)
        assert 2 <= len(boxes) <= plot.MAX_X_TICKS
        for left, right in zip(boxes, boxes[1:]):
            assert left.x1 < right.x0, ax.get_title()  # labels do not run together
        assert ax.get_xlabel() == plot.X_LABEL and ax.get_ylabel()
        legend = ax.get_legend()
        assert legend is not None
        by_label = {ln.get_label(): ln for ln in ax.lines}
        for text in legend.get_texts():
            ln = by_label[text.get_text()]
            xs, _ = ln.get_data()
            assert len(xs) >= 1
            if len(xs) == 1:
                assert ln.get_marker() not in (None, "None", "", " ") and ln.get_markersize() > 0


def test_step_label_engineering_suffixes():
    assert [plot.step_label(v) for v in (0, 800, 12_500, 250_000, 1_000_000, 1_500_000, 2_000_000_000, -500_000)] == \
        ["0", "800", "12.5K", "250K", "1M", "1.5M", "2G", "-500K"]


def test_single_report_run_draws_a_point(tmp_path):
    one = _run(tmp_path, "one", steps=(65_536,))
    many = _run(tmp_path, "many", steps=tuple(range(20_000, 2_000_001, 20_000)))  # 100 reports
    fig = plot_runs([str(one), str(many)])
    _assert_readable(fig)
    goal = fig.axes[0]
    first, second = goal.lines
    assert first.get_label() == "one" and list(first.get_xdata()) == [65_536.0] and first.get_marker() == "o"
    assert second.get_marker() in (None, "None", "")  # 100 reports: a plain line
    assert _tick_texts(fig, goal) == ["0", "500K", "1M", "1.5M", "2M"]
    assert goal.get_ylabel() == "fraction of episodes" and fig.axes[3].get_ylabel().startswith("reward")


def test_short_run_ticks_do_not_run_together(tmp_path):
    """Three reports below 1M steps (a CPU smoke run): round K ticks, no scientific notation."""
    run = _run(tmp_path, "short", steps=(196_608, 393_216, 589_824), trial=True)
    fig = plot_runs([str(run)])
    _assert_readable(fig)
    texts = _tick_texts(fig, fig.axes[0])
    assert texts == ["200K", "300K", "400K", "500K", "600K"]


def test_single_report_alone(tmp_path):
    run = _run(tmp_path, "solo", steps=(4096,))
    fig = plot_runs([str(run)], tmp_path / "solo.png")
    _assert_readable(fig)
    assert all(ln.get_marker() == "o" for ax in fig.axes if ax.get_visible() for ln in ax.lines)


def test_source_eval_draws_the_periodic_evaluation(tmp_path, capsys):
    """``--source eval`` reads ``eval/self_play/<metric>`` (the held-out learning curve), not the
    training EMA; a run without periodic evaluation is one line, exit code 2."""
    d = tmp_path / "ev"
    d.mkdir()
    recs = [{"global_step": s, "goal_reached": 0.9, "eval/self_play/goal_reached": g, "eval/self_play/collided": 0.1}
            for s, g in ((1000, 0.2), (2000, 0.5))] + [{"global_step": 2500, "goal_reached": 0.95}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    fig = plot_runs([str(d)], source="eval")
    goal = fig.axes[0].lines[0]
    assert list(goal.get_xdata()) == [1000.0, 2000.0] and list(goal.get_ydata()) == [0.2, 0.5]
    assert "eval/self_play" in fig._suptitle.get_text()
    assert main([str(tmp_path / "ev"), "--source", "eval/coplayer", "--out", str(tmp_path / "x.png")]) == 2
    assert "--source eval/coplayer" in capsys.readouterr().err
    assert main([str(d), "--source", "bogus", "--out", str(tmp_path / "x.png")]) == 2
