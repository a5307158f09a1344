"""The sim-agent setting: goal behaviour ``continue``, the ``all_valid`` control rule as an env
option, the named settings (``--setting``) of train/run.py, train/bc.py and train/evaluate.py."""

import numpy as np
import pytest
import torch

from gpusim.config import EnvConfig
from gpusim.data import ScenarioPack
from gpusim.data.parse import read_scenario
from gpusim.env import DriveEnv
from gpusim.kernels.dynamics import NUM_STEER

from conftest import SAMPLE_DIR
from synthetic import driver, parked, small_config, synthetic_pack

COAST = 3 * NUM_STEER + 6  # accel 0, steer 0: constant speed, straight on


def _cfg(**kw):
    base = dict(max_agents=8, max_controlled=4, num_partners=7, num_roads=16, scenario_length=30)
    base.update(kw)
    return EnvConfig(**base)


def _drive(behavior, steps=25):
    # 5 m/s along +x, goal at x = 10.3 (radius 2): reached at step 17 (index 16, x = 8.5)
    pack = synthetic_pack([{"agents": [driver(0, 0, 0.0, 5.0, (10.3, 0.0)), parked(0, 30)], "num_controlled": 1}],
                          small_config())
    env = DriveEnv(pack, 2, _cfg(goal_behavior=behavior))
    env.reset(seed=0)
    out = []
    for _ in range(steps):
        res = env.step(torch.full((2, env.num_slots), COAST, dtype=torch.int64))
        out.append((res, env.state.pos[:, 0, 0].clone()))
    return out


def test_continue_keeps_the_agent_driving_after_its_goal_and_pays_the_goal_once():
    out = _drive("continue")
    reward = torch.stack([r.reward[:, 0] for r, _ in out])  # [25, W]
    loss = torch.stack([r.loss_mask[:, 0] for r, _ in out])
    reached = torch.stack([r.info["goal_reached"][:, 0] for r, _ in out])
    x = torch.stack([p for _, p in out])
    # the agent stays within 2 m of x = 10.3 for steps 16..23 (x = 8.5 ... 12.0): paid at step 16 only
    assert reward[16].tolist() == [1.0, 1.0] and reward.sum(0).tolist() == [1.0, 1.0]
    assert reached[16].all() and not reached[17:].any() and not reached[:16].any()
    assert loss.all()  # never out of play
    assert not out[-1][0].stopped[:, 0].any()
    assert torch.allclose(x[-1] - x[16], torch.full((2,), 8 * 0.5), atol=1e-4)  # 5 m/s * 0.1 s * 8 steps
    # the same agent under STOP stops at its goal
    stop = _drive("stop")
    assert stop[-1][0].stopped[:, 0].all() and torch.equal(stop[-1][1], stop[17][1])


def test_continue_is_parsed_by_name():
    assert str(EnvConfig(goal_behavior="continue").goal_behavior) == "continue"


@pytest.mark.parametrize("cap", [3, 64])
def test_all_valid_controls_every_object_valid_at_init_steps_up_to_the_cap(cap):
    files = sorted(SAMPLE_DIR.glob("*.json.xz"))[:2]
    cfg = EnvConfig(control="all_valid", init_steps=10, max_agents=128, max_controlled=cap, scenario_length=80)
    pack = ScenarioPack.from_json(files, cfg.data_config())
    for s, f in enumerate(files):
        raw = read_scenario(f)
        valid = int(raw.valid[:, 10].sum())
        assert int(pack.num_controlled[s]) == min(cap, valid)
        # every slot beyond the controlled ones that holds an object is log-replayed, and all were valid at step 10
        exists = pack.agent_exists[s].cpu().numpy()
        assert int(exists.sum()) == min(valid, 128)
        assert pack.traj_valid[s, :, 10][pack.agent_exists[s]].all()
    env = DriveEnv(pack, 2, cfg)
    env.reset(seed=0, scenarios=torch.tensor([0, 1]))
    valid = [int(read_scenario(f).valid[:, 10].sum()) for f in files]
    assert env.state.slot_active.sum(1).tolist() == [min(cap, v) for v in valid]
    # the objects over the cap are counted in one line (training and BC print it)
    from train.packs import over_cap

    over = sum(max(0, v - cap) for v in valid)
    assert over_cap(pack, cfg) == ([f"data: {over} of {sum(valid)} controllable objects are over --env.max-controlled "
                                    f"{cap} per scenario: log-replayed, not controlled"] if over else [])
    assert over_cap(pack, cfg.replace(control="vehicles_with_goal")) == []


def test_default_control_leaves_out_pedestrians_that_all_valid_controls():
    f = sorted(SAMPLE_DIR.glob("*.json.xz"))[0]
    raw = read_scenario(f)
    base = EnvConfig(init_steps=10, max_agents=128, max_controlled=64)
    default = ScenarioPack.from_json([f], base.data_config())
    every = ScenarioPack.from_json([f], base.replace(control="all_valid").data_config())
    valid = int(raw.valid[:, 10].sum())
    assert int(default.num_controlled[0]) < valid
    assert int(every.agent_exists[0].sum()) == valid


def test_setting_flags_are_defaults_and_flags_win():
    from train.bc import parse_args as bc_args
    from train.config import parse_args
    from train.settings import SETTINGS

    cfg = parse_args(["--setting", "sim_agent", "--device", "cpu", "--env.max-controlled", "16"])
    for k, v in SETTINGS["sim_agent"].items():
        if k != "max_controlled":
            assert str(getattr(cfg.env, k)) == str(v), k
    assert cfg.env.max_controlled == 16
    assert parse_args(["--device", "cpu"]).env.control == "vehicles_with_goal"
    assert bc_args(["--setting", "sim_agent", "--device", "cpu"]).env.control == "all_valid"
    with pytest.raises(ValueError, match="--setting nope: unknown setting; use one of goal, sim_agent"):
        parse_args(["--setting", "nope", "--device", "cpu"])


def test_evaluate_setting_overrides_the_checkpoint_env():
    from train.settings import SETTINGS, setting_config
    from train.config import TrainConfig

    own = TrainConfig().env
    same, notes = setting_config(own, None)
    assert same is own and notes == []
    sa, notes = setting_config(own, "sim_agent")
    assert sa.control == "all_valid" and sa.init_steps == 10 and str(sa.goal_behavior) == "continue"
    assert sa.scenario_length == 80 and notes and "control=all_valid" in notes[0]
    back, _ = setting_config(sa, "goal")
    assert back == own  # the goal setting is the trainer's defaults
    assert set(SETTINGS["goal"]) == set(SETTINGS["sim_agent"])


def test_a_saved_config_with_a_setting_replays_its_own_env(tmp_path):
    import json

    from train.config import TrainConfig, parse_args

    run = parse_args(["--setting", "sim_agent", "--device", "cpu", "--env.max-controlled", "16"])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(run.to_dict()))
    again = parse_args(["--config", str(path), "--device", "cpu"])
    assert again.env == run.env and again.env.max_controlled == 16 and again.setting == "sim_agent"
    assert TrainConfig().env.max_controlled == 8


def test_a_bc_checkpoint_of_the_sim_agent_setting_is_scored_in_wosac_mode_and_in_the_goal_setting(tmp_path):
    from policy.actor_critic import PolicyConfig
    from train.bc import BCConfig, train_bc
    from train.settings import setting_config
    from train.evaluate import EvalConfig, evaluate

    data = tmp_path / "d"
    data.mkdir()
    for f in sorted(SAMPLE_DIR.glob("*.json.xz"))[:2]:
        (data / f.name).symlink_to(f)
    out = tmp_path / "bc.pt"
    env = setting_config(BCConfig().env, "sim_agent")[0]
    train_bc(BCConfig(data=str(data), out=str(out), epochs=1, device="cpu", num_worlds=2, env=env, quiet=True,
                      policy=PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16, max_roads=8)),
             say=lambda *_: None)
    res = evaluate(EvalConfig(policy=(str(out),), data="data/womd_tfrecord", mode=("wosac",), wosac_rollouts=2,
                              device="cpu", quiet=True))
    row = res["runs"][0]["per_scenario"][0]
    assert 0.0 < row["metametric"] < 1.0 and row["replayed"] == 0
    goal = evaluate(EvalConfig(policy=(str(out),), data=str(data), setting="goal", device="cpu", quiet=True))
    assert any("--setting goal" in n for n in goal["notes"]) and goal["env"]["control"] == "vehicles_with_goal"
