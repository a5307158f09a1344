"""The partner task (``EnvConfig.partner_task = "crossing"``, gpusim/sim/partner_task.py) on the
bundled sample scenarios: the partner's type never shows before it changes the partner's motion,
it is kept across the trials of an episode and drawn again with the next one, the scripted
ceiling (told the type) beats the floor (log tracking) against non-yielders and equals it
against yielders, and bad options get one line."""

from __future__ import annotations

import math

import pytest
import torch

from gpusim import DriveEnv
from gpusim.config import DT, EnvConfig
from gpusim.sim import partner_task as pt
from gpusim.sim.episode import begin_episode
from train.baselines import make_baseline
from train.packs import load_pack

CFG = dict(max_controlled=1, goal_behavior="trial", k_trials=2)


@pytest.fixture(scope="module")
def pack(sample_dir):
    return load_pack(str(sample_dir), EnvConfig(**CFG))


def _env(pack, prob: float, W: int | None = None, **kw):
    """An env with world w on scenario w (every scenario once), the partner task on."""
    S = pack.num_scenarios
    env = DriveEnv(pack, num_worlds=W or S, config=EnvConfig(**CFG, partner_task="crossing", partner_type_prob=prob,
                                                             **kw), seed=0)
    env.reset(seed=0)
    if W is None:
        env.state = begin_episode(env.sim, torch.arange(S))
    return env


def test_partner_profile_hand_computed():
    tau = torch.tensor([-2.0, -pt.REVEAL_S, 0.0, 5.0])
    ny, ny_v = pt.partner_distance(tau, torch.ones(4, dtype=torch.int8))
    assert torch.allclose(ny, pt.APPROACH_SPEED * tau) and torch.allclose(ny_v, torch.full((4,), pt.APPROACH_SPEED))
    y, y_v = pt.partner_distance(tau, torch.zeros(4, dtype=torch.int8))
    v, a = pt.APPROACH_SPEED, pt.YIELD_DECEL
    stop = -v * pt.REVEAL_S + v * v / (2 * a)  # where the yielder stands: before the ego's path
    assert y[0] == ny[0] and y[1] == ny[1]  # the same until the reveal
    assert y[2] == pytest.approx(stop) and float(y_v[2]) == 0.0 and stop < -(pt.PARTNER_LENGTH / 2)
    # it crosses P when GO_ACCEL has carried it over the stopping distance after GO_S
    t_cross = pt.GO_S + math.sqrt(2 * -stop / pt.GO_ACCEL)
    s_cross, _ = pt.partner_distance(torch.tensor([t_cross]), torch.zeros(1, dtype=torch.int8))
    assert abs(float(s_cross)) < 1e-4 and t_cross > 1.0


def test_type_hidden_until_the_partner_moves_differently(pack):
    yielders, crossers = _env(pack, 0.0), _env(pack, 1.0)
    assert int(yielders.state.partner_type.sum()) == 0 and bool((crossers.state.partner_type == 1).all())
    has, t_c = pt.conflict_log_step(yielders.sim, yielders.state)
    assert int(has.sum()) >= 3
    reveal = t_c - round(pt.REVEAL_S / DT)  # the first log step where the two types differ
    a = yielders.observe()
    assert torch.equal(a, crossers.observe())
    differ_seen = torch.zeros_like(has)
    for t in range(1, int(t_c[has].max()) + 2):
        ra, rb = yielders.step(yielders.expert_actions()), crossers.step(crossers.expert_actions())
        same = (ra.obs == rb.obs).flatten(1).all(dim=1)
        before = (t <= reveal) | ~has
        assert bool(same[before].all()), f"step {t}: observations differ before the reveal"
        differ_seen |= ~same
    assert bool(differ_seen[has].all())  # and after it the ego does see the difference


def test_type_kept_across_trials_and_drawn_per_episode(pack):
    env = _env(pack, 0.5, W=32)
    first = env.state.partner_type.clone()
    assert 0 < int(first.sum()) < 32  # both types drawn
    saw_trial_1 = False
    for _ in range(env.horizon - 1):
        env.step(env.expert_actions())
        saw_trial_1 |= bool((env.state.trial_count == 1).any())
        assert torch.equal(env.state.partner_type, first)
    assert saw_trial_1
    env.step(env.expert_actions())  # step H: the next episode draws again
    assert not torch.equal(env.state.partner_type, first)


def _outcome(pack, prob: float, name: str):
    """Per world: (collided, clean score of trial 0) of a scripted ego over one episode."""
    env = _env(pack, prob)
    ego = make_baseline(name)
    collided = torch.zeros(env.num_worlds, dtype=torch.bool)
    for _ in range(env.horizon - 1):  # trial 0 is over; step H would start the next episode
        env.step(ego(env))
        collided |= env.state.collided_now[:, 0] & env.state.controlled[:, 0]
    return collided, env.state.trial_clean[:, 0, 0]


def test_ceiling_beats_floor_against_non_yielders_only(pack):
    env = _env(pack, 1.0)
    has, _ = pt.conflict_log_step(env.sim, env.state)
    floor_hit, floor_clean = _outcome(pack, 1.0, "partner_floor")
    ceil_hit, ceil_clean = _outcome(pack, 1.0, "partner_ceiling")
    assert bool(floor_hit[has].all())  # log tracking meets every non-yielder at its place
    assert not bool(ceil_hit.any())  # told the type, it lets them pass
    assert float(ceil_clean.float().mean()) >= float(floor_clean.float().mean()) + 0.2
    # against yielders the best response is the log: the two references drive alike, without contact
    y_floor_hit, y_floor = _outcome(pack, 0.0, "partner_floor")
    y_ceil_hit, y_ceil = _outcome(pack, 0.0, "partner_ceiling")
    assert torch.equal(y_floor, y_ceil) and not bool(y_floor_hit[has].any())
    # the hedge (the non-yielder's answer whatever the type) meets the yielders instead
    hedge = make_baseline("partner_ceiling")
    env = _env(pack, 0.0)
    hit = torch.zeros(env.num_worlds, dtype=torch.bool)
    for _ in range(env.horizon):
        true = env.state.partner_type
        env.state.partner_type = torch.ones_like(true)
        act = hedge(env)
        env.state.partner_type = true
        env.step(act)
        hit |= env.state.collided_now[:, 0]
    assert bool(hit[has].all())


def test_partner_task_errors_are_one_line(sample_dir, capsys):
    for kw, text in ((dict(partner_task="braker"), "partner_task must be one of none, crossing"),
                     (dict(partner_task="crossing", partner_type_prob=1.5), "partner_type_prob must be in [0, 1]"),
                     (dict(partner_task="crossing", max_controlled=8), "--env.max-controlled 1"),
                     (dict(partner_task="crossing", random_start_steps=5), "drop --env.random-start-steps")):
        with pytest.raises(ValueError) as e:
            EnvConfig(**{**CFG, **kw})
        assert text in str(e.value) and "\n" not in str(e.value)
    from train.evaluate import main

    assert main(["--policy", "partner_floor", "--partner-type-prob", "0.3", "--data", str(sample_dir)]) == 2
    err = capsys.readouterr().err
    assert "--partner-type-prob needs the partner task" in err and "\n" not in err.strip()


def test_ada_delta_on_the_clean_score_hand_computed():
    """``ada_delta_clean_trial_1_minus_0`` is the mean of the per-agent clean-score differences
    (here a goal kept but a collision avoided in trial 1 counts, the goal-only figure does not)."""
    from train.eval.report import summarise

    goal = torch.ones(4)
    c0, c1 = torch.tensor([0.0, 0.0, 1.0, 1.0]), torch.tensor([1.0, 1.0, 1.0, 0.0])
    agents = {"trial_0_score": goal, "trial_1_score": goal, "trial_0_clean_score": c0, "trial_1_clean_score": c1,
              "scenario": torch.arange(4), **{k: goal for k in ("goal_reached", "collided", "offroad", "score",
                                                                   "episode_return")}}
    s = summarise(agents)
    assert s["ada_delta_clean_trial_1_minus_0"].mean == pytest.approx(0.25)  # (1 + 1 + 0 - 1) / 4
    assert s["ada_delta_trial_1_minus_0"].mean == 0.0


def test_training_reports_derive_ada_delta_on_the_clean_score():
    """The env's reports (``metrics.jsonl``) derive ``ada_delta_clean_trial_k_minus_0`` from the
    clean-score columns: two agents, goals in both trials, one collision in trial 0 only."""
    from gpusim.metrics import METRIC_NAMES, EpisodeMetrics, episode_values, trial_metric_names

    names = METRIC_NAMES + trial_metric_names(2)
    em = EpisodeMetrics(2, 1, alpha=0.5, names=names)
    z = torch.zeros(2, 1, dtype=torch.bool)
    trials = torch.tensor([[[1.0, 1.0, 0.0, 1.0]], [[1.0, 1.0, 1.0, 1.0]]])  # goal 0, goal 1, clean 0, clean 1
    em.add(episode_values(torch.zeros(2, 1), torch.ones(2, 1, dtype=torch.int32), z, z, z, extra=trials),
           torch.ones(2, 1, dtype=torch.bool))
    m = em.report()
    assert m["ada_delta_trial_1_minus_0"] == pytest.approx(0.0)
    assert m["ada_delta_clean_trial_1_minus_0"] == pytest.approx(0.5)
