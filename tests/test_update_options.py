"""Options of the PPO update (``train/ppo.py``): ``--ppo.pack-removed`` sized once per update gives
the update of every step computed, and the entropy-coefficient schedule (``--ppo.ent-coef-final``)
is linear over the run and logged."""

from __future__ import annotations

import pytest
import torch

from policy import ActorCritic, PolicyConfig
from policy.actor_critic import kept_index
from policy.encoders import ObsDims
from test_syncs import _update_batch
from test_train_run import FakeEnv, _cfg
from train.ppo import PPOConfig, ppo_update
from train.rollout import RolloutBatch
from train.run import train

DIMS = ObsDims(4, 2, 3, 3, 4)


def _batch(R=6, H=8) -> RolloutBatch:
    """Row r's agent is removed after step 1 + r (removed tails of different lengths)."""
    return _update_batch(R, H, DIMS.obs_dim, "cpu", first_removed=1, seed=3)


def _updated(pack_update: bool, pack_forward: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = ActorCritic(DIMS, 91, False, PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16))
    model.pack_removed = pack_forward  # the forward's own CPU packing (reads the count per call)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    ppo_update(model, opt, _batch(), PPOConfig(pack_removed=pack_update), 6, 2, torch.arange(6),
               torch.Generator().manual_seed(1))
    return [p.detach().clone() for p in model.parameters()]


def test_packed_update_sized_once_equals_every_step_computed():
    """Six optimizer steps over three epochs of 2-row minibatches: the weights after the update
    sized once per update are those of the forward that counts each minibatch's kept steps itself
    (bit for bit: the same packed computation) and those of the update computing every step (to
    float32 rounding, which Adam's normalised steps carry up to ~2e-5 here at lr 1e-3)."""
    dense = _updated(False, False)
    sized_once = _updated(True, False)
    counted = _updated(False, True)
    start = [p.detach().clone() for p in ActorCritic(DIMS, 91, False, PolicyConfig(d_model=16, n_layers=1, n_heads=2,
                                                                                   hidden=16)).parameters()]
    assert any(not torch.allclose(a, b) for a, b in zip(dense, start))  # the update moved the weights
    for a, b, c in zip(dense, sized_once, counted):
        assert torch.equal(b, c)
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-3)


def test_kept_index_is_nonzero_without_the_read():
    keep = torch.tensor([False, True, True, False, False, True, False])
    assert kept_index(keep, 3).tolist() == [1, 2, 5]
    assert kept_index(torch.zeros(4, dtype=torch.bool), 0).tolist() == []
    assert kept_index(torch.ones(3, dtype=torch.bool), 3).tolist() == [0, 1, 2]


def test_entropy_schedule_is_linear_and_clipped():
    cfg = PPOConfig(ent_coef=0.01, ent_coef_final=0.002)
    assert cfg.at_progress(0.0).ent_coef == pytest.approx(0.01)
    assert cfg.at_progress(0.25).ent_coef == pytest.approx(0.008)
    assert cfg.at_progress(1.0).ent_coef == pytest.approx(0.002)
    assert cfg.at_progress(1.7).ent_coef == pytest.approx(0.002)  # the last update may pass the total
    plain = PPOConfig(ent_coef=0.01)
    assert plain.at_progress(0.5) is plain
    with pytest.raises(ValueError, match="finite"):
        PPOConfig(ent_coef_final=float("nan"))


def test_entropy_schedule_reaches_the_loss_and_the_log(tmp_path):
    """Four updates of 144 agent-steps (3 worlds x 4 slots x 12 steps) over 575 steps: update k
    (k = 0..3) starts at step 144 k and uses 0.01 + (144 k / 575) (0 - 0.01), logged as ent_coef."""
    env = FakeEnv(num_worlds=3, num_slots=4, horizon=12, all_active=True)
    out = train(_cfg(tmp_path, total_timesteps=575, report_interval=1,
                     ppo=PPOConfig(ent_coef=0.01, ent_coef_final=0.0)), env=env)
    logged = [r["ent_coef"] for r in out["reports"]]
    assert logged == pytest.approx([0.01 * (1 - 144 * k / 575) for k in range(4)], rel=1e-5)
