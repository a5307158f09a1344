"""profiling/recipe_sweep.py: the medians it reports and the budget it gives a run."""

import pytest

from profiling.recipe_sweep import run_budget, summarise


def _rec(sps, roll, upd, opt=16):
    return {"sps": sps, "rollout_s": roll, "update_s": upd, "optimizer_steps": opt}


def test_summarise_medians_after_skip():
    recs = [_rec(1.0, 9.0, 9.0), _rec(100.0, 1.0, 3.0), _rec(300.0, 2.0, 2.0), _rec(200.0, 3.0, 1.0)]
    row = summarise(recs, skip=1)  # the first (compile, capture) is left out
    assert row["sps"] == 200.0 and row["rollout_s"] == 2.0 and row["update_s"] == 2.0
    assert row["updates"] == 3 and row["update_share"] == pytest.approx(0.5)


def test_summarise_keeps_all_when_too_few_and_refuses_none():
    assert summarise([_rec(5.0, 1.0, 3.0)], skip=2)["sps"] == 5.0
    with pytest.raises(ValueError):
        summarise([], skip=0)


def test_run_budget_scales_with_worlds_slots_and_trials():
    base = run_budget(["--num-worlds", "4", "--device", "cpu"], 3)
    assert base == 3 * 4 * 8 * 91 // 2  # 8 slots (max_controlled) x the WOMD horizon, half of them active
    assert run_budget(["--num-worlds", "8", "--device", "cpu"], 3) == 2 * base
    trial = run_budget(["--num-worlds", "4", "--device", "cpu", "--env.goal-behavior", "trial", "--env.k-trials", "3"], 3)
    assert trial == 3 * base
