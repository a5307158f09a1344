"""``python -m train.plot``: learning curves from run directories (train/plot.py)."""

from __future__ import annotations

import json
import pathlib

import pytest

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
    assert set(axes) == {"goal", "collision", "offroad", "return", "per-trial score (goal in trial k)",
                         "ada_delta_trial_k_minus_0"}
    for title in ("goal", "collision", "offroad", "return"):
        assert len(axes[title].lines) == 2, title  # runs overlaid
        assert [ln.get_label() for ln in axes[title].lines] == ["a", "b"]
    assert len(axes["per-trial score (goal in trial k)"].lines) == 2  # run b: trials 0 and 1 (clean score left out)
    assert len(axes["ada_delta_trial_k_minus_0"].lines) == 1
    xs, ys = axes["goal"].lines[1].get_data()
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
