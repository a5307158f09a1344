"""The metric registry (``gpusim.metrics.METRICS``): every per agent-episode metric defined once.

The env's metric log (stage ``accounting``) and the evaluator (``train/eval/sweep.py`` reads the
rows the env publishes, ``train/eval/report.py`` summarises the registry's columns) are both built
from it: a metric appended to the registry appears in ``DriveEnv.metrics()``, in the sweep's
records and in its summary with no other edit. The adaptation figure ``ada_delta`` is one
definition too (``gpusim.metrics.derived_columns``).
"""

from __future__ import annotations

import pytest
import torch

from gpusim import metrics
from gpusim.config import EnvConfig
from gpusim.data.pack import ScenarioPack
from gpusim.metrics import EpisodeMetrics, Metric, derived_columns, metric_columns
from conftest import SAMPLE_DIR
from train.baselines import SteerToGoal
from train.eval.report import summarise
from train.eval.sweep import CallableDriver, make_sweep_env, run_sweep, sweep_plan


@pytest.fixture(scope="module")
def pack():
    return ScenarioPack.from_json(sorted(SAMPLE_DIR.glob("*.json.xz")), EnvConfig().data_config())


def _long(t: dict) -> torch.Tensor:
    """The added test metric: the agent-episode lasted at least 60 valid steps."""
    return t["length"] >= 60


def test_a_metric_added_to_the_registry_reaches_env_log_records_and_summary(pack, monkeypatch):
    """One Metric appended to METRICS, nothing else edited: the env's log reports it, the sweep's
    records hold it per agent-episode (equal to its definition applied to the recorded length)
    and the summary reports it with its label."""
    monkeypatch.setattr(metrics, "METRICS", metrics.METRICS + [Metric("long_episode", _long, "long episode")])
    S = pack.num_scenarios
    env = make_sweep_env(pack, S, EnvConfig(), "cpu", seed=0)
    agents, _ = run_sweep(env, CallableDriver(SteerToGoal()), sweep_plan(S, 1, S))
    assert "long_episode" in env.episode_metrics.names
    by_hand = (agents["episode_length"] >= 60).to(torch.float32)
    assert torch.equal(agents["long_episode"], by_hand)
    assert 0 < float(by_hand.mean()) < 1  # both values occur on the sample: the column is not constant
    m = env.metrics(kind="mean")  # every agent-episode of the sweep finished in the env's log
    assert m["n"] == len(by_hand)
    assert m["long_episode"] == pytest.approx(float(by_hand.mean()))
    s = summarise(agents)
    assert s["long_episode"].mean == pytest.approx(float(by_hand.mean()))
    assert s["long_episode"].n == len(by_hand)


def test_env_log_and_records_agree_on_every_registry_metric(pack):
    """The mean of each registry column over the sweep's records equals the env's own log (one
    source: the rows the env publishes), red-light violations included."""
    S = pack.num_scenarios
    env = make_sweep_env(pack, S, EnvConfig(), "cpu", seed=0)
    agents, _ = run_sweep(env, CallableDriver(SteerToGoal()), sweep_plan(S, 1, S))
    m = env.metrics(kind="mean")
    assert set(metric_columns()) <= set(agents)
    for name in metric_columns():
        assert m[name] == pytest.approx(float(agents[name].to(torch.float64).mean()), abs=1e-6), name


def test_columns_follow_the_registry_order_and_trial_count():
    base = metric_columns()
    assert base[:8] == ("episode_return", "episode_length", "goal_reached", "collided", "offroad", "score",
                        "red_light_violation", "collision_or_offroad")
    assert metric_columns(2)[len(base):] == ("trial_0_score", "trial_1_score", "trial_0_clean_score",
                                             "trial_1_clean_score")
    assert metrics.METRIC_NAMES == base
    with pytest.raises(ValueError, match="k_trials"):
        metric_columns(-1)


def test_trial_columns_come_from_the_trial_tallies_by_name():
    """``trial_k_score`` is the goal reached in trial k (``trial_reached``), ``trial_k_clean_score``
    the clean one (``trial_clean``): hand values, one agent-episode."""
    one = torch.ones(1, dtype=torch.bool)
    tallies = {"return": torch.tensor([1.5]), "length": torch.tensor([30]), "goal": one, "collided": one,
               "offroad": ~one, "red_light": ~one,
               "trial_reached": torch.tensor([[True, True]]), "trial_clean": torch.tensor([[False, True]])}
    row = metrics.episode_rows(tallies, 2)[0].tolist()
    assert dict(zip(metric_columns(2), row)) == {
        "episode_return": 1.5, "episode_length": 30.0, "goal_reached": 1.0, "collided": 1.0, "offroad": 0.0,
        "score": 0.0, "red_light_violation": 0.0, "collision_or_offroad": 1.0,
        "trial_0_score": 1.0, "trial_1_score": 1.0, "trial_0_clean_score": 0.0, "trial_1_clean_score": 1.0}


def test_ada_delta_one_definition_for_means_and_per_episode_values():
    """``derived_columns`` gives the env's reported delta (difference of means) and the evaluator's
    per agent-episode differences; their mean is the same number."""
    per_ep = {"trial_0_score": torch.tensor([1.0, 0.0, 0.0, 1.0]), "trial_1_score": torch.tensor([1.0, 1.0, 0.0, 0.0]),
              "trial_0_clean_score": torch.tensor([0.0, 0.0, 0.0, 1.0]),
              "trial_1_clean_score": torch.tensor([1.0, 1.0, 0.0, 1.0])}
    d = derived_columns(per_ep)
    assert list(d) == ["ada_delta_trial_1_minus_0", "ada_delta_clean_trial_1_minus_0"]
    assert d["ada_delta_trial_1_minus_0"].tolist() == [0.0, 1.0, 0.0, -1.0]
    means = {k: float(v.mean()) for k, v in per_ep.items()}
    assert derived_columns(means)["ada_delta_clean_trial_1_minus_0"] == pytest.approx(0.5)
    names = metric_columns(2)
    em = EpisodeMetrics(1, 4, names=names)
    vals = torch.zeros(1, 4, len(names))
    for k, v in per_ep.items():
        vals[0, :, names.index(k)] = v
    em.add(vals, torch.ones(1, 4, dtype=torch.bool))
    rep = em.report("mean")
    assert rep["ada_delta_trial_1_minus_0"] == pytest.approx(0.0)
    assert rep["ada_delta_clean_trial_1_minus_0"] == pytest.approx(0.5)
    s = summarise({"goal_reached": torch.zeros(4), **per_ep})
    assert s["ada_delta_clean_trial_1_minus_0"].mean == pytest.approx(0.5)


def test_published_rows_are_the_last_finished_episode_of_each_slot():
    """``EpisodeMetrics.last``: NaN until a slot finishes, then that episode's row, kept while the
    slot does not finish again; ``clear_last`` sets NaN again."""
    em = EpisodeMetrics(1, 2, names=("a", "b"))
    assert torch.isnan(em.last).all()
    em.add(torch.tensor([[[1.0, 2.0], [3.0, 4.0]]]), torch.tensor([[True, False]]))
    assert em.last[0, 0].tolist() == [1.0, 2.0] and torch.isnan(em.last[0, 1]).all()
    em.add(torch.tensor([[[5.0, 6.0], [7.0, 8.0]]]), torch.tensor([[False, True]]))
    assert em.last[0].tolist() == [[1.0, 2.0], [7.0, 8.0]]
    em.clear_last()
    assert torch.isnan(em.last).all()
