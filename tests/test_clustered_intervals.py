"""Intervals that claim no more than the data holds: clustered by scenario (cluster-robust normal
and cluster bootstrap, hand-computed), paired differences, and repeated identical episodes
counted once by the evaluator."""

from __future__ import annotations

import json
import math
import pathlib

import pytest
import torch

from train.eval.report import repeated_episodes, summarise
from train.eval.stats import mean_interval, paired_difference
from train.evaluate import EvalConfig, evaluate, main

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "womd_sample"
Z95 = 1.959963984540054


def test_cluster_robust_normal_interval_by_hand():
    # clusters {1, 1}, {0, 0}, {0, 1}: mean 0.5, residual sums 1, -1, 0
    # se^2 = G / (G - 1) * sum(sums^2) / n^2 = 3/2 * 2 / 36 = 1/12
    x = [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    iv = mean_interval(x, clusters=[7, 7, 3, 3, 5, 5])
    half = Z95 * math.sqrt(1 / 12)
    assert (iv.mean, iv.n, iv.clusters) == (0.5, 6, 3)
    assert iv.lo == pytest.approx(0.5 - half, abs=1e-12) and iv.hi == pytest.approx(0.5 + half, abs=1e-12)
    plain = mean_interval(x)  # independent: s / sqrt(n), narrower here (within-cluster agreement)
    assert plain.hi - plain.lo < iv.hi - iv.lo and plain.clusters == 0
    # one value per cluster: exactly the textbook interval
    single = mean_interval(x, clusters=list(range(6)))
    assert (single.lo, single.hi) == pytest.approx((plain.lo, plain.hi), abs=1e-12) and single.clusters == 6
    one = mean_interval(x, clusters=[1] * 6)  # one scenario: no interval across scenarios
    assert one.mean == 0.5 and math.isnan(one.lo) and one.clusters == 1
    with pytest.raises(ValueError, match="5 cluster ids for 6 values"):
        mean_interval(x, clusters=[0] * 5)


def test_repeating_every_episode_does_not_narrow_the_clustered_interval():
    x = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    c = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    base = mean_interval(x, clusters=c)
    rep = mean_interval(x.repeat(10), clusters=c.repeat(10))
    assert (rep.mean, rep.lo, rep.hi) == pytest.approx((base.mean, base.lo, base.hi), abs=1e-12)
    unclustered = mean_interval(x.repeat(10))
    assert unclustered.hi - unclustered.lo < 0.5 * (base.hi - base.lo)  # what repetition alone did before


def test_cluster_bootstrap_resamples_scenarios():
    """Scenarios of equal size with constant values: the cluster bootstrap is the plain bootstrap of
    the scenario means (the same seeded draws of scenario indices)."""
    means = torch.tensor([0.0, 1.0, 0.25, 0.5, 1.0, 0.0, 0.75])
    x = means.repeat_interleave(4)
    c = torch.arange(7).repeat_interleave(4)
    boot = mean_interval(x, method="bootstrap", clusters=c, seed=3)
    plain = mean_interval(means, method="bootstrap", seed=3)
    assert (boot.lo, boot.hi) == (plain.lo, plain.hi) and boot.n == 28 and boot.clusters == 7
    assert mean_interval(x, method="bootstrap", clusters=c, seed=3) == boot  # fixed seed
    # unequal sizes: each draw is the mean over all agent-episodes of the scenarios drawn
    y = torch.tensor([1.0, 1.0, 1.0, 0.0])
    b = mean_interval(y, method="bootstrap", clusters=[0, 0, 0, 1], resamples=4000, level=0.5)
    assert b.mean == 0.75 and 0.0 <= b.lo <= b.hi <= 1.0
    assert {round(v, 6) for v in (b.lo, b.hi)} <= {0.0, 0.75, 1.0}  # only 0, 3/4 and 1 can be drawn


def test_paired_difference_by_hand():
    a = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    b = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    c = torch.tensor([0, 0, 1, 1, 2, 2])
    d = paired_difference(a, b, c)
    # differences 1,0 | 0,1 | 0,1: mean 0.5, residual sums 0, 0, 0 -> zero width
    assert (d.mean, d.lo, d.hi, d.n, d.clusters) == (0.5, 0.5, 0.5, 6, 3)
    d2 = paired_difference(a, b, torch.tensor([0, 1, 1, 2, 2, 2]), bounds=(-1.0, 1.0))
    # differences 1 | 0, 0 | 1, 0, 1: residual sums 0.5, -1, 0.5 -> se^2 = 3/2 * 1.5 / 36
    half = Z95 * math.sqrt(1.5 * 1.5 / 36)
    assert (d2.lo, d2.hi) == pytest.approx((0.5 - half, 0.5 + half), abs=1e-12)
    assert paired_difference(a, b) == mean_interval(a - b)
    with pytest.raises(ValueError, match="one length"):
        paired_difference(a, b[:5], c)


def _records(reps: int, vary: bool, scenarios: int = 2) -> dict:
    """``scenarios`` scenarios, two slots, ``reps`` repetitions; identical repetitions unless
    ``vary`` (then repetition r flips scenario 1's goals when r is odd)."""
    rows = []
    for s in range(scenarios):
        for r in range(reps):
            for slot in range(2):
                goal = float((s * slot + (r if vary and s == 1 else 0)) % 2)
                rows.append((s, r, slot, s * 10 + r, goal, 1.0 - goal, goal * 2.0))
    cols = list(zip(*rows))
    names = ("scenario", "repetition", "slot", "world", "goal_reached", "collided", "episode_return")
    out = {k: torch.tensor(v, dtype=torch.float32) for k, v in zip(names, cols)}
    out["offroad"] = torch.zeros(len(rows))
    out["score"] = out["goal_reached"].clone()
    return out


def test_identical_repetitions_are_counted_once():
    rec = _records(5, vary=False, scenarios=3)
    keep, dropped = repeated_episodes(rec)
    assert dropped == [(s, r) for s in range(3) for r in range(1, 5)]
    assert int(keep.sum()) == 6
    once = summarise(_records(1, vary=False, scenarios=3))["goal_reached"]
    repeats = []
    five = summarise(rec, repeats=repeats)["goal_reached"]
    assert len(repeats) == 12
    # goals 0,0 | 0,1 | 0,0: mean 1/6; scenario residual sums -1/3, 2/3, -1/3 -> se^2 = 3/2 * (2/3) / 36
    half = Z95 * math.sqrt(1.5 * (2 / 3) / 36)
    assert (once.mean, once.n, once.clusters) == (pytest.approx(1 / 6), 6, 3)
    assert (once.lo, once.hi) == pytest.approx((0.0, 1 / 6 + half), abs=1e-12)  # clipped at 0
    assert (five.mean, five.lo, five.hi) == pytest.approx((once.mean, once.lo, once.hi), abs=1e-12)
    assert (five.n, five.clusters) == (6, 3)  # repetition adds neither agent-episodes nor width


def test_differing_repetitions_are_all_counted_and_weights_kept():
    rec = _records(4, vary=True)  # scenario 0 repeats itself, scenario 1 alternates (period 2)
    keep, dropped = repeated_episodes(rec)
    assert dropped == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3)]
    iv = summarise(rec)["goal_reached"]
    assert iv.n == int(keep.sum()) == 2 + 4
    assert iv.mean == pytest.approx(float(rec["goal_reached"].mean()))  # every run keeps its weight


def _two_scenes(tmp_path) -> pathlib.Path:
    d = tmp_path / "data"
    d.mkdir()
    for name in ("db4edc9bd0c9d18c.json.xz", "1c365f15b70ebdbf.json.xz"):
        (d / name).symlink_to(SAMPLE / name)
    return d


def test_deterministic_repetitions_do_not_shrink_the_reported_intervals(tmp_path, capsys):
    """The evaluator on real scenes: a deterministic baseline run 4 times per scenario reports the
    figures of one run per scenario (the same n, the same intervals) and says so; ``random``'s
    repetitions differ and are all counted."""
    data = _two_scenes(tmp_path)
    common = dict(data=str(data), device="cpu", num_threads=1, policy=("constant_speed", "random"))
    one = {r["label"]: r for r in evaluate(EvalConfig(episodes_per_scenario=1, **common))["runs"]}
    four = {r["label"]: r for r in evaluate(EvalConfig(episodes_per_scenario=4, **common))["runs"]}
    cs1, cs4 = one["constant_speed"], four["constant_speed"]
    assert cs4["repeated_episodes"] == 2 * 3 and cs1["repeated_episodes"] == 0
    for name in ("goal_reached", "collided", "offroad", "score", "episode_return"):
        a, b = cs4["summary"][name], cs1["summary"][name]
        assert (a.mean, a.lo, a.hi, a.n, a.clusters) == pytest.approx((b.mean, b.lo, b.hi, b.n, b.clusters), abs=1e-9)
    assert cs4["summary"]["goal_reached"].n == cs1["summary"]["goal_reached"].n > 2
    assert cs4["summary"]["goal_reached"].clusters == 2
    rnd = four["random"]
    assert rnd["repeated_episodes"] == 0
    assert rnd["summary"]["goal_reached"].n == 4 * one["random"]["summary"]["goal_reached"].n

    out = tmp_path / "e.json"
    assert main(["--policy", "constant_speed", "--data", str(data), "--episodes-per-scenario", "3", "--device", "cpu",
                 "--num-threads", "1", "--json", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "constant_speed: 4 repeated episode(s) identical to an earlier repetition" in text
    assert "clustered by scenario" in text and "scenarios (interval clusters)" in text
    goal = json.loads(out.read_text())["runs"][0]["summary"]["goal_reached"]
    assert goal["scenarios"] == 2 and goal["n"] == cs1["summary"]["goal_reached"].n
