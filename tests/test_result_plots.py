"""profiling/scaling_plot.py and profiling/realism_plot.py: the points they read from run
directories and evaluation files (hand-made), and a clear error on bad input."""

import json

import pytest

from profiling import realism_plot, scaling_plot


def _eval(path, runs):
    path.write_text(json.dumps({"runs": runs}))
    return path


def test_scaling_points_pair_runs_with_their_evaluation(tmp_path):
    for n, train in ((25, 0.7), (50, 0.6)):
        d = tmp_path / f"n{n}_s1"
        d.mkdir()
        (d / "metrics.jsonl").write_text(json.dumps({"goal_reached": 0.1}) + "\n" + json.dumps({"goal_reached": train}))
    ev = _eval(tmp_path / "val.json", [
        {"label": "n50_s1/checkpoint.pt", "policy": str(tmp_path / "n50_s1/checkpoint.pt"),
         "summary": {"goal_reached": {"mean": 0.65, "lo": 0.6, "hi": 0.7}}},
        {"label": "n25_s1/checkpoint.pt", "policy": str(tmp_path / "n25_s1/checkpoint.pt"),
         "summary": {"goal_reached": {"mean": 0.55, "lo": 0.5, "hi": 0.6}}}])
    pts = scaling_plot.curve_points(ev, [f"50={tmp_path / 'n50_s1'}", f"25={tmp_path / 'n25_s1'}"])
    assert [(p["n"], p["val"], p["train"]) for p in pts] == [(25, 0.55, 0.7), (50, 0.65, 0.6)]
    with pytest.raises(ValueError, match="expected N=RUN_DIR"):
        scaling_plot.curve_points(ev, ["n50"])
    (tmp_path / "n75_s1").mkdir()
    (tmp_path / "n75_s1" / "metrics.jsonl").write_text(json.dumps({"goal_reached": 0.5}))
    with pytest.raises(ValueError, match="no evaluation of"):
        scaling_plot.curve_points(ev, [f"75={tmp_path / 'n75_s1'}"])
    out = tmp_path / "s.png"
    assert scaling_plot.main(["--out", str(out), "--curve", "cpu", str(ev), f"25={tmp_path / 'n25_s1'}"]) == 0
    assert out.stat().st_size > 0


def test_realism_points_match_labels_across_files(tmp_path):
    m = {"metametric": {"mean": 0.6, "lo": 0.55, "hi": 0.65}}
    w = _eval(tmp_path / "w.json", [{"label": "a", "summary": m}, {"label": "only_wosac", "summary": m}])
    g = _eval(tmp_path / "g.json", [{"label": "a", "summary": {"goal_reached": {"mean": 0.3, "lo": 0.2, "hi": 0.4}}}])
    pts = realism_plot.points([w], [g])
    assert [(p["label"], p["meta"], p["goal"]) for p in pts] == [("a", 0.6, 0.3)]
    with pytest.raises(ValueError, match="no policy label in both"):
        realism_plot.points([w], [_eval(tmp_path / "h.json", [{"label": "b", "summary": {}}])])
