"""The memory task leaves out an agent with too few candidate places instead of refusing its
scenario: built from a bundled scene whose controlled agent in slot 1 is moved off the lane network
(1 km east, the whole log and its goal: no lane point within reach, as an agent that starts in a
parking lot). That agent drives to its logged goal (every candidate shows it), the other agents'
draws are bit for bit those of the untouched scene, the evaluator does not count it, a warning
names the scene and the count, and a pack where no agent can play the task is refused."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from gpusim import DriveEnv
from gpusim.config import EnvConfig
from gpusim.sim.candidates import task_pool
from train.packs import load_pack

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
CFG = dict(max_controlled=8, goal_behavior="trial", k_trials=2, reward_collision=0.0, reward_offroad=0.0,
           goal_candidates=2)
SCENE, SLOT, SHIFT = "db4edc9bd0c9d18c", 1, 1000.0  # a bundled scene with 8 controlled agents


@pytest.fixture(scope="module")
def packs(sample_dir):
    """(the untouched one-scene pack, the same with slot SLOT moved SHIFT m east)."""
    full = load_pack(str(sample_dir), EnvConfig(**CFG))
    one = full.select([full.scenario_ids.index(SCENE)])
    pos, goal = one.traj_pos.clone(), one.agent_goal.clone()
    pos[0, SLOT, :, 0] += SHIFT * one.traj_valid[0, SLOT]  # invalid steps stay 0
    goal[0, SLOT, 0] += SHIFT
    return one, dataclasses.replace(one, traj_pos=pos, agent_goal=goal)


def _reset(pack, W=4, seed=7):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # counts every time it is said: once per pack
        env = DriveEnv(pack, num_worlds=W, config=EnvConfig(**CFG), seed=seed)
        env.reset(seed=seed)
    return env, [str(w.message) for w in caught if "candidate places" in str(w.message)]


def test_the_agent_is_left_out_and_the_others_draw_as_before(packs):
    one, moved = packs
    assert int(one.num_controlled[0]) == 8
    _, count = task_pool(one, EnvConfig(**CFG))
    assert bool((count[0, :8] >= 2).all())  # untouched: every agent plays
    ref, said = _reset(one)
    assert said == []
    env, said = _reset(moved)
    assert len(said) == 1 and f"1 of 8 controlled agents" in said[0] and f"{SCENE} (1)" in said[0]
    st, rs = env.state, ref.state
    others = torch.ones(8, dtype=torch.bool)
    others[SLOT] = False
    assert torch.equal(st.goal_cand[:, others], rs.goal_cand[:, others])
    assert torch.equal(st.cand_true[:, others], rs.cand_true[:, others])
    assert torch.equal(st.goal[:, :8][:, others], rs.goal[:, :8][:, others])
    logged = moved.agent_goal[0, SLOT]  # every candidate of the agent left out is its logged goal
    assert torch.equal(st.goal_cand[:, SLOT], logged.expand(4, 2, 2)) and torch.equal(st.goal[:, SLOT], logged.expand(4, 2))
    from gpusim.sim.candidates import task_slots
    assert task_slots(env.sim, st).tolist() == [others.tolist()] * 4
    assert bool(task_slots(ref.sim, rs).all())


def test_evaluator_does_not_count_the_agent(packs, tmp_path):
    from train.evaluate import EvalConfig, evaluate

    one, moved = packs
    runs = {}
    for name, pack in (("one", one), ("moved", moved)):
        path = pack.save(tmp_path / f"{name}.pt")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = evaluate(EvalConfig(policy=(str(ROOT / "policies" / "memory_probe.pt"),), data=str(path),
                                      episodes_per_scenario=2, num_threads=1, device="cpu"))
        runs[name] = res["runs"][0]
        notes = [n for n in res["notes"] if "candidate places" in n]
        assert notes == ([] if name == "one" else [f"note: goal_candidates=2: 1 of 8 controlled agents have fewer "
                                                   f"than 2 candidate places and are left out of the memory task (every "
                                                   f"candidate shows their logged goal; the evaluator does not count "
                                                   f"them); scenario (agents): {SCENE} (1)"])
    assert len(runs["one"]["records"]["slot"]) == 2 * 8
    slots = runs["moved"]["records"]["slot"]
    assert len(slots) == 2 * 7 and SLOT not in slots.tolist()
    assert runs["moved"]["summary"]["ada_delta_trial_1_minus_0"].n == 2 * 7


def test_no_agent_with_enough_places_is_refused(packs):
    one, _ = packs
    with pytest.raises(ValueError, match=r"goal_candidates=40: none of the 8 controlled agents of the 1 scenario\(s\) "
                                         r"has 40 candidate places"):
        task_pool(one, EnvConfig(**{**CFG, "goal_candidates": 40}))
