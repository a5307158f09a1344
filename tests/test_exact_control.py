"""The exact memoryless control (``EnvConfig.zero_trial_index``, ``train/evaluate.py --memory trial``):
with the ``trial_index`` column zeroed and the cache cleared at every trial start, a deterministic
policy drives trial 1 exactly as trial 0 on the bundled sample scenarios; without the zeroing the
same policy does not; bad input gets one line."""

from __future__ import annotations

import pytest
import torch

from gpusim import DriveEnv
from gpusim.config import EnvConfig
from gpusim.sim.observe import TRIAL_INDEX_COLUMN
from train.packs import load_pack

L = 12  # steps per trial: short, so that no trial ends before its timeout
CFG = dict(max_controlled=8, goal_behavior="trial", k_trials=2, scenario_length=L)


@pytest.fixture(scope="module")
def pack(sample_dir):
    return load_pack(str(sample_dir), EnvConfig(**CFG))


def _run(pack, zero: bool):
    """Obs and actions [H, W, C] of one episode of a small untrained policy, cache cleared each trial."""
    from policy.actor_critic import ActorCritic, PolicyConfig
    from train.eval.sweep import PolicyDriver

    env = DriveEnv(pack, num_worlds=6, config=EnvConfig(**CFG, zero_trial_index=zero), seed=1)
    torch.manual_seed(0)
    policy = ActorCritic(env.obs_layout, env.num_actions,
                         config=PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16, max_roads=8))
    with torch.no_grad():  # make the untrained policy read the trial-index column strongly
        policy.encoder.ego[0].weight[:, TRIAL_INDEX_COLUMN] *= 50.0
    driver = PolicyDriver(policy, deterministic=True, memory="trial")
    obs = env.reset(seed=2)
    active = env.state.slot_active.clone()  # this episode's slots (the auto-reset at step H draws anew)
    driver.begin(env, obs)
    all_obs, actions = [], []
    for _ in range(env.horizon):
        act = driver.act(env, obs)
        all_obs.append(obs.clone())
        actions.append(act.clone())
        res = env.step(act)
        driver.observe(env, res)
        obs = res.obs
        if len(actions) == L:  # every world's trial 0 ended by its timeout, none earlier
            assert bool((env.state.trial_count == 1).all()) and bool((env.state.trial_start == L).all())
    return torch.stack(all_obs), torch.stack(actions), active


def test_trial_1_repeats_trial_0_with_the_exact_control(pack):
    obs, act, active = _run(pack, zero=True)
    assert torch.equal(obs[L], obs[0])  # trial 1 starts with trial 0's observation
    assert float(obs[..., TRIAL_INDEX_COLUMN].abs().max()) == 0.0
    assert torch.equal(act[L:][:, active], act[:L][:, active])
    # without the zeroing the same policy sees trial_index = 1/2 in trial 1 and acts otherwise
    obs, act, active = _run(pack, zero=False)
    assert float(obs[L][..., TRIAL_INDEX_COLUMN][active].min()) == 0.5
    assert not torch.equal(act[L:][:, active], act[:L][:, active])


def test_zero_trial_index_errors_are_one_line():
    with pytest.raises(ValueError, match=r"zero_trial_index needs trial mode \(--env.goal-behavior trial\)") as e:
        EnvConfig(zero_trial_index=True)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="zero_trial_index must be True or False"):
        EnvConfig(goal_behavior="trial", zero_trial_index=1)


def test_flag_and_evaluate_memory_trial_use_it(tmp_path, sample_dir):
    """``--env.zero-trial-index`` is a training flag; ``evaluate --memory trial`` turns it on, so the
    memory probe (deterministic, memory task) scores every agent-episode alike in both trials."""
    from train.config import parse_args
    from train.evaluate import EvalConfig, evaluate

    cfg = parse_args(["--env.goal-behavior", "trial", "--env.zero-trial-index"])
    assert cfg.env.zero_trial_index is True
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    res = evaluate(EvalConfig(policy=(str(root / "policies/memory_probe.pt"),), data=str(sample_dir),
                              memory="trial", num_threads=1, device="cpu", quiet=True))
    assert res["env"]["zero_trial_index"] is True
    rec = res["runs"][0]["records"]
    assert len(rec["trial_0_score"]) > 20
    assert torch.equal(torch.as_tensor(rec["trial_0_score"]), torch.as_tensor(rec["trial_1_score"]))
    assert torch.equal(torch.as_tensor(rec["trial_0_clean_score"]), torch.as_tensor(rec["trial_1_clean_score"]))
