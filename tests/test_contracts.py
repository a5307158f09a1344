"""Contract tests written against the public DriveEnv API (reset / step / metrics / StepResult,
``obs_layout``) on crafted scenes, so they hold whatever the internals look like.

Each was checked by breaking the code once and watching it fail:

* the expert replay clock restarts at every trial (breaking it: log index ``init_steps + step``
  instead of the trial-relative ``init_steps + (step - trial_start)``);
* agents that are not in play (stopped at their goal) contribute no contact metrics (breaking it:
  ``controlled & collided`` instead of ``in_play & collided`` in the episode accumulators);
* a world is truncated when *exactly* ``stop_truncate_fraction`` of its controlled agents are
  contact-stopped (breaking it: ``n_stopped > fraction * n``). In the current torch reference the
  comparison is ``n_stopped >= fraction * n - 1e-6``; there ``>=`` -> ``>`` alone is an equivalent
  change (integer counts), so the test was checked against ``>`` without the tolerance.
"""

from __future__ import annotations

import torch

from gpusim.config import WOMD_STEPS, EnvConfig, RoadType
from gpusim.env import DriveEnv
from synthetic import driver, lane, parked, small_config, synthetic_pack

#: Discrete action "acceleration 0, steering 0": index accel_idx * 13 + steer_idx with the middle
#: of 7 accelerations (-4..4 m/s^2) and of 13 steering angles (-1..1 rad).
KEEP_SPEED = 3 * 13 + 6


def _cfg(**kw) -> EnvConfig:
    base = dict(max_agents=8, max_controlled=4, num_partners=7, num_roads=16)
    base.update(kw)
    return EnvConfig(**base)


def _keep_speed(env) -> torch.Tensor:
    return torch.full((env.num_worlds, env.num_slots), KEEP_SPEED, dtype=torch.int64)


def _standing(x, y, goal):
    """A controlled agent standing still (speed 0) whose goal is ``goal`` (far: never reached)."""
    return dict(pos=(x, y), heading=0.0, vel=torch.zeros(WOMD_STEPS, 2), goal=goal)


def test_expert_replay_clock_restarts_at_every_trial():
    """Trial k replays the log from ``init_steps`` again: with the same actions, every partner
    feature at trial-relative step j equals trial 0's (a moving expert makes a clock that kept
    running visible: it would be L steps further along its log)."""
    L = 10
    pack = synthetic_pack([{"agents": [_standing(0.0, 0.0, (150.0, 0.0)), driver(-20.0, 4.0, 0.0, 8.0, (300.0, 4.0)),
                                       parked(10.0, -6.0)],
                            "num_controlled": 1, "roads": lane()}], small_config(init_steps=5))
    env = DriveEnv(pack, 1, _cfg(goal_behavior="trial", k_trials=3, scenario_length=L, init_steps=5))
    lay = env.obs_layout
    obs = [env.reset(scenarios=torch.tensor([0])).clone()]
    for t in range(3 * L):
        res = env.step(_keep_speed(env))
        assert bool(res.truncation[0, 0]) == (t % L == L - 1 and t < 3 * L - 1), t
        obs.append(res.obs.clone())
    partners = torch.stack(obs[:3 * L])[:, 0, 0, lay.partners].reshape(3, L, -1)
    assert (partners[0, 1:] != partners[0, :-1]).any(), "the expert must move for the test to mean anything"
    torch.testing.assert_close(partners[1], partners[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(partners[2], partners[0], atol=1e-5, rtol=0)


def test_agents_not_in_play_contribute_no_contact_metrics():
    """An agent stopped at its goal (STOP) is hit later by a log-replayed expert: its episode
    counts the goal and no collision (score 1)."""
    pack = synthetic_pack([{"agents": [driver(0.0, 0.0, 0.0, 5.0, (10.3, 0.0)), driver(-60.0, 0.0, 0.0, 12.0,
                                                                                        (400.0, 0.0))],
                            "num_controlled": 1, "roads": lane()}], small_config())
    env = DriveEnv(pack, 1, _cfg(goal_behavior="stop", scenario_length=70))
    env.reset(scenarios=torch.tensor([0]))
    hit_while_stopped = False
    for _ in range(env.horizon):
        res = env.step(_keep_speed(env))
        hit_while_stopped |= bool(res.stopped[0, 0]) and bool(env_collided_raw(env, res))
    m = env.metrics(kind="mean")
    assert m["n"] == 1 and m["goal_reached"] == 1.0
    assert m["collided"] == 0.0 and m["score"] == 1.0, m
    assert hit_while_stopped, "the expert must drive through the stopped agent for the test to mean anything"


def env_collided_raw(env, res) -> bool:
    """Whether the ego's observation reports a contact at this step (ego feature ``collided``),
    which the env sets from the raw overlap whether or not the agent is in play."""
    lay = env.obs_layout
    names = [n if isinstance(n, str) else n[0] for n in lay.ego_features]
    return bool(res.obs[0, 0, lay.ego][names.index("collided")] > 0.5)


def _three_cars(frac: float) -> DriveEnv:
    """One world, three controlled cars keeping their speed; only car 0 runs into a parked expert
    (at about step 12); car 0's contact stops it (collision_behavior=stop)."""
    pack = synthetic_pack([{"agents": [driver(0.0, 0.0, 0.0, 10.0, (200.0, 0.0)),
                                       driver(0.0, 30.0, 0.0, 5.0, (200.0, 30.0)),
                                       driver(0.0, 60.0, 0.0, 5.0, (200.0, 60.0)),
                                       parked(20.0, 0.0)],
                            "num_controlled": 3,
                            "roads": lane() + lane(y=30.0) + lane(y=60.0, rtype=RoadType.LANE)}],
                          small_config(grid_margin=40.0))
    env = DriveEnv(pack, 1, _cfg(goal_behavior="stop", collision_behavior="stop", scenario_length=40,
                                 stop_truncate_fraction=frac))
    env.reset(scenarios=torch.tensor([0]))
    return env


def _first_end(env) -> tuple[int | None, int | None]:
    """(step of car 0's contact stop, step at which the world's episode ended) in one episode."""
    stop_t = end_t = None
    for t in range(env.horizon):
        res = env.step(_keep_speed(env))
        if stop_t is None and bool(res.stopped[0, 0]):
            stop_t = t
        if end_t is None and bool(res.terminal[0, :3].all()):
            end_t = t
            break
    return stop_t, end_t


def test_stop_truncate_fraction_boundary_is_inclusive():
    """1 of 3 cars contact-stopped: fraction 1/3 (not a finite binary fraction) truncates the world
    at that step; 0.34 and 0.5 do not (it runs to the horizon)."""
    stop_t, end_t = _first_end(_three_cars(1.0 / 3.0))
    assert stop_t is not None and 0 < stop_t < 39
    assert end_t == stop_t
    for frac in (0.34, 0.5):
        s, e = _first_end(_three_cars(frac))
        assert s == stop_t and e == 39, (frac, s, e)
