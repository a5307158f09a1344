"""Behaviour cloning (train/bc.py): the targets and their masks (counts on a real bundled scene and
on crafted logs), the refusal of a dataset without a target, and a short training run whose loss
falls and whose checkpoint evaluates like any other."""

import dataclasses

import pytest
import torch

from gpusim.config import EnvConfig
from gpusim.data import ScenarioPack
from gpusim.env import DriveEnv
from policy.actor import Actor
from policy.actor_critic import ActorCritic, PolicyConfig
from policy.encoders import ObsDims
from train.bc import TRACK_TOLERANCE, BCConfig, check_targets, collect, train_bc
from train.config import UserError

from conftest import SAMPLE_DIR
from synthetic import driver, lane, parked, small_config, straight_track, synthetic_pack

SMALL = PolicyConfig(d_model=16, n_layers=1, n_heads=2, hidden=16, max_roads=8)


def _policy(env):
    return ActorCritic(ObsDims.from_layout(env.obs_layout), env.num_actions, False, SMALL)


def test_targets_and_masks_on_a_real_scene_match_the_log():
    # goal "continue" and contacts ignored: every active slot is in play at every step, so the
    # invalid-log count is the count of invalid next log poses, read straight from the pack
    f = SAMPLE_DIR / "tfrecord-00066-of-01000_343.json.xz"  # 8 vehicles, some logged with gaps
    cfg = EnvConfig(goal_behavior="continue", collision_behavior="ignore", offroad_behavior="ignore",
                    max_controlled=8)
    pack = ScenarioPack.from_json([f], cfg.data_config())
    env = DriveEnv(pack, 1, cfg)
    data = collect(env, _policy(env))
    n = int(pack.num_controlled[0])
    T = env.horizon
    nxt_valid = torch.zeros(n, T, dtype=torch.bool)
    nxt_valid[:, : T - 1] = pack.traj_valid[0, :n, 1:T]  # target of step t: log index t + 1 (none after the log)
    c = data.counts
    assert data.obs.shape[:2] == (n, T) and c["agent_steps"] == n * T
    assert c["invalid_log"] == int((~nxt_valid).sum())
    assert c["valid"] == c["agent_steps"] - c["invalid_log"] - c["out_of_range"] == int(data.mask.sum())
    assert not (data.mask & ~nxt_valid).any()
    # some logged poses are beyond one step's reach, most are followed (54 of the 676 valid
    # next poses out of range here when written)
    assert 0 < c["out_of_range"] <= 0.1 * (c["agent_steps"] - c["invalid_log"])
    # the targets are the env's expert actions at the recorded steps (replayed)
    env.reset(scenarios=torch.zeros(1, dtype=torch.int64))
    first = env.expert_actions()[0, :n]
    assert torch.equal(data.actions[:, 0], first)


def _one_driver_env(agent: dict):
    """A one-world env of a synthetic scene: ``agent`` controlled and a parked car, on a lane; goals
    ``continue`` and contacts ignored, so every step of the log is in play."""
    pack = synthetic_pack([{"agents": [agent, parked(0, 30)], "num_controlled": 1, "roads": lane()}], small_config())
    cfg = EnvConfig(max_agents=8, max_controlled=4, num_partners=7, num_roads=16, goal_behavior="continue",
                    collision_behavior="ignore", offroad_behavior="ignore")
    return DriveEnv(pack, 1, cfg)


def test_a_jump_in_the_log_is_out_of_range_and_masked():
    track = straight_track(0.0, 0.0, 0.0, 5.0)
    track[40] = track[40] + torch.tensor([0.0, 30.0])  # a 30 m sideways jump at log index 40
    env = _one_driver_env(driver(0, 0, 0.0, 5.0, (500.0, 0.0)) | {"pos": track})
    data = collect(env, _policy(env))
    assert data.counts["out_of_range"] >= 1
    assert not data.mask[0, 39]  # the step aiming at log index 40
    assert data.mask[0, :39].all()  # the straight log before it is followed within the tolerance
    assert TRACK_TOLERANCE < 30.0


def test_no_valid_target_is_refused_with_the_counts():
    # a controlled agent logged only at step 0: every target is an invalid log pose
    valid = [True] + [False] * 90
    env = _one_driver_env(driver(0, 0, 0.0, 5.0, (500.0, 0.0), valid=valid))
    data = collect(env, _policy(env))
    with pytest.raises(UserError) as e:
        check_targets(data, "--data X")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg == ("--data X: no valid BC target: 91 controlled agent-steps, 91 with an invalid log, 0 out of the "
                   "action range; use other scenarios or another --env setting")


def test_bc_loss_falls_and_the_checkpoint_evaluates(tmp_path):
    from train.checkpoint import load_policy
    from train.evaluate import EvalConfig, evaluate

    out = tmp_path / "bc.pt"
    files = sorted(SAMPLE_DIR.glob("*.json.xz"))
    train_dir, held_dir = tmp_path / "train", tmp_path / "held"
    for d, part in ((train_dir, files[:6]), (held_dir, files[6:])):
        d.mkdir()
        for f in part:
            (d / f.name).symlink_to(f)
    cfg = BCConfig(data=str(train_dir), eval_data=str(held_dir), out=str(out), epochs=3, device="cpu",
                   num_worlds=16, minibatch_worlds=4, policy=SMALL, learning_rate=3e-3, quiet=True, keep_best=True)
    res = train_bc(cfg, say=lambda *_: None)
    losses = [e["loss"] for e in res["epochs"]]
    held = [e["eval_nll"] for e in res["epochs"]]
    assert losses[-1] < losses[0] - 0.3 and held[-1] < held[0]
    assert all(0.0 <= e["eval_accuracy"] <= 1.0 for e in res["epochs"]) and res["epochs"][0]["steps_per_s"] > 0
    # the majority floor: the training targets' most common action and its share of the held-out targets
    from train.bc import make_bc_env

    env, _ = make_bc_env(cfg, str(train_dir), say=lambda *_: None)
    tr = collect(env, ActorCritic.for_env(env, SMALL))
    env, _ = make_bc_env(cfg, str(held_dir), say=lambda *_: None)
    he = collect(env, ActorCritic.for_env(env, SMALL))
    counts = torch.bincount(tr.actions[tr.mask], minlength=91)
    mode = int(counts.argmax())
    assert res["majority"] == (mode, pytest.approx(float((he.actions[he.mask] == mode).float().mean())))
    assert 0.0 < res["majority"][1] < 1.0
    policy, payload = load_policy(out)
    assert payload["extra"]["bc"]["majority_accuracy"] == res["majority"][1]
    # --keep-best: best.pt beside --out holds the epoch of the first lowest held-out NLL
    first_min = min(range(len(held)), key=lambda i: (held[i], i))
    _, best = load_policy(out.with_name("best.pt"))
    assert res["best"] == best["extra"]["best"] == {"entry": "eval_nll", "value": held[first_min], "epoch": first_min + 1}
    assert best["update"] == first_min + 1 and len(best["extra"]["bc"]["history"]) == first_min + 1
    assert payload["extra"]["best"] == res["best"]
    assert payload["extra"]["bc"]["counts"] == res["counts"] and payload["env_config"]["goal_behavior"] == "stop"
    assert payload["global_step"] == 3 * res["counts"]["valid"]
    ev = evaluate(EvalConfig(policy=(str(out),), data=str(held_dir), device="cpu", quiet=True))
    summary = ev["runs"][0]["summary"]
    assert 0.0 <= summary["goal_reached"].mean <= 1.0


def test_bc_keep_best_needs_eval_data(capsys, tmp_path):
    from train.bc import main

    assert main(["--keep-best", "--device", "cpu", "--out", str(tmp_path / "bc.pt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --keep-best chooses the epoch by the held-out NLL: give --eval-data DIR")
    assert not list(tmp_path.iterdir())


def test_bc_cli_bad_numbers_exit_2(capsys):
    from train.bc import main

    assert main(["--epochs", "0", "--device", "cpu", "--out", "/nonexistent/x.pt"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --epochs must be >= 1, got 0")


def _braking_driver(env):
    """A policy whose every sampled action is full braking, straight (joint index 0 * 13 + 6)."""
    policy = _policy(env)
    with torch.no_grad():
        for p in policy.parameters():
            p.zero_()
        policy.actor.bias[6] = 100.0
    return policy.eval()


def test_dagger_collection_drives_by_the_policy_and_labels_with_the_expert():
    env = _one_driver_env(driver(0, 0, 0.0, 5.0, (500.0, 0.0)))  # a straight log at 5 m/s
    policy = _policy(env)
    logged = collect(env, policy)
    braking = _braking_driver(env)
    torch.manual_seed(0)
    dagger = collect(env, policy, driver=braking, world_offset=7)
    assert torch.equal(dagger.world, logged.world + 7)
    # the agent brakes while its log drives on at 5 m/s: the expert's label is to speed up, straight
    accel = dagger.actions[0] // 13
    assert (accel[10:80] == 6).all() and (dagger.actions[0] % 13 == 6).all()
    assert (logged.actions[0, :80] // 13 == 3).all()  # on its log: hold the speed
    # the labels are the expert's actions from where the braking agent is (replayed here)
    env.reset(scenarios=torch.zeros(1, dtype=torch.int64))
    for t in range(12):
        assert int(env.expert_actions()[0, 0]) == int(dagger.actions[0, t])
        state, _ = env.advance(env.state, torch.full_like(env.expert_actions(), 6), episode_end=False)
        env.commit(state)
    # driven off its log, nothing is out of range: every valid next log pose is a target
    assert dagger.counts["out_of_range"] == 0 and dagger.counts["valid"] == dagger.counts["agent_steps"] - dagger.counts["invalid_log"]
    # with the expert's actions at every step the collection is the logged one
    again = collect(env, policy, driver=braking, expert_share=1.0)
    assert torch.equal(again.obs, logged.obs) and torch.equal(again.actions, logged.actions)


def test_dagger_argmax_collection_drives_the_most_likely_action_whatever_the_seed():
    """``decode="argmax"``: the round is driven by the policy's most likely action, so two
    collections under different global seeds are equal, and the first step's action is the argmax
    of the policy's logits; sampled collections differ between seeds (a fresh policy is spread)."""
    env = _one_driver_env(driver(0, 0, 0.0, 5.0, (500.0, 0.0)))
    policy = _policy(env).eval()
    runs = {}
    for decode in ("argmax", "sample"):
        for seed in (0, 1):
            torch.manual_seed(seed)
            runs[decode, seed] = collect(env, policy, driver=policy, decode=decode)
    assert torch.equal(runs["argmax", 0].obs, runs["argmax", 1].obs)
    assert not torch.equal(runs["sample", 0].obs, runs["sample", 1].obs)
    # a cold sampling temperature draws the most likely action too; a hot one spreads the draws
    torch.manual_seed(2)
    cold = collect(env, policy, driver=policy, temperature=1e-4)
    assert torch.equal(cold.obs, runs["argmax", 0].obs)
    torch.manual_seed(0)
    hot = collect(env, policy, driver=policy, temperature=50.0)
    assert not torch.equal(hot.obs, runs["sample", 0].obs)
    obs = env.reset(scenarios=torch.zeros(1, dtype=torch.int64))
    with torch.no_grad():
        logits = Actor(policy, env.num_worlds * env.num_slots, env.horizon, device="cpu").act(
            obs.reshape(env.num_worlds * env.num_slots, -1)).logits
    state, _ = env.advance(env.state, env.validate_actions(logits.argmax(-1).reshape(env.expert_actions().shape)),
                           episode_end=False)
    env.commit(state)
    second = policy.prepare_obs(env.observe(), torch.zeros(env.num_worlds, env.num_slots, dtype=torch.bool))
    torch.testing.assert_close(runs["argmax", 0].obs[0, 1], second.reshape(env.num_worlds * env.num_slots, -1)[0])
    with pytest.raises(ValueError, match="decode must be 'sample' or 'argmax'"):
        collect(env, policy, driver=policy, decode="mean")


def test_bc_dagger_rounds_grow_the_data_and_are_recorded(tmp_path):
    from train.checkpoint import load_checkpoint

    out = tmp_path / "bc.pt"
    cfg = BCConfig(data=str(SAMPLE_DIR), out=str(out), epochs=1, dagger_rounds=2, dagger_epochs=1, device="cpu",
                   num_worlds=16, minibatch_worlds=4, policy=SMALL, quiet=True)
    lines = []
    res = train_bc(cfg, say=lines.append)
    assert [e["round"] for e in res["epochs"]] == [0, 1, 2]
    rounds = res["dagger"]
    assert [r["round"] for r in rounds] == [1, 2] and all(r["valid"] > 0 for r in rounds)
    payload = load_checkpoint(out)
    assert payload["update"] == 3
    # each epoch trains on every target collected so far: the log's, then one more round each time
    assert payload["global_step"] == 3 * res["counts"]["valid"] + 2 * rounds[0]["valid"] + rounds[1]["valid"]
    assert payload["extra"]["bc"]["dagger"] == {"rounds": 2, "epochs": 1, "expert_share": 0.0, "decode": "sample",
                                                "temperature": 1.0,
                                                "collected": rounds}
    assert sum(line.startswith("dagger round") for line in lines) == 2


def test_annealed_lr_by_hand():
    from train.bc import annealed_lr

    assert annealed_lr(1e-3, 1, 0, 4, 2) == 1e-3  # the first step: the base rate
    assert annealed_lr(1e-3, 1, 2, 4, 2) == pytest.approx(1e-3 * (1 - 0.5 / 2))
    assert annealed_lr(1e-3, 2, 3, 4, 2) == pytest.approx(1e-3 * (1 - 1.75 / 2))  # the last step, above 0


@pytest.mark.parametrize("anneal", [False, True])
def test_bc_anneal_lr_reaches_its_last_step_through_a_dagger_round(tmp_path, anneal):
    from train.checkpoint import load_checkpoint

    out = tmp_path / "bc.pt"
    # 10 bundled scenes, 4 worlds per minibatch: the log's epoch has 3 minibatches, the DAgger epoch
    # (the log's 10 worlds and the round's 10) has 5; its last step is step 4 of epoch 2 of 2
    cfg = BCConfig(data=str(SAMPLE_DIR), out=str(out), epochs=1, dagger_rounds=1, dagger_epochs=1, device="cpu",
                   num_worlds=16, minibatch_worlds=4, policy=SMALL, quiet=True, learning_rate=2e-3, anneal_lr=anneal)
    train_bc(cfg, say=lambda *_: None)
    payload = load_checkpoint(out)
    last = [g["lr"] for g in payload["optimizer"]["param_groups"]]
    assert last == [pytest.approx(2e-3 * (1 - (1 + 4 / 5) / 2) if anneal else 2e-3)] * len(last)
    assert payload["config"]["anneal_lr"] is anneal and payload["config"]["learning_rate"] == 2e-3


@pytest.mark.parametrize("argv, message", [
    (["--dagger-rounds", "-1"], "--dagger-rounds must be >= 0, got -1"),
    (["--dagger-expert-share", "1.5"], "--dagger-expert-share must be in [0, 1], got 1.5"),
    (["--dagger-epochs", "0"], "--dagger-epochs must be >= 1, got 0"),
    (["--dagger-decode", "mean"], "--dagger-decode must be sample or argmax, got 'mean'"),
    (["--dagger-temperature", "0"], "--dagger-temperature must be > 0, got 0.0"),
    (["--dagger-decode", "argmax", "--dagger-temperature", "2"], "--dagger-temperature applies to sampled rounds"),
    (["--epochs", "2", "--dagger-rounds", "1", "--dagger-epochs", "3", "--average-epochs", "6"],
     "--average-epochs must be in [0, 5]"),
])
def test_bc_dagger_bad_numbers_exit_2(capsys, argv, message):
    from train.bc import main

    assert main(argv + ["--device", "cpu", "--out", "/nonexistent/x.pt"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")


def test_bc_average_epochs_is_the_mean_of_the_last_epochs_weights(tmp_path):
    """``--average-epochs 2`` over 2 epochs: ``out`` is the mean of the weights after epoch 1 (a
    1-epoch run of the same seed, which trains the same first epoch) and after epoch 2
    (``last.pt``), parameter by parameter; the held-out NLL of the average is reported."""
    from train.checkpoint import load_checkpoint

    def run(name, epochs, average):
        cfg = BCConfig(data=str(SAMPLE_DIR), eval_data=str(SAMPLE_DIR), out=str(tmp_path / name / "checkpoint.pt"),
                       epochs=epochs, average_epochs=average, device="cpu", num_worlds=16, minibatch_worlds=4,
                       policy=SMALL, quiet=True, seed=3)
        return train_bc(cfg, say=lambda *_: None)

    assert run("one", 1, 0)["average"] is None
    one = load_checkpoint(tmp_path / "one" / "checkpoint.pt")
    res = run("two", 2, 2)
    avg = load_checkpoint(tmp_path / "two" / "checkpoint.pt")
    last = load_checkpoint(tmp_path / "two" / "last.pt")
    assert res["average"]["last"] == str(tmp_path / "two" / "last.pt") and res["average"]["eval_nll"] > 0
    assert avg["extra"]["bc"]["averaged_epochs"] == 2 and last["extra"]["bc"]["averaged_epochs"] == 0
    moved = 0
    for name, value in avg["model"].items():
        if not value.is_floating_point():
            continue
        torch.testing.assert_close(value, (one["model"][name] + last["model"][name]) / 2)
        moved += int(not torch.equal(one["model"][name], last["model"][name]))
    assert moved > 0  # the second epoch changed the weights: the mean is not either end


def _rows(n, T, start, world):
    """A hand-made BCData of ``n`` rows whose values identify the row (``start`` + row index)."""
    from train.bc import BCData

    ids = torch.arange(start, start + n, dtype=torch.float32)
    return BCData(obs=ids[:, None, None].expand(n, T, 3).clone(), actions=ids.long()[:, None].expand(n, T).clone(),
                  removed=torch.zeros(n, T, dtype=torch.bool), terminal=torch.zeros(n, T, dtype=torch.bool),
                  mask=(ids.long()[:, None] % 2 == 0).expand(n, T).clone(), world=torch.full((n,), world),
                  counts={"valid": 7})


def test_bc_buffer_holds_the_rounds_in_order_without_growing_until_past_its_capacity():
    from train.bc import BCBuffer

    log, r1, r2 = _rows(4, 5, 0, 0), _rows(4, 5, 4, 1), _rows(3, 5, 8, 2)
    buf = BCBuffer(log, capacity=8)
    log.obs.zero_()  # copied in: the caller's tensors may change or go
    storage = buf.buf["obs"].untyped_storage().data_ptr()
    buf.append(r1)
    assert buf.buf["obs"].untyped_storage().data_ptr() == storage  # within capacity: no new allocation
    buf.append(r2)  # past capacity: still every row, in order
    view = buf.view()
    assert view.obs.shape == (11, 5, 3) and view.counts == {"valid": 7}
    assert torch.equal(view.obs[:, 0, 0], torch.arange(11, dtype=torch.float32))
    assert torch.equal(view.actions[:, 0], torch.arange(11))
    assert torch.equal(view.world, torch.tensor([0] * 4 + [1] * 4 + [2] * 3))
    assert int(view.mask.sum()) == 5 * 6
