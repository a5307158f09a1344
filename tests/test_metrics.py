"""Per-agent EMA metrics of DriveEnv (docs/design.md section 13, gpusim/metrics.py).

An independent oracle rebuilds every agent-episode from the public StepResult fields (reward,
loss_mask, info flags, terminal) and folds it into a Python EMA per (world, slot); the env's
device-side report must equal the oracle's population mean. Real sample pack and crafted packs.
"""

from __future__ import annotations

import math

import pytest
import torch

from gpusim.config import EnvConfig
from gpusim.data import ScenarioPack
from gpusim.env import DriveEnv
from gpusim.kernels.dynamics import NUM_STEER
from gpusim.metrics import METRIC_NAMES, EpisodeMetrics, episode_values, trial_metric_names

from synthetic import driver, parked, small_config, synthetic_pack

COAST = 3 * NUM_STEER + 6  # accel 0, steer 0


class Oracle:
    """Per-slot agent-episodes from StepResults, and their Python EMA / plain mean."""

    def __init__(self, W, C, alpha):
        self.alpha = alpha
        self.acc = torch.zeros(W, C, 5, dtype=torch.float64)  # return, length, goal, col, off
        self.ema: dict[tuple[int, int], list[float]] = {}
        self.episodes: list[list[float]] = []
        self.count: dict[tuple[int, int], int] = {}

    def step(self, r):
        a = self.acc
        a[..., 0] += r.reward.double()
        a[..., 1] += r.loss_mask.double()
        for i, key in ((2, "goal_reached"), (3, "collided"), (4, "offroad")):
            a[..., i] = torch.maximum(a[..., i], r.info[key].double())
        for w, c in torch.nonzero(r.terminal).tolist():
            ret, length, g, col, off = a[w, c].tolist()
            # red_light_violation: 0 (the sample scenes have no traffic signals; tests/test_signals_sim.py)
            ep = [ret, length, g, col, off, float(g > 0 and col == 0 and off == 0), 0.0, float(col > 0 or off > 0)]
            self.episodes.append(ep)
            old = self.ema.get((w, c))
            self.ema[(w, c)] = ep if old is None else [self.alpha * o + (1 - self.alpha) * e for o, e in zip(old, ep)]
            self.count[(w, c)] = self.count.get((w, c), 0) + 1
            a[w, c] = 0.0

    def report(self):
        if not self.ema:
            return {}
        rows = torch.tensor(list(self.ema.values()), dtype=torch.float64)
        out = dict(zip(METRIC_NAMES, rows.mean(0).tolist()))
        out["n"] = float(len(self.ema))
        return out


def assert_report_close(got, want):
    assert set(got) == set(want), (got, want)
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-5), k


def rollout(env, oracle, steps, gen, check_each=True):
    for _ in range(steps):
        a = torch.randint(0, env.num_actions, (env.num_worlds, env.num_slots), generator=gen)
        r = env.step(a)
        oracle.step(r)
        if check_each:
            assert_report_close(env.metrics(), oracle.report())


# ------------------------------------------------------------------ real sample scenarios
@pytest.fixture(scope="module")
def real_pack(sample_dir):
    files = sorted(sample_dir.glob("*.json*"))
    if not files:
        pytest.fail("data/womd_sample/ is empty: the bundled scenarios are missing")
    return ScenarioPack.from_json(files, EnvConfig().data_config())


@pytest.mark.parametrize("contact", ["ignore", "stop", "remove"])
def test_real_ema_matches_oracle_and_counts_slots(real_pack, contact):
    H, W = 8, 6
    config = EnvConfig(scenario_length=H, collision_behavior=contact, offroad_behavior=contact,
                       goal_radius=4.0, goal_behavior="stop")
    env = DriveEnv(real_pack, W, config, seed=3)
    env.reset()
    ever_active = env.state.slot_active.clone()
    oracle = Oracle(W, env.num_slots, config.log_ema_alpha)
    g = torch.Generator().manual_seed(7)
    # nothing before the first completion (no early truncation can end an episode this fast
    # unless STOP contacts do; the oracle says when)
    n_seen = []
    for ep in range(4):
        for t in range(H):
            r = env.step(torch.randint(0, env.num_actions, (W, env.num_slots), generator=g))
            oracle.step(r)
            m = env.metrics()
            assert_report_close(m, oracle.report())
            if not oracle.ema:
                assert m == {}
            # a second report with no new completion is identical (nothing resets)
            assert env.metrics() == m
            n_seen.append(m.get("n", 0.0))
        # n = slots that completed at least once; after an episode, every slot that was active
        assert m["n"] == float(len(oracle.ema)) == float(int(ever_active.sum()))
        ever_active |= env.state.slot_active
    assert n_seen == sorted(n_seen)  # never decreases
    assert max(oracle.count.values()) >= 2  # some slot blended several episodes
    # per-slot EMA really differs from the plain mean over agent-episodes here (weighting matters)
    plain = torch.tensor(oracle.episodes).mean(0)
    assert m["episode_length"] != pytest.approx(float(plain[1]), rel=1e-6) or \
        m["episode_return"] != pytest.approx(float(plain[0]), rel=1e-6)


def test_real_alpha_zero_gives_last_episode(real_pack):
    H, W = 6, 4
    env = DriveEnv(real_pack, W, EnvConfig(scenario_length=H, log_ema_alpha=0.0, goal_radius=4.0), seed=1)
    env.reset()
    g = torch.Generator().manual_seed(2)
    last: dict = {}
    oracle = Oracle(W, env.num_slots, 0.0)
    for _ in range(3 * H):
        r = env.step(torch.randint(0, env.num_actions, (W, env.num_slots), generator=g))
        oracle.step(r)
    # alpha = 0: each slot holds exactly its last episode
    for key, ep in oracle.ema.items():
        last[key] = ep
    rows = torch.tensor(list(last.values()), dtype=torch.float64).mean(0)
    m = env.metrics()
    for i, name in enumerate(METRIC_NAMES):
        assert m[name] == pytest.approx(float(rows[i]), rel=1e-5, abs=1e-6)
    assert m["n"] == len(last)


# ------------------------------------------------------------------ crafted scenarios
def cfg(**kw):
    base = dict(max_agents=8, max_controlled=4, num_partners=7, num_roads=16, scenario_length=30)
    base.update(kw)
    return EnvConfig(**base)


def coast(env):
    return torch.full((env.num_worlds, env.num_slots), COAST, dtype=torch.int64)


def crash_pack():
    """Controlled agent 0 drives at 5 m/s into a parked car 12 m ahead (and stays on it when it
    is not stopped); agents 1 and 2 drive far away (1 of 3 contact-stopped: no truncation)."""
    agents = [driver(0, 0, 0.0, 5.0, (200.0, 0.0)), driver(0, 40, 0.0, 5.0, (200.0, 40.0)),
              driver(0, 80, 0.0, 5.0, (200.0, 80.0)), parked(12, 0)]
    return synthetic_pack([{"agents": agents, "num_controlled": 3}], small_config())


def run_one_episode(behavior):
    env = DriveEnv(crash_pack(), 1, cfg(collision_behavior=behavior))
    env.reset()
    oracle = Oracle(1, env.num_slots, env.config.log_ema_alpha)
    contact, raw = [], []  # slot 0 in contact at a valid step (info) / raw box test after the step
    for t in range(env.horizon):
        r = env.step(coast(env))
        oracle.step(r)
        contact.append(bool(r.info["collided"][0, 0]))
        if t < env.horizon - 1:  # (the last step auto-resets the state)
            raw.append(bool(env.state.collided_now[0, 0]))
            assert env.metrics() == {}
    return env.metrics(), oracle, contact, raw


def test_stop_invalid_and_removed_steps_do_not_contribute():
    m_ign, _, contact_ign, _ = run_one_episode("ignore")
    hits = [t for t, c in enumerate(contact_ign) if c]
    assert len(hits) >= 3  # with IGNORE the car drives on through the parked one
    k = hits[0]
    # IGNORE: every contact step pays and every step counts
    assert m_ign["n"] == 3
    assert m_ign["episode_length"] == 30
    assert m_ign["episode_return"] == pytest.approx(-0.5 * len(hits) / 3)
    assert m_ign["collided"] == pytest.approx(1 / 3)
    for behavior in ("stop", "remove"):
        m, oracle, contact, raw = run_one_episode(behavior)
        assert [t for t, c in enumerate(contact) if c] == [k]  # one valid contact step
        if behavior == "stop":
            assert sum(raw) > 1  # still touching the parked car while stopped, but invalid
        # slot 0 counted only its k + 1 valid steps and one penalty
        assert oracle.episodes[0][:4] == [-0.5, k + 1, 0.0, 1.0]
        assert m["n"] == 3
        assert m["episode_length"] == pytest.approx((k + 1 + 30 + 30) / 3)
        assert m["episode_return"] == pytest.approx(-0.5 / 3)
        assert m["collided"] == pytest.approx(1 / 3)
        assert_report_close(m, oracle.report())


def test_every_slot_weighs_the_same_however_often_it_finishes():
    # Scenario 0 has 2 controlled agents (slot 1 reaches its goal), scenario 1 has 1: slot 1 of a
    # world finishes an episode only when its world drew scenario 0.
    s0 = {"agents": [driver(0, 0, 0.0, 5.0, (300.0, 0.0)), driver(0, 20, 0.0, 5.0, (10.3, 20.0))],
          "num_controlled": 2}
    s1 = {"agents": [driver(0, 0, 0.0, 3.0, (300.0, 0.0))], "num_controlled": 1}
    pack = synthetic_pack([s0, s1], small_config())
    env = DriveEnv(pack, 3, cfg(scenario_length=20, goal_behavior="stop"), seed=4)
    env.reset()
    oracle = Oracle(3, env.num_slots, env.config.log_ema_alpha)
    for _ in range(6 * 20):
        oracle.step(env.step(coast(env)))
    counts = sorted(oracle.count.values())
    assert counts[0] < counts[-1]  # slots finished different numbers of episodes
    m = env.metrics()
    assert_report_close(m, oracle.report())
    plain = torch.tensor(oracle.episodes).mean(0)
    assert m["goal_reached"] != pytest.approx(float(plain[2]))  # not the per-episode mean
    # "mean" kind: the plain per-episode mean since the last "mean" report, then it resets
    mean = env.metrics("mean")
    assert mean["n"] == len(oracle.episodes)
    assert mean["goal_reached"] == pytest.approx(float(plain[2]))
    assert env.metrics("mean") == {}
    assert env.metrics() == m  # the EMA is untouched by "mean" reports


# ------------------------------------------------------------------ EpisodeMetrics unit
def test_episode_metrics_many_short_vs_one_long():
    em = EpisodeMetrics(1, 2, alpha=0.707)
    done0 = torch.tensor([[True, False]])
    for _ in range(10):  # slot 0: ten short episodes, goal reached, length 5
        em.add(episode_values(torch.tensor([[1.0, 0.0]]), torch.tensor([[5, 0]]), torch.tensor([[True, False]]),
                              torch.zeros(1, 2, dtype=torch.bool), torch.zeros(1, 2, dtype=torch.bool)), done0)
    # slot 1: one long episode without goal, length 90
    em.add(episode_values(torch.tensor([[float("nan"), 0.0]]), torch.tensor([[0, 90]]),
                          torch.zeros(1, 2, dtype=torch.bool), torch.zeros(1, 2, dtype=torch.bool),
                          torch.zeros(1, 2, dtype=torch.bool)), torch.tensor([[False, True]]))
    m = em.report()
    assert m["n"] == 2 and m["goal_reached"] == pytest.approx(0.5) and m["score"] == pytest.approx(0.5)
    assert m["episode_length"] == pytest.approx(47.5)
    assert em.report() == m
    plain = em.report("mean")
    assert plain["n"] == 11 and plain["goal_reached"] == pytest.approx(10 / 11)


def test_trial_columns_and_derived_ada_delta():
    names = METRIC_NAMES + trial_metric_names(3)
    assert names[-6:] == ("trial_0_score", "trial_1_score", "trial_2_score", "trial_0_clean_score",
                          "trial_1_clean_score", "trial_2_clean_score")
    em = EpisodeMetrics(2, 1, alpha=0.5, names=names)
    z = torch.zeros(2, 1, dtype=torch.bool)
    trials = torch.tensor([[[0.0, 1.0, 1.0, 0.0, 0.0, 0.0]], [[1.0, 0.0, 1.0, 0.0, 0.0, 0.0]]])
    em.add(episode_values(torch.zeros(2, 1), torch.ones(2, 1, dtype=torch.int32), z, z, z, extra=trials),
           torch.ones(2, 1, dtype=torch.bool))
    m = em.report()
    assert m["trial_1_score"] == pytest.approx(0.5) and m["trial_2_score"] == pytest.approx(1.0)
    assert m["ada_delta_trial_1_minus_0"] == pytest.approx(0.0)
    assert m["ada_delta_trial_2_minus_0"] == pytest.approx(0.5)


def test_bad_input():
    em = EpisodeMetrics(2, 3)
    with pytest.raises(ValueError, match="values must be"):
        em.add(torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="finished must be"):
        em.add(torch.zeros(2, 3, len(METRIC_NAMES)), torch.zeros(3, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="kind"):
        em.report("median")
    with pytest.raises(ValueError, match="reserved"):
        EpisodeMetrics(1, 1, names=("score", "n"))
    with pytest.raises(ValueError, match="alpha"):
        EpisodeMetrics(1, 1, alpha=1.0)
    with pytest.raises(ValueError, match="extra"):
        episode_values(torch.zeros(2, 3), torch.zeros(2, 3), *(torch.zeros(2, 3, dtype=torch.bool),) * 3,
                       extra=torch.zeros(3, 2, 1))
    with pytest.raises(ValueError, match="k_trials"):
        trial_metric_names(0)
    assert not math.isnan(EpisodeMetrics(1, 1).report("mean").get("n", 0.0))
