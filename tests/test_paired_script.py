"""profiling/paired.py: paired differences of two policies read from an evaluate --records file."""

import json

import pytest

from profiling import paired


def _rows():
    rows = []
    # scene a: policy reaches 2 of 2, baseline 1 of 2; scene b: both 0 of 1; an unpaired slot of the policy
    for pol, goals in (("runs/x/checkpoint.pt", {("a", 0): 1, ("a", 1): 1, ("b", 0): 0, ("b", 5): 1}),
                       ("steer_to_goal", {("a", 0): 1, ("a", 1): 0, ("b", 0): 0})):
        for (scen, slot), g in goals.items():
            rows.append({"policy": pol, "mode": "self_play", "role": "ego", "scenario": scen, "repetition": 0,
                         "slot": slot, "goal_reached": float(g)})
    return rows


def test_pairs_match_agent_episodes_and_the_mean_is_by_hand():
    a, b, c = paired.pairs(_rows(), "checkpoint.pt", "steer_to_goal", "goal_reached")
    assert (a, b) == ([1.0, 1.0, 0.0], [1.0, 0.0, 0.0])  # the unpaired slot ("b", 5) is left out
    assert c == [0, 0, 1]


def test_cli_prints_the_clustered_difference(tmp_path, capsys):
    f = tmp_path / "rec.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in _rows()))
    assert paired.main([str(f), "--policy", "checkpoint.pt", "--baseline", "steer_to_goal", "--metric",
                        "goal_reached", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["goal_reached"]
    assert out["diff"] == pytest.approx(1 / 3) and out["pairs"] == 3 and out["scenarios"] == 2
    assert paired.main([str(f), "--policy", "nobody", "--baseline", "steer_to_goal"]) == 2
    assert "no rows of policy 'nobody'" in capsys.readouterr().err


def test_wosac_pairs_are_per_scene_across_files(tmp_path, capsys):
    """A policy's and a baseline's WOSAC runs from two files pair on their common scenes:
    (0.7 - 0.5 + 0.6 - 0.6) / 2 = 0.1; the scene only the policy has is left out."""
    pol = {"runs": [{"label": "x/sim_agent.pt", "per_scenario": [
        {"scenario": "a", "metametric": 0.7}, {"scenario": "b", "metametric": 0.6}, {"scenario": "c", "metametric": 0.9}]}]}
    base = {"runs": [{"label": "constant_speed", "per_scenario": [
        {"scenario": "a", "metametric": 0.5}, {"scenario": "b", "metametric": 0.6}]}]}
    a, b, c = paired.wosac_pairs([pol, base], "sim_agent.pt", "constant_speed", "metametric")
    assert (a, b, c) == ([0.7, 0.6], [0.5, 0.6], [0, 1])
    fa, fb = tmp_path / "p.json", tmp_path / "b.json"
    fa.write_text(json.dumps(pol))
    fb.write_text(json.dumps(base))
    assert paired.main([str(fa), str(fb), "--wosac", "--policy", "sim_agent.pt", "--baseline", "constant_speed",
                        "--metric", "metametric", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["metametric"]["diff"] == pytest.approx(0.1)
    # with --wosac and no --metric: the meta-metric alone
    assert paired.main([str(fa), str(fb), "--wosac", "--policy", "sim_agent.pt", "--baseline", "constant_speed",
                        "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out)) == ["metametric"]
    assert paired.main([str(fa), "--wosac", "--policy", "sim_agent.pt", "--baseline", "random"]) == 2
