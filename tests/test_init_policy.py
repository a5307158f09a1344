"""``--init-policy`` across observation layouts (``ActorCritic.init_from``, ``train.human.init_policy``):
a policy that reads the memory task's candidate block starts from one that does not, computing the
same function; a layout that differs elsewhere is refused with one line."""

import pytest
import torch

from policy.actor_critic import ActorCritic, PolicyConfig
from policy.encoders import ObsDims

CFG = PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=8)


def _dims(**kw) -> ObsDims:
    base = dict(ego_dim=11, num_partners=3, partner_dim=11, num_roads=4, road_dim=10, num_signals=2, signal_dim=11)
    return ObsDims(**{**base, **kw})


def _policy(dims: ObsDims, seed: int, config: PolicyConfig = CFG) -> ActorCritic:
    torch.manual_seed(seed)
    return ActorCritic(dims, 91, False, config).eval()


def _logits(policy: ActorCritic, obs: torch.Tensor) -> torch.Tensor:
    logits, value, _ = policy.forward_eval(obs, policy.init_cache(obs.shape[0], 4))
    return torch.cat([logits, value[:, None]], dim=1)


def test_candidate_block_starts_at_zero_and_the_function_is_the_sources():
    source, target = _policy(_dims(), 1), _policy(_dims(candidate_dim=7), 2)
    blocks = target.init_from(source)
    assert blocks == {"fresh": ["candidates"], "dropped": []}
    cols = target.encoder.ego_columns()
    assert cols == {"ego": slice(0, 11), "candidates": slice(11, 18)}
    w = target.state_dict()[ActorCritic.EGO_INPUT]
    assert torch.equal(w[:, 11:], torch.zeros(8, 7))
    assert torch.equal(w[:, :11], source.state_dict()[ActorCritic.EGO_INPUT])
    # the same logits and value whatever the candidate columns hold (they are the last 7 columns)
    torch.manual_seed(3)
    obs = torch.randn(5, target.dims.obs_dim)
    for name, lay in ((n, target.encoder.layouts[False]) for n in ("partners", "roads", "signals")):
        valid = torch.arange(lay.block(name).stop - lay.block(name).start) % (11 if name != "roads" else 10)
        obs[:, lay.block(name)] = torch.where(valid == valid.max(), 1.0, obs[:, lay.block(name)])  # valid flags
    got = _logits(target, obs)
    assert torch.allclose(got, _logits(source, obs[:, :-7]), atol=1e-6)
    obs[:, -7:] = torch.randn(5, 7) * 10
    assert torch.allclose(_logits(target, obs), got, atol=1e-6)


def test_unseen_ego_columns_start_at_zero_so_their_values_change_nothing():
    """Columns the source only ever saw as 0 (the trial clock of a checkpoint trained outside trial
    mode) keep no untrained weight: whatever they hold, the policy computes the source's function
    with them at 0."""
    source, target = _policy(_dims(), 1), _policy(_dims(), 2)
    assert target.init_from(source, ("trial_index", "time_in_trial")) == {"fresh": [], "dropped": []}
    lay = target.encoder.layouts[False]
    clock = [lay.column("ego", "trial_index"), lay.column("ego", "time_in_trial")]
    w = target.state_dict()[ActorCritic.EGO_INPUT]
    assert not w[:, clock].any() and source.state_dict()[ActorCritic.EGO_INPUT][:, clock].abs().min() > 0
    torch.manual_seed(3)
    obs = torch.randn(5, target.dims.obs_dim)
    obs[:, clock] = 0.0
    at_zero = _logits(source, obs)
    obs[:, clock] = torch.tensor([0.5, 0.8])  # trial 1 of 2, 80% of the way through it
    assert torch.allclose(_logits(target, obs), at_zero, atol=1e-6)
    assert not torch.allclose(_logits(source, obs), at_zero, atol=1e-3)  # the noise that is removed
    fresh = _policy(_dims(), 2)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(ValueError, match="the ego block has no feature 'trial'"):
        fresh.init_from(source, ("trial",))
    assert all(torch.equal(before[k], v) for k, v in fresh.state_dict().items())


def test_a_block_the_run_does_not_read_is_dropped():
    source, target = _policy(_dims(candidate_dim=7), 1), _policy(_dims(), 2)
    assert target.init_from(source) == {"fresh": [], "dropped": ["candidates"]}
    assert torch.equal(target.state_dict()[ActorCritic.EGO_INPUT], source.state_dict()[ActorCritic.EGO_INPUT][:, :11])


@pytest.mark.parametrize("source_kw, target_kw, config, match", [
    (dict(num_signals=0, signal_dim=0), {}, CFG, r"tensor encoder\.signal_set\.\S+ is absent in it, \[8, 11\] in this "
                                                 r"run's policy: .*'num_signals': \(2, 0\)"),
    (dict(candidate_dim=7), dict(candidate_dim=10), CFG, "its observation block candidates has 7 columns, this run's 10"),
    ({}, {}, PolicyConfig(d_model=32, n_layers=1, n_heads=2, hidden=8), "pass the same --policy.* flags"),
])
def test_other_layouts_and_sizes_are_refused_with_nothing_changed(source_kw, target_kw, config, match):
    source, target = _policy(_dims(**source_kw), 1, config), _policy(_dims(**target_kw), 2)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(ValueError, match=match) as e:
        target.init_from(source)
    assert "\n" not in str(e.value)
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())


def test_init_policy_from_a_driver_checkpoint_for_the_memory_task(tmp_path, capsys):
    """Through the trainer's loader: a goal-setting checkpoint starts a memory-task run with a note."""
    from gpusim.config import EnvConfig
    from gpusim.data import ScenarioPack
    from gpusim.env import DriveEnv
    from train.config import UserError
    from train.human import init_policy

    cfg = EnvConfig(goal_behavior="trial", k_trials=2, goal_candidates=2, scenario_length=20)
    pack = ScenarioPack.from_json("data/womd_sample", cfg.data_config())
    env = DriveEnv(pack, num_worlds=2, config=cfg, device="cpu", seed=0)
    policy = ActorCritic.for_env(env, PolicyConfig(d_model=64, n_layers=2, n_heads=4, hidden=64, max_roads=32))
    notes = init_policy(policy, "policies/driver.pt", env, cfg)
    assert notes == ["note: --init-policy policies/driver.pt: every weight copied; blocks candidates start with "
                     "input weights 0 (not read by the checkpoint); the ego columns trial_index, time_in_trial "
                     "start with input weights 0 (always 0 while the checkpoint trained: it was not in trial mode)"]
    driver = torch.load("policies/driver.pt", map_location="cpu", weights_only=False)["model"]
    assert torch.equal(policy.state_dict()["actor.weight"], driver["actor.weight"])
    # the trial clock's columns (ego block, before the candidates) start at 0; the rest of the ego block is copied
    lay, w = env.obs_layout, policy.state_dict()[ActorCritic.EGO_INPUT]
    clock = [lay.column("ego", c) - lay.block("ego").start for c in ("trial_index", "time_in_trial")]
    assert not w[:, clock].any() and driver[ActorCritic.EGO_INPUT][:, clock].abs().min() > 0
    rest = [c for c in range(lay.block("ego").stop - lay.block("ego").start) if c not in clock]
    assert torch.equal(w[:, rest], driver[ActorCritic.EGO_INPUT][:, rest])
    with pytest.raises(UserError, match=r"^--init-policy policies/driver.pt: its policy .* differs"):
        init_policy(ActorCritic.for_env(env, CFG), "policies/driver.pt", env, cfg)


def test_a_non_trial_bc_anchor_has_its_clock_weights_zeroed_in_a_trial_mode_run():
    """``--ppo.human-policy`` in trial mode from a checkpoint trained outside it: the frozen anchor's
    trial-clock input weights (never trained) are 0, the rest as saved; outside trial mode it is
    loaded as saved."""
    import dataclasses

    from gpusim.config import EnvConfig
    from gpusim.data import ScenarioPack
    from gpusim.env import DriveEnv
    from train.config import TrainConfig
    from train.human import TRIAL_CLOCK_COLUMNS, human_policy
    from train.ppo import PPOConfig

    driver = torch.load("policies/driver.pt", map_location="cpu", weights_only=False)["model"][ActorCritic.EGO_INPUT]
    sizes = PolicyConfig(d_model=64, n_layers=2, n_heads=4, hidden=64, max_roads=32)
    for trial in (True, False):
        cfg = EnvConfig(goal_behavior="trial", k_trials=2, scenario_length=20) if trial else EnvConfig()
        env = DriveEnv(ScenarioPack.from_json("data/womd_sample", cfg.data_config()), num_worlds=2, config=cfg,
                       device="cpu", seed=0)
        run = dataclasses.replace(TrainConfig(), env=cfg, policy=sizes,
                                  ppo=PPOConfig(human_kl=0.02, human_policy="policies/driver.pt"))
        anchor, _ = human_policy(run, env, cfg, None)
        w = anchor.state_dict()[ActorCritic.EGO_INPUT]
        clock = anchor.ego_input_columns(TRIAL_CLOCK_COLUMNS)
        rest = [c for c in range(w.shape[1]) if c not in clock]
        assert torch.equal(w[:, rest], driver[:, rest])
        assert torch.equal(w[:, clock], torch.zeros_like(w[:, clock]) if trial else driver[:, clock])
