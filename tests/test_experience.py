"""Experience hook: identity is a no-op (bit-identical update), dropping scales the optimizer steps,
the per-episode annotation labels exactly the successful episodes, hooks stay on the device."""

from __future__ import annotations

import pytest
import torch

from policy import ActorCritic, ObsDims, PolicyConfig
from train.experience import (DropExperience, ExperienceHook, GoalEpisodeBonus, ProgressShaping, RewardRelabel,
                              make_hook)
from train.ppo import PPOConfig
from train.rollout import RolloutBatch
from train.run import update_policy

DIMS = ObsDims(4, 2, 3, 3, 4)


def _batch(R=8, H=10, device="cpu", seed=0):
    b = RolloutBatch.empty(R, H, DIMS.obs_dim, False, 1, device)
    if device == "meta":
        return b
    g = torch.Generator().manual_seed(seed)
    b.obs.copy_(torch.randn(R, H, DIMS.obs_dim, generator=g))
    b.actions.copy_(torch.randint(91, (R, H), generator=g))
    b.logprobs.fill_(-4.5)
    b.rewards.copy_(torch.randn(R, H, generator=g))
    b.values.copy_(torch.randn(R, H, generator=g))
    b.loss_mask.fill_(True)
    b.terminal[:, -1] = True
    b.slot_active.fill_(True)
    b.scenario.copy_(torch.arange(R) % 3)
    b.agent_type.copy_(torch.tensor([0, 1, 0, 2, 0, 0, 1, 0])[:R])
    return b


def _model():
    torch.manual_seed(0)
    return ActorCritic(DIMS, 91, False, PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16))


def _run(hook, batch, seed=0):
    model = _model()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    gen = torch.Generator().manual_seed(seed)
    stats, counts = update_policy(model, opt, batch, hook, PPOConfig(update_epochs=2, num_minibatches=2), gen)
    return model, stats, counts


def test_identity_hook_bit_identical_to_no_hook():
    m1, _, c1 = _run(None, _batch())
    m2, _, c2 = _run(ExperienceHook(), _batch())
    assert c1 == c2 and c1["optimizer_steps"] == 4
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)


def test_drop_all_gives_zero_optimizer_steps_and_no_nan():
    pred_hook = make_hook("drop", ["predicate=test_experience:drop_everything"])
    model, stats, counts = _run(pred_hook, _batch())
    assert counts["optimizer_steps"] == 0 and counts["effective_steps"] == 0
    assert all(torch.isfinite(v) for v in stats.values())
    for p, q in zip(model.parameters(), _model().parameters()):
        assert torch.equal(p, q)


def drop_everything(batch):
    return torch.ones_like(batch.loss_mask)


def test_drop_half_gives_half_the_optimizer_steps():
    _, _, full = _run(ExperienceHook(), _batch())
    _, _, half = _run(make_hook("drop", ["rows=odd"]), _batch())
    assert half["effective_steps"] * 2 == full["effective_steps"]
    assert half["optimizer_steps"] * 2 == full["optimizer_steps"]
    assert half["rows_per_minibatch"] == full["rows_per_minibatch"]


def test_drop_by_scenario_and_agent_type():
    b = _batch()
    hook = DropExperience(["scenario=s1", "agent_type=pedestrian,cyclist"], {"scenario_ids": ["s0", "s1", "s2"]})
    out, eff = hook.preprocess_unroll_experience(b)
    rows_dropped = (b.scenario == 1) | (b.agent_type == 1) | (b.agent_type == 2)
    assert torch.equal(out.loss_mask.any(1), ~rows_dropped)
    assert eff == (~rows_dropped).sum() * b.horizon
    with pytest.raises(ValueError, match="not in the pack"):
        DropExperience(["scenario=nope"], {"scenario_ids": ["s0"]})
    with pytest.raises(ValueError, match="unknown experience argument"):
        DropExperience(["colour=red"])
    with pytest.raises(ValueError, match="unknown experience hook"):
        make_hook("nope")


def test_goal_bonus_labels_exactly_successful_episodes():
    R, H = 3, 10
    b = _batch(R, H)
    b.rewards.zero_()
    b.terminal.zero_()
    b.goal_reached.zero_()
    # row 0: episodes [0..3], [4..9]; goal in the second one at step 6
    b.terminal[0, 3] = True
    b.terminal[0, 9] = True
    b.goal_reached[0, 6] = True
    # row 1: one episode, goal at its first step; steps 8, 9 invalid (after the goal)
    b.terminal[1, 9] = True
    b.goal_reached[1, 0] = True
    b.loss_mask[1, 8:] = False
    # row 2: three episodes, none successful
    b.terminal[2, [2, 5, 9]] = True
    out, eff = GoalEpisodeBonus(["bonus=0.5"]).preprocess_unroll_experience(b)
    expect = torch.zeros(R, H)
    expect[0, 4:] = 0.5
    expect[1, :8] = 0.5
    assert torch.equal(out.rewards, expect)
    assert eff == b.loss_mask.sum()


def test_reward_relabel():
    b = _batch()
    b.loss_mask[0, 5:] = False
    out, _ = RewardRelabel(["scale=2", "step=-0.1"]).preprocess_unroll_experience(b)
    torch.testing.assert_close(out.rewards, 2 * b.rewards - 0.1 * b.loss_mask.float())


def test_progress_shaping_telescopes_and_skips_episode_ends():
    """With gamma = 1 the shaping of an uninterrupted stretch sums to weight * (d_first - d_last);
    terminal steps, the last column, steps before an out-of-play observation and masked steps get
    none (a crash never earns the distance it would remove)."""
    R, H, col = 3, 8, 0
    b = _batch(R, H)
    b.rewards.zero_()
    b.terminal.zero_()
    d = torch.tensor([[0.9, 0.8, 0.7, 0.72, 0.6, 0.5, 0.4, 0.3]]).repeat(R, 1)
    b.obs[..., col] = d
    # row 0: one uninterrupted episode (the last column ends it)
    # row 1: a crash (terminal) at step 3; a new episode starts at step 4 (as with respawn)
    b.terminal[1, 3] = True
    # row 2: the agent is out of play from step 5 on (removed)
    b.removed[2, 5:] = True
    f = ProgressShaping([f"weight=2", "gamma=1", f"column={col}"]).shaping(b)
    torch.testing.assert_close(f[0].sum(), torch.tensor(2 * (0.9 - 0.3)))
    assert f[0, -1] == 0
    torch.testing.assert_close(f[0, 2], torch.tensor(2 * (0.7 - 0.72)))  # moving away costs
    assert f[1, 3] == 0 and torch.all(f[2, 4:] == 0)
    torch.testing.assert_close(f[1, :3].sum(), torch.tensor(2 * (0.9 - 0.72)))
    torch.testing.assert_close(f[1, 4:].sum(), torch.tensor(2 * (0.6 - 0.3)))
    torch.testing.assert_close(f[2, :4].sum(), torch.tensor(2 * (0.9 - 0.6)))
    # discounting: F = w * (d_t - gamma d_{t+1}); the hook adds F to the env reward
    g = ProgressShaping(["weight=1", "gamma=0.5", f"column={col}"])
    out, eff = g.preprocess_unroll_experience(b)
    torch.testing.assert_close(out.rewards[0, 0], torch.tensor(0.9 - 0.5 * 0.8))
    assert eff == b.loss_mask.sum()


def test_progress_shaping_reads_the_goal_distance_of_real_observations(sample_dir):
    """Default column = the ego block's goal_dist/100: on a real scenario it equals the distance
    from the ego to its goal divided by 100 m, and the trainer's gamma is used."""
    from gpusim.config import EnvConfig
    from gpusim.data import ScenarioPack
    from gpusim.env import DriveEnv

    cfg = EnvConfig(max_controlled=4)
    pack = ScenarioPack.from_json(sorted(sample_dir.glob("*.json*"))[:2], cfg.data_config())
    env = DriveEnv(pack, 2, cfg)
    obs = env.reset()
    hook = ProgressShaping([], {"gamma": 0.9})
    assert hook.gamma == 0.9
    st = env.state
    d = torch.linalg.vector_norm(st.goal[:, :4] - st.pos[:, :4], dim=-1) / 100.0
    act = st.slot_active & st.present[:, :4]
    torch.testing.assert_close(obs[..., hook.column][act], d[act])


@pytest.mark.parametrize("name,args", [("identity", []), ("relabel", ["scale=2", "step=0.1"]),
                                       ("progress", ["weight=1"]),
                                       ("goal_bonus", ["bonus=1"]), ("drop", ["rows=even", "agent_type=cyclist"])])
def test_hooks_stay_on_device_without_host_reads(name, args):
    """On the 'meta' device any host read would raise; every returned tensor stays on the device."""
    b = _batch(device="meta")
    out, eff = make_hook(name, args).preprocess_unroll_experience(b)
    assert torch.as_tensor(eff).device.type == "meta"
    for f in ("obs", "actions", "rewards", "loss_mask", "terminal", "removed", "values", "logprobs"):
        assert getattr(out, f).device.type == "meta"
