"""policy/actor.py (the one "act with the policy and its KV cache") and train.checkpoint.load_policy
(the one way to load a policy to act with)."""

from __future__ import annotations

import pytest
import torch

from gpusim.config import EnvConfig
from gpusim.data import ScenarioPack
from gpusim.env import DriveEnv
from policy.actor import Actor
from policy.actor_critic import ActorCritic, PolicyConfig
from policy.encoders import ObsDims

DIMS = ObsDims(ego_dim=6, num_partners=2, partner_dim=5, num_roads=3, road_dim=4)
SMALL = PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=8)


def _policy(continuous=False, seed=0):
    torch.manual_seed(seed)
    return ActorCritic(DIMS, 2 if continuous else 91, continuous, SMALL).eval()


def test_act_is_forward_eval_then_sample_and_observe_updates_in_place():
    pol = _policy()
    N, H = 4, 6
    actor = Actor(pol, N, H, deterministic=True)
    ref = pol.init_cache(N, H)
    removed_tensor = actor.removed
    g = torch.Generator().manual_seed(1)
    ref_removed = torch.zeros(N, dtype=torch.bool)
    for t in range(4):
        obs = torch.randn(N, DIMS.obs_dim, generator=g)
        act = actor.act(obs)
        logits, value, _ = pol.forward_eval(obs, ref, ref_removed)
        assert torch.equal(act.logits, logits) and torch.equal(act.value, value)
        assert torch.equal(act.action, logits.argmax(-1))
        terminal = torch.tensor([t == 1, False, False, False])
        removed = torch.tensor([False, t >= 2, False, False])
        actor.observe(terminal, removed, truncation=torch.tensor([False, False, True, False]))
        pol.reset_cache(ref, terminal)
        ref_removed = removed
        assert actor.removed is removed_tensor and torch.equal(actor.removed, removed)  # in place
    # slot 0 was cleared after step 1 (2 steps since), the truncation of slot 2 kept its memory
    assert actor.cache.position.tolist() == [2, 4, 4, 4] == ref.position.tolist()
    actor.begin()
    assert actor.cache.position.tolist() == [0] * N and not actor.removed.any()


def test_coplayer_actor_forgets_at_trial_ends_and_clamps_continuous_actions():
    pol = _policy(continuous=True)
    actor = Actor(pol, 2, 5, reset_at_trial=True)
    for _ in range(2):
        actor.act(torch.randn(2, DIMS.obs_dim))
    no = torch.zeros(2, dtype=torch.bool)
    actor.observe(no, no, truncation=torch.tensor([True, False]))
    assert actor.cache.position.tolist() == [0, 2]
    big = torch.tensor([[3.0, -0.5], [-2.0, 0.25]])
    assert torch.equal(actor.env_action(big), torch.tensor([[1.0, -0.5], [-1.0, 0.25]]))
    assert Actor(_policy(), 1, 1).env_action(torch.tensor([90])).tolist() == [90]  # discrete: as is
    with pytest.raises(ValueError, match="num_slots"):
        Actor(pol, -1, 5)


def test_sampling_draws_from_the_global_generator():
    pol = _policy()
    obs = torch.randn(3, DIMS.obs_dim)
    torch.manual_seed(5)
    a = Actor(pol, 3, 2).act(obs).action
    torch.manual_seed(5)
    logits, _, _ = pol.forward_eval(obs, pol.init_cache(3, 2), torch.zeros(3, dtype=torch.bool))
    assert torch.equal(a, pol.sample(logits))


# ---------------------------------------------------------------------------- load_policy
@pytest.fixture(scope="module")
def env(sample_dir):
    cfg = EnvConfig(max_controlled=4, num_partners=3, scenario_length=5)
    pack = ScenarioPack.from_json(sorted(sample_dir.glob("*.json*"))[:2], cfg.data_config())
    return DriveEnv(pack, 2, cfg, seed=0)


def _save(tmp_path, env, name="checkpoint.pt", continuous=False):
    from train.checkpoint import save_checkpoint

    torch.manual_seed(3)
    pol = ActorCritic(env.obs_layout, 2 if continuous else env.num_actions, continuous, SMALL)
    opt = torch.optim.Adam(pol.parameters())
    path = save_checkpoint(tmp_path / name, policy=pol, optimizer=opt, global_step=11, update=1, config={},
                           env_config={})
    return pol, path


def test_load_policy_round_trip_frozen_and_checked(env, tmp_path):
    from train.checkpoint import PolicyMismatch, load_policy

    pol, path = _save(tmp_path, env)
    loaded, payload = load_policy(tmp_path, "cpu", env.obs_layout, env.num_actions, False)  # a run directory
    assert payload["global_step"] == 11 and not loaded.training
    assert not any(p.requires_grad for p in loaded.parameters())
    obs = env.reset(seed=1).reshape(-1, env.obs_dim)
    with torch.no_grad():
        want = pol.eval().forward_eval(obs, pol.init_cache(8, 5))[0]
    assert torch.equal(Actor(loaded, 8, 5).act(obs).logits, want)
    _, cont = _save(tmp_path, env, "cont.pt", continuous=True)
    with pytest.raises(PolicyMismatch, match="cont.pt: the policy reads .* 2 continuous actions, the env gives") as e:
        load_policy(cont, "cpu", env.obs_layout, env.num_actions, False)
    assert isinstance(e.value, ValueError) and e.value.detail.startswith("the policy reads")
    other = EnvConfig(max_controlled=4, num_partners=2, scenario_length=5)
    with pytest.raises(PolicyMismatch, match="observations"):
        load_policy(path, "cpu", DriveEnv(env.pack, 1, other).obs_layout)
    with pytest.raises(FileNotFoundError, match="nothing.pt"):
        load_policy(tmp_path / "nothing.pt")
