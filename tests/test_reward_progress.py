"""``EnvConfig.reward_progress``: the goal distance closed per step, paid until the first arrival
(gpusim/sim/rewards.py), on the bundled WOMD scenes with the log's own actions (inverse dynamics)."""

import pytest
import torch

from gpusim.config import EnvConfig
from gpusim.data import ScenarioPack
from gpusim.env import DriveEnv


@pytest.fixture(scope="module")
def pack(sample_dir):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield ScenarioPack.from_json(sorted(sample_dir.glob("*.json*"))[:4], EnvConfig().data_config())
    torch.set_num_threads(n)


def _expert_episode(pack, **kw):
    """Per-step rewards [T, W, C], in-play masks, goal distances before and after each step
    [T, W, C] and the goal-reached flags before each step, under the log's own actions."""
    cfg = EnvConfig(**kw)
    env = DriveEnv(pack, num_worlds=pack.num_scenarios, config=cfg, seed=0)
    env.reset(scenarios=torch.arange(pack.num_scenarios))
    C = env.num_slots
    out = {k: [] for k in ("reward", "in_play", "before", "after", "reached")}
    for _ in range(env.horizon - 1):
        goal = env.state.goal[:, :C].clone()
        out["before"].append(torch.linalg.vector_norm(goal - env.state.pos[:, :C], dim=-1))
        out["reached"].append(env.state.goal_reached[:, :C].clone())
        res = env.step(env.expert_actions())
        out["reward"].append(res.reward.clone())
        out["in_play"].append(res.loss_mask.clone())
        out["after"].append(torch.linalg.vector_norm(goal - env.state.pos[:, :C], dim=-1))
    return {k: torch.stack(v) for k, v in out.items()}


@pytest.mark.parametrize("behavior", ["stop", "continue"])
def test_progress_is_the_distance_closed_until_arrival(pack, behavior):
    base = _expert_episode(pack, goal_behavior=behavior)
    paid = _expert_episode(pack, goal_behavior=behavior, reward_progress=0.25)
    extra = (paid["reward"] - base["reward"]) / 0.25
    owed = torch.where(~paid["reached"], paid["before"] - paid["after"], torch.zeros_like(extra))
    # where the slot was not in play nothing is added; elsewhere the closed distance, to float32 rounding
    torch.testing.assert_close(extra * paid["in_play"], owed * paid["in_play"], atol=2e-4, rtol=1e-4)
    assert (extra[~paid["in_play"]] == 0).all()
    # the expert drives toward its goal: the term is mostly positive and adds up to metres per agent
    total = (extra * paid["in_play"]).sum(0)
    assert float(total.sum()) > 50.0
    # after its first arrival a slot gets no progress, whatever it does (continue: it drives on)
    after_arrival = paid["reached"] & paid["in_play"]
    if behavior == "continue":
        assert after_arrival.any()
    assert (extra[after_arrival] == 0).all()


def test_off_by_default_changes_nothing(pack):
    a = _expert_episode(pack)
    b = _expert_episode(pack, reward_progress=0.0)
    assert torch.equal(a["reward"], b["reward"])


def test_non_finite_weight_is_refused():
    with pytest.raises(ValueError, match="EnvConfig.reward_progress must be a finite number"):
        EnvConfig(reward_progress=float("nan"))
