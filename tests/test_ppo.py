"""Masked PPO loss and update: masked steps contribute exactly nothing, all-masked minibatches give
zero loss without NaN, optimizer-step scaling and rounding."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from policy import ActorCritic, ObsDims, PolicyConfig
from train.ppo import PPOConfig, masked_mean, optimizer_steps, ppo_loss, ppo_update
from train.rollout import RolloutBatch

DIMS = ObsDims(4, 2, 3, 3, 4)


def _model(continuous=False):
    torch.manual_seed(0)
    return ActorCritic(DIMS, 2 if continuous else 91, continuous, PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16))


def _minibatch(B=4, T=10, continuous=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, T, generator=g) < 0.6
    mask[:, 0] = True
    term = torch.zeros(B, T, dtype=torch.bool)
    term[:, -1] = True
    term[1, 4] = True
    removed = ~mask & (torch.rand(B, T, generator=g) < 0.5)
    actions = torch.randn(B, T, 2, generator=g) if continuous else torch.randint(91, (B, T), generator=g)
    mb = {
        "obs": torch.randn(B, T, DIMS.obs_dim, generator=g), "actions": actions,
        "logprobs": -4.5 + 0.1 * torch.randn(B, T, generator=g), "values": torch.randn(B, T, generator=g),
        "rewards": torch.randn(B, T, generator=g), "terminal": term, "removed": removed, "loss_mask": mask,
    }
    nxt = torch.ones_like(mask)
    nxt[:, :-1] = ~mask[:, 1:]
    mb["bootstrap_stop"] = term | removed | nxt
    return mb


class _Spy(nn.Module):
    """Wraps the policy and keeps its per-step outputs so their gradients can be inspected."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.continuous = inner.continuous

    def forward(self, *a):
        self.logits, self.values = self.inner(*a)
        self.logits.retain_grad()
        self.values.retain_grad()
        return self.logits, self.values

    def log_prob(self, *a):
        return self.inner.log_prob(*a)

    def entropy(self, *a):
        return self.inner.entropy(*a)


@pytest.mark.parametrize("continuous,vtrace", [(False, False), (True, False), (False, True)])
def test_masked_steps_get_exactly_zero_gradient(continuous, vtrace):
    cfg = PPOConfig(vtrace=vtrace)
    mb = _minibatch(continuous=continuous)
    spy = _Spy(_model(continuous))
    loss, stats = ppo_loss(spy, mb, cfg)
    loss.backward()
    mask = mb["loss_mask"]
    assert torch.isfinite(loss)
    assert torch.all(spy.values.grad[~mask] == 0)
    assert torch.all(spy.logits.grad[~mask] == 0)
    assert spy.values.grad[mask].abs().sum() > 0 and spy.logits.grad[mask].abs().sum() > 0
    assert stats["valid_steps"] == mask.sum()
    # garbage in the training targets of masked steps changes nothing (loss and gradients)
    bad = dict(mb)
    bad["logprobs"] = torch.where(mask, mb["logprobs"], torch.tensor(float("nan")))
    bad["values"] = torch.where(mask, mb["values"], torch.tensor(1e6))
    bad["rewards"] = torch.where(mask, mb["rewards"], torch.tensor(-1e6))
    spy2 = _Spy(_model(continuous))
    loss2, _ = ppo_loss(spy2, bad, cfg)
    loss2.backward()
    assert torch.equal(loss, loss2)
    for p1, p2 in zip(spy.parameters(), spy2.parameters()):
        assert torch.equal(p1.grad, p2.grad)


def test_all_masked_minibatch_zero_loss_no_nan():
    mb = _minibatch()
    mb["loss_mask"] = torch.zeros_like(mb["loss_mask"])
    mb["bootstrap_stop"] = torch.ones_like(mb["loss_mask"])
    model = _model()
    loss, stats = ppo_loss(model, mb, PPOConfig())
    assert loss.item() == 0.0
    loss.backward()
    for p in model.parameters():
        assert p.grad is None or (torch.isfinite(p.grad).all() and torch.all(p.grad == 0))
    assert all(torch.isfinite(v) for v in stats.values())


def test_masked_mean():
    x = torch.tensor([1.0, float("inf"), 3.0])
    m = torch.tensor([True, False, True])
    assert masked_mean(x, m).item() == 2.0
    assert masked_mean(x, torch.zeros(3, dtype=torch.bool)).item() == 0.0


def test_optimizer_steps_rounding():
    cfg = PPOConfig(update_epochs=4, num_minibatches=4)
    assert optimizer_steps(1000, 1000, cfg) == 16
    assert optimizer_steps(500, 1000, cfg) == 8
    assert optimizer_steps(0, 1000, cfg) == 0
    assert optimizer_steps(5, 0, cfg) == 0
    assert optimizer_steps(1, 1000, cfg) == 1  # less than one minibatch of data still trains once
    assert optimizer_steps(93, 1000, cfg) == 1  # 1.488 rounds to 1
    assert optimizer_steps(97, 1000, cfg) == 2  # 1.552 rounds to 2
    assert optimizer_steps(1000 * 5 // 32 * 2, 1000 * 5 // 32 * 4, cfg) == 8  # exact half


def _batch(R=6, H=8):
    g = torch.Generator().manual_seed(3)
    b = RolloutBatch.empty(R, H, DIMS.obs_dim, False, 1, "cpu")
    b.obs.copy_(torch.randn(R, H, DIMS.obs_dim, generator=g))
    b.actions.copy_(torch.randint(91, (R, H), generator=g))
    b.logprobs.fill_(-4.5)
    b.rewards.copy_(torch.randn(R, H, generator=g))
    b.values.copy_(torch.randn(R, H, generator=g))
    b.loss_mask.fill_(True)
    b.terminal[:, -1] = True
    b.slot_active.fill_(True)
    return b


def test_ppo_update_zero_steps_keeps_params():
    model = _model()
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    before = [p.clone() for p in model.parameters()]
    stats = ppo_update(model, opt, _batch(), PPOConfig(), 0, 2, torch.arange(6))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(torch.isfinite(v) for v in stats.values())


def test_ppo_update_changes_params_and_reports_finite_stats():
    model = _model()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    before = [p.clone() for p in model.parameters()]
    stats = ppo_update(model, opt, _batch(), PPOConfig(), 5, 2, torch.arange(6))
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(torch.isfinite(v) for v in stats.values())
    assert stats["valid_steps"] > 0
