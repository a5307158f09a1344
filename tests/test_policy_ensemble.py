"""policy/ensemble.py: K policies acting as one, their action distributions mixed."""

from __future__ import annotations

import pytest
import torch

from policy.actor import Actor
from policy.actor_critic import ActorCritic, PolicyConfig
from policy.encoders import ObsDims
from policy.ensemble import PolicyEnsemble

DIMS = ObsDims(ego_dim=6, num_partners=2, partner_dim=5, num_roads=3, road_dim=4)
SMALL = PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=8)


def _policy(seed, continuous=False, config=SMALL, dims=DIMS):
    torch.manual_seed(seed)
    return ActorCritic(dims, 2 if continuous else 91, continuous, config).eval()


def test_mixture_is_the_average_of_the_members_distributions_step_by_step():
    """Over several steps with a reset and a removed slot, the ensemble's softmax is the mean of
    the members' softmax (each member run by hand with its own cache), its value the mean value,
    and its ``mean`` decoding the rounded average of the members' expected grid indices."""
    a, b, c = _policy(0), _policy(1), _policy(2)
    ens = PolicyEnsemble([a, b, c])
    N, H = 3, 5
    cache = ens.init_cache(N, H)
    refs = [m.init_cache(N, H) for m in (a, b, c)]
    g = torch.Generator().manual_seed(3)
    removed = torch.zeros(N, dtype=torch.bool)
    for t in range(4):
        obs = torch.randn(N, DIMS.obs_dim, generator=g)
        logp, value, _ = ens.forward_eval(obs, cache, removed)
        outs = [m.forward_eval(obs, r, removed) for m, r in zip((a, b, c), refs)]
        probs = torch.stack([torch.softmax(lo, -1) for lo, _, _ in outs]).mean(0)
        torch.testing.assert_close(torch.softmax(logp, -1), probs)
        torch.testing.assert_close(logp.exp().sum(-1), torch.ones(N))  # log-probabilities already
        torch.testing.assert_close(value, torch.stack([v for _, v, _ in outs]).mean(0))
        grid = torch.arange(91)
        accel = ((grid // 13).float() * probs).sum(-1).round().long()
        steer = ((grid % 13).float() * probs).sum(-1).round().long()
        assert torch.equal(ens.sample(logp, "mean"), accel * 13 + steer)
        assert torch.equal(ens.sample(logp, "argmax"), probs.argmax(-1))
        done = torch.tensor([t == 1, False, False])
        ens.reset_cache(cache, done)
        for r in refs:
            a.reset_cache(r, done)
        removed = torch.tensor([False, t >= 2, False])
    assert cache.position.tolist() == [2, 4, 4] == refs[0].position.tolist()
    assert all(torch.equal(c1.position, r.position) for c1, r in zip(cache.caches, refs))


def test_identical_members_act_as_the_member_through_an_actor():
    """Two copies of one policy: the Actor's actions equal the member's own (mixing a distribution
    with itself changes nothing), and its memory clears as the member's does."""
    pol = _policy(0)
    twin = _policy(0)
    ens_actor = Actor(PolicyEnsemble([pol, twin]), 4, 6, deterministic="mean")
    one_actor = Actor(pol, 4, 6, deterministic="mean")
    g = torch.Generator().manual_seed(5)
    for t in range(5):
        obs = torch.randn(4, DIMS.obs_dim, generator=g)
        e, o = ens_actor.act(obs), one_actor.act(obs)
        assert torch.equal(e.action, o.action)
        torch.testing.assert_close(e.logits, torch.log_softmax(o.logits, -1))
        term = torch.tensor([t == 2, False, False, False])
        for actor in (ens_actor, one_actor):
            actor.observe(term, torch.zeros(4, dtype=torch.bool))
    assert ens_actor.cache.position.tolist() == one_actor.cache.position.tolist() == [2, 5, 5, 5]


def test_members_sure_of_different_actions_mix_to_half_each():
    """A hand-computed case: member A always picks action 0 and member B action 1 (output weights
    0, biases 0 and -30 elsewhere). The mixture gives each 1/2 (averaging the logits instead would
    too, but it would give the other 89 actions e^-15 each instead of about e^-30); argmax picks
    one of the two, and ``mean`` decoding lands on the grid cell halfway between them."""
    sure = []
    for seed, action in ((0, 0), (1, 1)):
        pol = _policy(seed)
        with torch.no_grad():
            pol.actor.weight.zero_()
            pol.actor.bias.fill_(-30.0)
            pol.actor.bias[action] = 0.0
        sure.append(pol)
    ens = PolicyEnsemble(sure)
    with torch.no_grad():
        logp, _, _ = ens.forward_eval(torch.randn(2, DIMS.obs_dim), ens.init_cache(2, 3))
    p = logp.exp()
    torch.testing.assert_close(p[:, :2], torch.full((2, 2), 0.5), atol=1e-6, rtol=0)
    assert float(p[:, 2:].max()) < 1e-12
    assert set(ens.sample(logp, "argmax").tolist()) <= {0, 1}
    # accel 0 for both; steer 0 and 1 -> expected 0.5 -> rounds to 0 (round half to even)
    assert ens.sample(logp, "mean").tolist() == [0, 0]


@pytest.mark.parametrize("members, message", [
    (lambda: [_policy(0)], "at least 2 members"),
    (lambda: [_policy(0), _policy(1, continuous=True)], "member 1 has continuous actions"),
    (lambda: [_policy(0), _policy(1, dims=ObsDims(6, 2, 5, 4, 4))], "member 1 has observations"),
    (lambda: [_policy(0), _policy(1, config=PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=8,
                                                          memory="trial"))], "member 1 has memory rule"),
])
def test_members_that_cannot_be_mixed_are_refused(members, message):
    with pytest.raises(ValueError, match=message):
        PolicyEnsemble(members())


def test_agent_draw_keeps_one_member_per_slot_until_its_memory_restarts():
    """``draw="agent"``: every slot's output is exactly its drawn member's (log-probabilities and
    value), the draw holds over steps, a reset draws again only the reset slots, and over many
    slots both members are drawn about equally often."""
    a, b = _policy(0), _policy(1)
    ens = PolicyEnsemble([a, b], draw="agent")
    N, H = 400, 4
    torch.manual_seed(7)
    cache = ens.init_cache(N, H)
    member = cache.member.clone()
    assert 150 < int(member.sum()) < 250  # Binomial(400, 1/2): 200 +- 50 is over 5 standard deviations
    refs = [m.init_cache(N, H) for m in (a, b)]
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for t in range(3):
            obs = torch.randn(N, DIMS.obs_dim, generator=g)
            logp, value, _ = ens.forward_eval(obs, cache)
            own = [m.forward_eval(obs, r) for m, r in zip((a, b), refs)]
            want = torch.where(member[:, None] == 0, torch.log_softmax(own[0][0], -1), torch.log_softmax(own[1][0], -1))
            torch.testing.assert_close(logp, want)
            torch.testing.assert_close(value, torch.where(member == 0, own[0][1], own[1][1]))
            assert torch.equal(cache.member, member)  # held across steps
    done = torch.zeros(N, dtype=torch.bool)
    done[:200] = True
    ens.reset_cache(cache, done)
    assert torch.equal(cache.member[200:], member[200:])  # only the reset slots draw again
    assert not torch.equal(cache.member[:200], member[:200])
    assert cache.position[:200].eq(0).all() and cache.position[200:].eq(3).all()


def test_unknown_draw_is_refused():
    with pytest.raises(ValueError, match="draw must be one of step, agent"):
        PolicyEnsemble([_policy(0), _policy(1)], draw="world")
