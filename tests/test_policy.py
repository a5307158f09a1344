"""Policy tests: forward vs step-by-step forward_eval parity across episodes with removed steps,
independence from removed-step contents, zero gradients at removed inputs, cache reset semantics,
masked pooling, heads."""

from __future__ import annotations

import math

import pytest
import torch

from policy import ActorCritic, ObsDims, PolicyConfig
from policy.encoders import masked_max_pool

DIMS = ObsDims(ego_dim=7, num_partners=5, partner_dim=6, num_roads=9, road_dim=8)


def _model(continuous=False, **kw):
    torch.manual_seed(0)
    cfg = PolicyConfig(**{"d_model": 32, "n_layers": 2, "n_heads": 4, "hidden": 24, **kw})
    return ActorCritic(DIMS, 2 if continuous else 91, continuous, cfg)


def _obs(B, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(B, T, DIMS.obs_dim, generator=g)
    p0 = DIMS.ego_dim
    r0 = p0 + DIMS.num_partners * DIMS.partner_dim
    pv = obs[..., p0:r0].view(B, T, DIMS.num_partners, DIMS.partner_dim)
    pv[..., -1] = (torch.rand(B, T, DIMS.num_partners, generator=g) < 0.5).float()
    rv = obs[..., r0:].view(B, T, DIMS.num_roads, DIMS.road_dim)
    rv[..., -1] = (torch.rand(B, T, DIMS.num_roads, generator=g) < 0.6).float()
    pv[0, 0, :, -1] = 0.0  # a step with no valid partner
    rv[0, 1, :, -1] = 0.0  # and one with no valid road
    return obs


def _flags(B, T):
    term = torch.zeros(B, T, dtype=torch.bool)
    rem = torch.zeros(B, T, dtype=torch.bool)
    term[0, [4, 11]] = True  # three episodes in row 0
    term[1, 8] = True
    term[2, T - 1] = True
    rem[0, [2, 3, 12]] = True  # removed steps inside episodes, one right after a terminal
    rem[1, :3] = True  # a row starting with removed steps
    rem[2, [5, 6, 7]] = True
    return term, rem


def _step_by_step(model, obs, term, rem):
    B, T, _ = obs.shape
    cache = model.init_cache(B, T)
    out_l, out_v = [], []
    with torch.no_grad():
        for t in range(T):
            lo, v, cache = model.forward_eval(obs[:, t], cache, rem[:, t])
            out_l.append(lo)
            out_v.append(v)
            model.reset_cache(cache, term[:, t])
    return torch.stack(out_l, 1), torch.stack(out_v, 1)


@pytest.mark.parametrize("continuous", [False, True])
def test_forward_matches_forward_eval(continuous):
    model = _model(continuous)
    B, T = 3, 19
    obs = _obs(B, T)
    term, rem = _flags(B, T)
    with torch.no_grad():
        logits, values = model(obs, term, rem)
    l2, v2 = _step_by_step(model, obs, term, rem)
    assert torch.isfinite(logits).all() and torch.isfinite(values).all()
    assert torch.isfinite(l2).all() and torch.isfinite(v2).all()
    keep = ~rem
    torch.testing.assert_close(logits[keep], l2[keep], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(values[keep], v2[keep], atol=2e-5, rtol=1e-5)
    # the memory matters: the same row without episode boundaries gives other outputs
    with torch.no_grad():
        _, v_noterm = model(obs, torch.zeros_like(term), rem)
    assert (v_noterm[0, 5:11] - values[0, 5:11]).abs().max() > 1e-4


def test_outputs_independent_of_removed_contents():
    model = _model()
    B, T = 3, 19
    obs = _obs(B, T)
    term, rem = _flags(B, T)
    garbage = obs.clone()
    garbage[rem] = 1e3 * torch.randn(int(rem.sum()), DIMS.obs_dim)
    with torch.no_grad():
        l1, v1 = model(obs, term, rem)
        l2, v2 = model(garbage, term, rem)
    keep = ~rem
    torch.testing.assert_close(l1[keep], l2[keep], atol=1e-6, rtol=0)
    torch.testing.assert_close(v1[keep], v2[keep], atol=1e-6, rtol=0)
    # the removed steps' own outputs ignore their input too (it is zeroed before the encoder)
    torch.testing.assert_close(v1[rem], v2[rem], atol=1e-6, rtol=0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_in_removed_step_does_not_spread(bad):
    """NaN/inf in a removed step's observation must not reach any output of
    `forward` or `forward_eval` (formerly 0 x NaN in the attention spread it to every later step)."""
    model = _model()
    B, T = 3, 19
    obs = _obs(B, T)
    term, rem = _flags(B, T)
    assert rem.any()
    poisoned = obs.clone()
    poisoned[rem] = bad
    with torch.no_grad():
        l1, v1 = model(obs, term, rem)
        l2, v2 = model(poisoned, term, rem)
        assert torch.isfinite(l2).all() and torch.isfinite(v2).all()
        torch.testing.assert_close(l2, l1, atol=1e-6, rtol=0)
        torch.testing.assert_close(v2, v1, atol=1e-6, rtol=0)
        cache = model.init_cache(B, T)
        for t in range(T):
            lt, vt, cache = model.forward_eval(poisoned[:, t], cache, rem[:, t])
            assert torch.isfinite(lt).all() and torch.isfinite(vt).all(), t
            keep = ~rem[:, t]
            torch.testing.assert_close(vt[keep], v1[keep, t], atol=1e-5, rtol=1e-5)
            model.reset_cache(cache, term[:, t])


def test_gradients_at_removed_inputs_are_zero():
    model = _model()
    B, T = 3, 19
    obs = _obs(B, T).requires_grad_(True)
    term, rem = _flags(B, T)
    logits, values = model(obs, term, rem)
    keep = ~rem
    loss = (logits[keep] ** 2).sum() + values[keep].sum()
    loss.backward()
    g = obs.grad
    assert torch.all(g[rem] == 0)
    assert (g[keep].abs().sum(-1) > 0).all()


def test_reset_cache_clears_only_terminal_slots():
    model = _model()
    obs = _obs(2, 6)
    cache = model.init_cache(2, 6)
    with torch.no_grad():
        for t in range(3):
            model.forward_eval(obs[:, t], cache)
        model.reset_cache(cache, torch.tensor([True, False]))
        assert cache.position.tolist() == [0, 3]
        _, v, _ = model.forward_eval(obs[:, 3], cache)
        _, v_fresh, _ = model.forward_eval(obs[:, 3], model.init_cache(2, 6))
    assert torch.allclose(v[0], v_fresh[0], atol=1e-6)  # slot 0 forgot its past
    assert (v[1] - v_fresh[1]).abs() > 1e-5  # slot 1 kept it


def test_hidden_token_is_invisible_to_later_steps():
    model = _model()
    obs = _obs(1, 4)
    with torch.no_grad():
        c1 = model.init_cache(1, 4)
        model.forward_eval(obs[:, 0], c1)
        model.forward_eval(obs[:, 1], c1, torch.tensor([True]))
        _, v1, _ = model.forward_eval(obs[:, 2], c1)
        c2 = model.init_cache(1, 4)
        model.forward_eval(obs[:, 0], c2)
        model.forward_eval(obs[:, 3] * 50, c2, torch.tensor([True]))  # other content, hidden too
        _, v2, _ = model.forward_eval(obs[:, 2], c2)
    torch.testing.assert_close(v1, v2, atol=1e-6, rtol=0)


def test_masked_max_pool_all_invalid_is_zero_and_finite_grad():
    f = torch.randn(3, 5, 4, requires_grad=True)
    valid = torch.tensor([[True, False, True, False, False], [False] * 5, [False, False, False, False, True]])
    out = masked_max_pool(f, valid)
    assert torch.equal(out[1], torch.zeros(4))
    assert torch.equal(out[0], torch.maximum(f[0, 0], f[0, 2]).detach())
    assert torch.equal(out[2], f[2, 4].detach())
    out.sum().backward()
    assert torch.isfinite(f.grad).all() and torch.all(f.grad[1] == 0)
    assert torch.all(f.grad[0, [1, 3, 4]] == 0)


def test_heads_and_distributions():
    model = _model(continuous=True)
    mean = torch.randn(6, 2)
    act = torch.randn(6, 2)
    ref = torch.distributions.Normal(mean, model.log_std.exp()).log_prob(act).sum(-1)
    torch.testing.assert_close(model.log_prob(mean, act), ref)
    torch.testing.assert_close(model.entropy(mean)[0], torch.distributions.Normal(mean, model.log_std.exp()).entropy().sum(-1)[0])
    disc = _model()
    logits = torch.randn(5, 91)
    a = disc.sample(logits)
    assert a.dtype == torch.int64 and a.shape == (5,) and ((a >= 0) & (a < 91)).all()
    torch.testing.assert_close(disc.log_prob(logits, a), torch.distributions.Categorical(logits=logits).log_prob(a))
    torch.testing.assert_close(disc.entropy(logits), torch.distributions.Categorical(logits=logits).entropy())
    assert torch.equal(disc.sample(logits, deterministic=True), logits.argmax(-1))
    # Gumbel-max sampling follows the softmax: empirical frequencies of a 3-way distribution
    torch.manual_seed(1)
    lg = torch.log(torch.tensor([0.2, 0.5, 0.3])).expand(20000, 3)
    freq = torch.bincount(disc.sample(lg), minlength=3).float() / 20000
    torch.testing.assert_close(freq, torch.tensor([0.2, 0.5, 0.3]), atol=0.02, rtol=0)
    # temperature T: a draw from softmax(logits / T), hand-computed for T = 0.5 (p^2 renormalised)
    freq = torch.bincount(disc.sample(lg, temperature=0.5), minlength=3).float() / 20000
    torch.testing.assert_close(freq, torch.tensor([0.04, 0.25, 0.09]) / 0.38, atol=0.02, rtol=0)
    torch.manual_seed(2)
    std = (model.sample(torch.zeros(20000, 2), temperature=2.0)).std(0)  # continuous: std times T
    torch.testing.assert_close(std, 2.0 * model.log_std.exp().detach(), atol=0.05, rtol=0.03)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature"):
            disc.sample(lg, temperature=bad)
    # initial discrete policy is near uniform
    with torch.no_grad():
        lo, _ = disc(_obs(1, 3), torch.zeros(1, 3, dtype=torch.bool), torch.zeros(1, 3, dtype=torch.bool))
    assert disc.entropy(lo).min() > math.log(91) - 0.05


def test_bad_shapes_raise():
    model = _model()
    with pytest.raises(ValueError, match="last dim"):
        model.forward_eval(torch.zeros(2, DIMS.obs_dim + 1), model.init_cache(2, 3))
    with pytest.raises(ValueError, match="terminal"):
        model(torch.zeros(2, 3, DIMS.obs_dim), torch.zeros(2, 4, dtype=torch.bool), torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="divisible"):
        ActorCritic(DIMS, 91, False, PolicyConfig(d_model=30, n_heads=4))


def test_describe_roundtrip():
    model = _model(max_roads=4)
    clone = ActorCritic.from_description(model.describe())
    clone.load_state_dict(model.state_dict())
    obs = _obs(1, 5)
    f = torch.zeros(1, 5, dtype=torch.bool)
    with torch.no_grad():
        assert torch.equal(model(obs, f, f)[1], clone(obs, f, f)[1])


def test_policy_for_env_reads_layout_actions_and_action_space():
    """``ActorCritic.for_env``: the observation sizes, the action count and the head of the env's
    action space (an env without a config: the given ``EnvConfig``'s)."""
    from types import SimpleNamespace

    from gpusim.config import EnvConfig
    from gpusim.kernels.obs_layout import obs_layout

    lay = obs_layout(3, 4, num_signals=2, candidates=2)
    pc = PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=8)
    disc = ActorCritic.for_env(SimpleNamespace(obs_layout=lay, num_actions=91, config=EnvConfig()), pc)
    assert not disc.continuous and disc.actor.out_features == 91 and not hasattr(disc, "log_std")
    assert disc.dims == ObsDims.from_layout(lay) and disc.encoder.compact_dim == lay.obs_dim
    cont = ActorCritic.for_env(SimpleNamespace(obs_layout=lay, num_actions=2,
                                               config=EnvConfig(action_space="continuous")), pc)
    assert cont.continuous and cont.log_std.shape == (2,) and cont.actor.out_features == 2
    bare = ActorCritic.for_env(SimpleNamespace(obs_layout=lay, num_actions=2), pc, EnvConfig(action_space="continuous"))
    assert bare.continuous


def test_trainer_and_scripts_build_the_policy_in_one_place():
    """Every policy the trainer, behaviour cloning and the profiling scripts build for an env goes
    through ``ActorCritic.for_env``: no direct ``ActorCritic(...)`` call in ``train/`` or ``profiling/``."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    calls = []
    for path in sorted([*root.glob("train/**/*.py"), *root.glob("profiling/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ActorCritic":
                calls.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not calls, "build the policy with ActorCritic.for_env(env, config): " + ", ".join(calls)


def test_slot_encoder_fused_equals_reference_values_and_grads():
    from policy.encoders import SlotEncoder

    torch.manual_seed(3)
    enc = SlotEncoder(6, 16)
    x = torch.randn(4, 7, 9, 6)
    x[..., -1] = (torch.rand(4, 7, 9) < 0.6).float()
    x[0, 0, :, -1] = 0.0  # a token with no valid slot -> post(0)
    grads = []
    for fn in (enc.forward, enc.reference):
        xi = x.clone().requires_grad_(True)
        enc.zero_grad()
        out = fn(xi)
        (out * torch.linspace(-1, 1, 16)).sum().backward()
        grads.append((out.detach(), xi.grad.clone(), [p.grad.clone() for p in enc.parameters()]))
    (o1, gx1, gp1), (o2, gx2, gp2) = grads
    torch.testing.assert_close(o1, o2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(o1[0, 0], enc.post.bias.detach())
    with torch.no_grad():  # the rollout path (no arg-max indices) computes the same
        torch.testing.assert_close(enc(x), o1, atol=1e-6, rtol=0)
    torch.testing.assert_close(gx1, gx2, atol=1e-5, rtol=1e-5)
    for a, b in zip(gp1, gp2):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # NaN/inf in invalid slots reach neither the output nor the gradients
    xn = x.clone()
    xn[..., :-1] = torch.where(xn[..., -1:] > 0.5, xn[..., :-1], torch.tensor(float("nan")))
    xn.requires_grad_(True)
    enc.zero_grad()
    out = enc(xn)
    torch.testing.assert_close(out, o1)
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in enc.parameters()) and torch.isfinite(xn.grad).all()


def test_hidden_is_what_forward_feeds_its_heads():
    model = _model()
    model.pack_removed = False
    g = torch.Generator().manual_seed(5)
    B, T = 3, 9
    obs = torch.randn(B, T, DIMS.obs_dim, generator=g)
    terminal = torch.zeros(B, T, dtype=torch.bool)
    terminal[:, 4] = True
    removed = torch.rand(B, T, generator=g) < 0.3
    logits, values = model(obs, terminal, removed)
    h = model.hidden(obs, terminal, removed)
    assert h.shape == (B, T, model.config.d_model)
    assert torch.equal(model._logits(h), logits) and torch.equal(model.critic(h)[..., 0], values)
    with pytest.raises(ValueError, match="ActorCritic.hidden"):
        model.hidden(obs, terminal[:, :-1], removed)
