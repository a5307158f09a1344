"""Masked PPO loss and update: masked steps contribute exactly nothing, all-masked minibatches give
zero loss without NaN, optimizer-step scaling and rounding; the GPU speed options (bf16 autocast
close to fp32 with fp32 log-probabilities, fused Adam falling back on the CPU, no host read in the
update loop)."""

from __future__ import annotations

import pathlib
import traceback

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from policy import ActorCritic, ObsDims, PolicyConfig
from train.ppo import PPOConfig, make_optimizer, masked_mean, optimizer_steps, ppo_loss, ppo_update
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


# ------------------------------------------------------------------ GPU speed options (CPU checks)
class _DtypeSpy(_Spy):
    """Records the dtype the policy's forward produced (before the loss casts it) and the dtypes
    the log-probability / entropy receive and return."""

    def forward(self, *a, **kw):
        logits, values = self.inner(*a, **kw)
        self.raw = (logits.dtype, values.dtype)
        return logits, values

    def log_prob(self, logits, actions):
        out = self.inner.log_prob(logits, actions)
        self.logp_dtypes = (logits.dtype, out.dtype)
        return out


@pytest.mark.parametrize("path", ["cpu_packed", "device_dense"])
def test_bf16_autocast_loss_close_to_fp32_and_logprob_ratio_stay_fp32(monkeypatch, path):
    """Both policy paths under autocast: the CPU one (kept steps packed, valid road slots compacted:
    ``COMPACT_MIN_ROWS`` 0 makes this small batch take it) and the dense one CUDA takes."""
    import policy.encoders as encoders

    monkeypatch.setattr(encoders, "COMPACT_MIN_ROWS", 0 if path == "cpu_packed" else 10**12)
    monkeypatch.setattr(ActorCritic, "pack_removed", path == "cpu_packed")
    mb = _minibatch(B=8, T=12, seed=1)
    ref = _model()
    loss32, stats32 = ppo_loss(ref, mb, PPOConfig())
    loss32.backward()
    spy = _DtypeSpy(_model())
    loss16, stats16 = ppo_loss(spy, mb, PPOConfig(autocast="bf16"))
    loss16.backward()
    assert spy.raw == (torch.bfloat16, torch.bfloat16)  # the forward really ran under autocast
    assert spy.logp_dtypes == (torch.float32, torch.float32)  # log-probabilities (and so the ratio) in fp32
    assert loss16.dtype == torch.float32 and all(v.dtype == torch.float32 for v in stats16.values())
    # measured: 0.79970 vs 0.79944; gradients within 1.5% (cosine 0.9999)
    assert loss16.item() == pytest.approx(loss32.item(), rel=2e-3)
    for k in ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac"):
        assert stats16[k].item() == pytest.approx(stats32[k].item(), rel=2e-2, abs=1e-3), k
    g32 = torch.cat([p.grad.flatten() for p in ref.parameters()])
    g16 = torch.cat([p.grad.flatten() for p in spy.inner.parameters()])
    assert all(p.grad.dtype == torch.float32 for p in spy.inner.parameters())
    assert ((g16 - g32).norm() / g32.norm()).item() < 0.1
    assert torch.nn.functional.cosine_similarity(g32, g16, dim=0).item() > 0.999


@pytest.mark.parametrize("autocast", ["off", "bf16"])
def test_pack_removed_gives_the_loss_and_gradient_of_every_step_computed(monkeypatch, autocast):
    """``PPOConfig.pack_removed``: the update's forward on the kept steps only, asked for on a
    policy that follows the device rule (no packing unless asked, as on CUDA), against the same
    policy computing every step: the same loss and gradient, and the packed path really ran."""
    import policy.encoders as encoders

    monkeypatch.setattr(encoders, "COMPACT_MIN_ROWS", 10**12)  # dense slots, as on CUDA
    calls = []
    kept = ActorCritic._forward_kept
    monkeypatch.setattr(ActorCritic, "_forward_kept", lambda self, *a, **k: calls.append(1) or kept(self, *a, **k))
    mb = _minibatch(B=8, T=12, seed=3)
    assert mb["removed"].any()
    models, results = [], []
    for pack in (False, True):
        model = _model()
        model.pack_removed = False
        loss, stats = ppo_loss(model, mb, PPOConfig(autocast=autocast, pack_removed=pack))
        loss.backward()
        models.append(model)
        results.append((loss, stats))
        assert len(calls) == int(pack)
    (l0, s0), (l1, s1) = results
    rel = 1e-5 if autocast == "off" else 2e-2
    assert l1.item() == pytest.approx(l0.item(), rel=rel, abs=1e-6)
    assert s1["valid_steps"].item() == s0["valid_steps"].item()
    g0 = torch.cat([p.grad.flatten() for p in models[0].parameters()])
    g1 = torch.cat([p.grad.flatten() for p in models[1].parameters()])
    assert ((g1 - g0).norm() / g0.norm()).item() < (1e-4 if autocast == "off" else 0.1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pack_removed_on_cuda_gives_the_dense_loss():
    mb = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in _minibatch(B=8, T=12, seed=4).items()}
    model = _model().cuda()
    dense, _ = ppo_loss(model, mb, PPOConfig())
    packed, _ = ppo_loss(model, mb, PPOConfig(pack_removed=True))
    assert packed.item() == pytest.approx(dense.item(), rel=1e-4, abs=1e-6)


def test_autocast_off_is_the_plain_fp32_loss_and_bad_values_are_refused():
    mb = _minibatch(seed=2)
    a, _ = ppo_loss(_model(), mb, PPOConfig())
    b, _ = ppo_loss(_model(), mb, PPOConfig(autocast="off"))
    assert torch.equal(a, b)
    c, _ = ppo_loss(_model(), mb, PPOConfig(autocast="bf16"))
    assert not torch.equal(a, c)  # bf16 rounding shows
    with pytest.raises(ValueError, match="autocast"):
        PPOConfig(autocast="fp16")


def test_fused_adam_falls_back_to_the_plain_optimizer_on_cpu():
    results = []
    for fused in (False, True):
        model = _model()
        opt = make_optimizer(model.parameters(), 1e-3, 1e-5, fused=fused)
        assert not opt.defaults.get("fused")  # CPU parameters: the default implementation
        ppo_update(model, opt, _batch(), PPOConfig(), 3, 2, torch.arange(6), torch.Generator().manual_seed(0))
        results.append([p.detach().clone() for p in model.parameters()])
    ref = _model()
    ppo_update(ref, torch.optim.Adam(ref.parameters(), lr=1e-3, eps=1e-5), _batch(), PPOConfig(), 3, 2,
               torch.arange(6), torch.Generator().manual_seed(0))
    for a, b, c in zip(*results, ref.parameters()):
        assert torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_adam_on_cuda():
    model = _model().cuda()
    opt = make_optimizer(model.parameters(), 1e-3, 1e-5, fused=True)
    assert opt.defaults["fused"] is True
    assert not make_optimizer(model.parameters(), 1e-3, 1e-5).defaults.get("fused")


#: aten ops that read a device tensor back to the host (a stream sync on CUDA)
_READ_OPS = {"_local_scalar_dense", "item", "equal", "is_nonzero", "nonzero", "masked_select", "unique",
             "_unique2", "unique_consecutive"}


class _HostReads(TorchDispatchMode):
    """Counts host reads (the ops above and ``Tensor.tolist``) made outside ``torch/optim`` (the
    default Adam reads its step counters, host tensors on every device)."""

    def __init__(self):
        super().__init__()
        self.hits: list[str] = []

    def _record(self, what):
        stack = traceback.extract_stack()[:-2]
        if not any("torch/optim" in f.filename.replace("\\", "/") for f in stack):
            self.hits.append(f"{what} at " + " <- ".join(f"{pathlib.Path(f.filename).name}:{f.lineno}"
                                                         for f in stack[-4:]))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in _READ_OPS:
            self._record(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("autocast", ["off", "bf16"])
def test_ppo_update_reads_nothing_to_the_host_on_the_gpu_path(monkeypatch, autocast):
    """The update loop (minibatches, loss, backward, clip, Adam) makes no host read when the
    policy takes its device path (dense slots, every step computed), as on CUDA; its statistics
    stay on the device for the trainer's one read per report."""
    import policy.encoders as encoders

    model = _model()
    model.pack_removed = False  # ActorCritic.forward's CPU-only packing reads the removed count
    monkeypatch.setattr(encoders, "COMPACT_MIN_ROWS", 10**12)  # slot_max's CPU-only compaction reads
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    tolist = torch.Tensor.tolist
    with _HostReads() as reads:
        monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads._record("tolist") or tolist(t))
        stats = ppo_update(model, opt, _batch(R=8), PPOConfig(autocast=autocast), 6, 3, torch.arange(8))
    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    assert reads.hits == []
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in stats.values())
    # the counter does see reads: the CPU path packs the kept steps (a read per minibatch)
    model.pack_removed = True
    b = _batch(R=8)
    b.removed[:, -2:] = True
    with _HostReads() as reads:
        ppo_update(model, opt, b, PPOConfig(autocast=autocast), 6, 3, torch.arange(8))
    assert len(reads.hits) >= 6
    # pack_removed asks the device path to pack too: the kept-step counts of all minibatches are
    # read once per update with one tolist (counted in tests/test_syncs.py), no op reads per minibatch
    model.pack_removed = False
    with _HostReads() as reads:
        ppo_update(model, opt, b, PPOConfig(autocast=autocast, pack_removed=True), 6, 3, torch.arange(8))
    assert reads.hits == []
