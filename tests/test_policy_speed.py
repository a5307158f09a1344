"""The policy's fast paths compute the same function as the plain ones (docs/training.md,
"Policy"): the compacted slot max-pool (:func:`policy.encoders.slot_max`) against the dense one and
against :meth:`SlotEncoder.reference` (values, arg-max slots, gradients, NaN in invalid slots,
holes inside the valid prefix, tokens without a valid slot), and the once-per-update observation
preparation (:meth:`ActorCritic.prepare_obs`) against the plain forward and PPO loss."""

from __future__ import annotations

import pytest
import torch

import policy.encoders as enc_mod
from policy import ActorCritic, ObsDims, PolicyConfig
from policy.encoders import SlotEncoder, slot_max
from train.ppo import PPOConfig, ppo_loss

DIMS = ObsDims(ego_dim=5, num_partners=7, partner_dim=4, num_roads=9, road_dim=3, num_signals=3, signal_dim=4)


def _slots(N, S, I, layout, seed=0):
    """[N, S, I] slots whose last feature is the valid flag; invalid slots hold NaN."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, S, I, generator=g)
    if layout == "prefix":  # what the observation does: valid slots first
        valid = torch.arange(S)[None, :] < torch.randint(0, S + 1, (N, 1), generator=g)
    elif layout == "holes":
        valid = torch.rand(N, S, generator=g) < 0.5
    elif layout == "none":
        valid = torch.zeros(N, S, dtype=torch.bool)
    else:
        valid = torch.ones(N, S, dtype=torch.bool)
    valid[0] = False  # always one token without a valid slot
    x[..., -1] = valid.float()
    x[..., :-1] = torch.where(valid[..., None], x[..., :-1], torch.tensor(float("nan")))
    return x, valid


@pytest.mark.parametrize("layout", ["prefix", "holes", "none", "all"])
@pytest.mark.parametrize("N,S,I,H", [(37, 5, 4, 6), (203, 13, 11, 17)])
def test_slot_max_compact_equals_dense(monkeypatch, layout, N, S, I, H):
    x, valid = _slots(N, S, I, layout)
    w = torch.randn(H, I)
    out = {}
    for name, threshold in (("dense", 10**9), ("compact", 0)):
        monkeypatch.setattr(enc_mod, "COMPACT_MIN_ROWS", threshold)
        out[name] = slot_max(x, valid, w, with_index=True)
        no_index = slot_max(x, valid, w)
        assert no_index[1] is None
        torch.testing.assert_close(no_index[0], out[name][0], atol=1e-6, rtol=1e-6)
    (bd, idd), (bc, idc) = out["dense"], out["compact"]
    torch.testing.assert_close(bc, bd, atol=1e-6, rtol=1e-6)
    has = valid.any(dim=1)
    assert torch.isneginf(bc[~has]).all() and torch.isfinite(bc[has]).all()
    assert torch.equal(idc[has], idd[has])  # same arg-max slot (random data: no ties)
    assert valid[has].gather(1, idc[has]).all()  # and it is a valid slot


@pytest.mark.parametrize("layout", ["prefix", "holes"])
def test_slot_encoder_compact_values_and_gradients_match_reference(monkeypatch, layout):
    monkeypatch.setattr(enc_mod, "COMPACT_MIN_ROWS", 0)
    torch.manual_seed(1)
    enc = SlotEncoder(6, 16)
    x, valid = _slots(3 * 41, 9, 6, layout, seed=2)
    x = x.view(3, 41, 9, 6)
    results = []
    for fn, inp in ((enc.forward, x), (enc.reference, torch.where(valid.view(3, 41, 9, 1), x, 0.0))):
        xi = inp.clone().requires_grad_(True)
        enc.zero_grad()
        y = fn(xi)
        (y * torch.linspace(-1, 1, 16)).sum().backward()
        results.append((y.detach(), xi.grad.clone(), [p.grad.clone() for p in enc.parameters()]))
    (y1, gx1, gp1), (y2, gx2, gp2) = results
    torch.testing.assert_close(y1, y2, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(gx1).all()
    torch.testing.assert_close(gx1, gx2, atol=1e-5, rtol=1e-5)
    for a, b in zip(gp1, gp2):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def _model(**kw):
    torch.manual_seed(0)
    return ActorCritic(DIMS, 91, False, PolicyConfig(d_model=32, n_layers=1, n_heads=4, hidden=16, **kw))


def _batch(B=3, T=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(B, T, DIMS.obs_dim, generator=g)
    groups = ((DIMS.ego_dim, DIMS.num_partners, DIMS.partner_dim),
              (DIMS.ego_dim + DIMS.num_partners * DIMS.partner_dim, DIMS.num_roads, DIMS.road_dim),
              (DIMS.obs_dim - DIMS.num_signals * DIMS.signal_dim, DIMS.num_signals, DIMS.signal_dim))
    for start, n, d in groups:
        view = obs[..., start: start + n * d].view(B, T, n, d)
        view[..., -1] = (torch.rand(B, T, n, generator=g) < 0.6).float()
    terminal = torch.zeros(B, T, dtype=torch.bool)
    terminal[:, -1] = True
    terminal[0, 4] = True
    removed = torch.zeros(B, T, dtype=torch.bool)
    removed[1, [2, 3]] = True
    obs[1, 2] = float("nan")  # a removed step's contents never matter
    mask = ~removed
    nxt = torch.ones_like(mask)
    nxt[:, :-1] = ~mask[:, 1:]
    return {"obs": obs, "terminal": terminal, "removed": removed, "loss_mask": mask,
            "actions": torch.randint(91, (B, T), generator=g), "logprobs": torch.full((B, T), -4.5),
            "values": torch.randn(B, T, generator=g), "rewards": torch.randn(B, T, generator=g),
            "bootstrap_stop": terminal | removed | nxt}


@pytest.mark.parametrize("max_roads", [None, 4])
def test_prepare_obs_gives_the_same_forward_and_loss_gradients(max_roads):
    model = _model(max_roads=max_roads)
    mb = _batch()
    prep = model.prepare_obs(mb["obs"], mb["removed"])
    assert prep.shape[-1] == model.encoder.compact_dim
    assert model.encoder.compact_dim == DIMS.obs_dim - (0 if max_roads is None else (9 - 4) * DIMS.road_dim)
    assert torch.isfinite(prep).all() and torch.isnan(mb["obs"][1, 2]).all()
    with torch.no_grad():
        a = model(mb["obs"], mb["terminal"], mb["removed"])
        b = model(prep, mb["terminal"], mb["removed"], prepared=True)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-6)
    grads = []
    for batch in (mb, {**mb, "obs": prep, "prepared": True}):
        model.zero_grad()
        loss, _ = ppo_loss(model, batch, PPOConfig())
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    for x, y in zip(*grads):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-5)


def test_prepared_obs_of_the_wrong_width_is_refused():
    model = _model(max_roads=4)
    mb = _batch()
    with pytest.raises(ValueError, match="compact"):
        model(mb["obs"], mb["terminal"], mb["removed"], prepared=True)
    with pytest.raises(ValueError, match="compact"):
        model.encoder.compact(mb["obs"][..., :-1])


@pytest.mark.parametrize("continuous", [False, True])
def test_forward_on_kept_steps_equals_dense_forward_values_and_loss_gradients(continuous):
    model = ActorCritic(DIMS, 2 if continuous else 91, continuous,
                        PolicyConfig(d_model=32, n_layers=2, n_heads=4, hidden=16, max_roads=4))
    mb = _batch()
    if continuous:
        mb["actions"] = torch.randn(*mb["actions"].shape, 2)
    mb["removed"][2, 6:] = True  # an agent out for the rest of the row
    mb["loss_mask"] &= ~mb["removed"]
    keep = ~mb["removed"]
    outs, grads = [], []
    for pack in (True, False):
        model.pack_removed = pack
        model.zero_grad()
        logits, values = model(mb["obs"], mb["terminal"], mb["removed"])
        outs.append((logits[keep].detach(), values[keep].detach()))
        loss, _ = ppo_loss(model, mb, PPOConfig())
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    model.pack_removed = True
    logits, values = model(mb["obs"], mb["terminal"], mb["removed"])
    assert torch.isfinite(logits).all() and torch.isfinite(values).all()  # NaN at a removed step stays out


def test_forward_with_every_step_removed_is_finite_and_trains_nothing():
    model = _model()
    mb = _batch()
    mb["removed"][:] = True
    mb["loss_mask"][:] = False
    logits, values = model(mb["obs"], mb["terminal"], mb["removed"])
    assert logits.shape == (3, 11, 91) and torch.isfinite(logits).all() and torch.isfinite(values).all()
    loss, _ = ppo_loss(model, mb, PPOConfig())
    loss.backward()
    assert loss.item() == 0.0
    assert all(p.grad is None or torch.count_nonzero(p.grad) == 0 for p in model.parameters())


@pytest.mark.parametrize("pack", [True, False])
def test_forward_rows_selects_rows_of_a_larger_prepared_tensor(pack):
    model = _model(max_roads=4)
    model.pack_removed = pack
    mb = _batch(B=5)
    mb["removed"][3, 5:] = True
    prep = model.prepare_obs(mb["obs"], mb["removed"])
    rows = torch.tensor([3, 0, 4])
    with torch.no_grad():
        a = model(prep[rows], mb["terminal"][rows], mb["removed"][rows], prepared=True)
        b = model(prep, mb["terminal"][rows], mb["removed"][rows], prepared=True, rows=rows)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=0, rtol=0)
    with pytest.raises(ValueError, match="expected"):
        model(prep, mb["terminal"], mb["removed"], prepared=True, rows=rows)
