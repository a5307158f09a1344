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
