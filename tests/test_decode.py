"""Deterministic decoding of the discrete head: joint argmax vs the per-dimension expected value."""

import json

import pytest
import torch

from gpusim.kernels.dynamics import NUM_ACCEL, NUM_STEER
from policy.actor_critic import ActorCritic, PolicyConfig
from policy.actor import Actor
from policy.encoders import ObsDims


def _policy():
    dims = ObsDims(ego_dim=6, num_partners=2, partner_dim=5, num_roads=3, road_dim=4)
    return ActorCritic(dims, NUM_ACCEL * NUM_STEER, False, PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=8))


def _logits(cells: dict) -> torch.Tensor:
    """[1, 91] logits with probability ``p`` on joint cell ``(accel, steer)`` for each item, ~0 elsewhere."""
    p = torch.full((NUM_ACCEL * NUM_STEER,), 1e-9)
    for (a, s), w in cells.items():
        p[a * NUM_STEER + s] = w
    return p.log()[None]


def test_mean_decoding_is_the_rounded_expected_index_per_dimension():
    pol = _policy()
    # two corners, 0.6 / 0.4: argmax takes the heavier corner, mean the rounded centre of mass
    lg = _logits({(0, 0): 0.6, (6, 12): 0.4})
    assert int(pol.sample(lg, True)) == 0 == int(pol.sample(lg, "argmax"))
    a, s = round(0.4 * 6), round(0.4 * 12)  # 2.4 -> 2, 4.8 -> 5
    assert int(pol.sample(lg, "mean")) == a * NUM_STEER + s == 31
    # a peaked distribution decodes the same both ways
    peak = _logits({(4, 9): 1.0})
    assert int(pol.sample(peak, "mean")) == int(pol.sample(peak, True)) == 4 * NUM_STEER + 9


def test_bad_decoding_value_is_refused():
    with pytest.raises(ValueError, match="deterministic must be"):
        _policy().sample(_logits({(0, 0): 1.0}), "median")


def test_actor_keeps_the_decoding_mode():
    pol = _policy()
    assert Actor(pol, 2, 4, deterministic="mean").deterministic == "mean"
    assert Actor(pol, 2, 4, deterministic=1).deterministic is True


def test_evaluate_decode_flag_reaches_the_summary(tmp_path):
    from train.evaluate import main

    out = tmp_path / "e.json"
    assert main(["--policy", "policies/driver.pt", "--decode", "mean", "--num-threads", "1", "--quiet",
                 "--no-per-scenario", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["decode"] == "mean" and res["deterministic"] is True


def test_evaluate_temperature_reaches_the_sampler_and_is_refused_where_nothing_samples(tmp_path, capsys):
    """``--temperature`` reaches ``ActorCritic.sample`` (seen by the actions taken: a cold sampler
    drives like the argmax, a hot one does not) and is refused where no action is sampled."""
    from train.evaluate import main

    def goal(*flags):
        out = tmp_path / "e.json"
        assert main(["--policy", "policies/driver.pt", "--num-threads", "1", "--quiet", "--no-per-scenario",
                     "--json", str(out), *flags]) == 0
        res = json.loads(out.read_text())
        return res, res["runs"][0]["summary"]["episode_return"]["mean"]

    _, argmax = goal()
    res, cold = goal("--stochastic", "--temperature", "1e-4")
    assert res["temperature"] == 1e-4 and res["deterministic"] is False
    assert cold == pytest.approx(argmax)  # T -> 0: the draw is the argmax
    _, hot = goal("--stochastic", "--temperature", "50")
    assert hot != pytest.approx(argmax)
    assert main(["--policy", "policies/driver.pt", "--temperature", "0.5", "--quiet"]) == 2
    assert "--temperature 0.5: actions are not sampled here" in capsys.readouterr().err
    assert main(["--policy", "policies/driver.pt", "--stochastic", "--temperature", "0", "--quiet"]) == 2
