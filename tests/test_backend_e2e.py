"""End to end: a DriveEnv rollout on the real sample scenarios gives the same rewards, flags, masks
and metrics, and observations within float32 tolerance in the same slot order, with every per-step
computation run by the Triton kernels (interpreter on CPU) as with the torch reference.

Cost: the Triton interpreter runs ~0.5 s per env step here, so the default run covers every goal
behaviour and every contact behaviour once (three combinations, ~40 s); the remaining combinations
of the 3 x 3 product are marked ``slow``.
"""

from __future__ import annotations

import collections
import itertools

import pytest
import torch

from gpusim.backend import interpreting, use_backend
from gpusim.config import EnvConfig
from gpusim.data import ScenarioPack
from gpusim.env import DriveEnv
from profiling.launches import count_launches
from synthetic import KERNEL_DEVICE, torch_reference_config

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() or interpreting()),
                                reason="no CUDA and no Triton interpreter")

# Small sizes keep the interpreter affordable; late start (log step 76) so goals are reachable in
# a 10-step episode; generous boxes so collisions and offroad happen in 20 steps. W = 2, seed 2
# draws scenarios with goals, collisions and offroad events for every combination below.
BASE = dict(max_agents=24, max_controlled=4, num_partners=15, num_roads=32, init_steps=76, scenario_length=10,
            goal_radius=4.0, collision_box_scale=1.8, offroad_box_scale=1.5)
W, SEED, STEPS = 2, 2, 20
GRID_EDGE_K = 16  # road edges per grid cell for the offroad test (default 32)
FAST = [("respawn", "ignore", "stop"), ("new_goal", "stop", "remove"), ("stop", "remove", "ignore")]
SLOW = [(g, c, c) for g, c in itertools.product(("respawn", "new_goal", "stop"), ("ignore", "stop", "remove"))]
#: kernels every step must launch under the Triton backend (hit_by only with collision REMOVE)
STEP_KERNELS = {"_bicycle_step_kernel", "_replay_kernel", "_collisions_kernel", "_offroad_kernel", "_events_kernel",
                "_observations_kernel", "_ema_update_kernel"}




@pytest.fixture(scope="module")
def pack(sample_dir):
    files = sorted(sample_dir.glob("*.json*"))
    if not files:
        pytest.fail("data/womd_sample/ is empty: the bundled scenarios are missing")
    return ScenarioPack.from_json(files, EnvConfig(**BASE).data_config(grid_edge_k=GRID_EDGE_K))


def mixed_actions(env, g):
    """Expert actions (they reach goals) with half the slots replaced by random actions (drawn on
    the CPU with ``g``, then moved to the env's device)."""
    a = env.expert_actions()
    rnd = torch.randint(0, env.num_actions, a.shape, generator=g).to(a.device)
    return torch.where((torch.rand(a.shape, generator=g) < 0.5).to(a.device), rnd, a)


def assert_obs_close(got, want, layout, tol=1e-5):
    """Observations equal elementwise within ``tol``, partner and road slots in the *same order*.

    Sort distances that tie in real arithmetic (several road polylines whose nearest point is one
    shared vertex) are bit-identical in each backend (endpoint distances use the exact vertex
    coordinates), so the index bits of the sort key order them identically in both backends,
    although the two backends' agent positions differ in their last bits. Valid flags (the last
    feature of each slot) must match exactly."""
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    for sl, n, d in ((layout.partners, layout.num_partners, layout.partner_dim),
                     (layout.roads, layout.num_roads, layout.road_dim)):
        assert torch.equal(got[..., sl].reshape(-1, n, d)[..., -1], want[..., sl].reshape(-1, n, d)[..., -1])


FIELDS = ("reward", "terminal", "truncation", "loss_mask", "slot_active", "removed", "stopped", "trial_ended")


def compare_rollout(pack, config, steps=STEPS, seed=SEED, num_worlds=W):
    # both envs on KERNEL_DEVICE (the same env random numbers); the reference forces the torch backend
    env_r = DriveEnv(pack, num_worlds, torch_reference_config(config), seed=seed, device=KERNEL_DEVICE)
    env_t = DriveEnv(pack, num_worlds, config, seed=seed, device=KERNEL_DEVICE)
    with use_backend("torch"):
        o_r = env_r.reset()
    with use_backend("triton"), count_launches() as launches:
        o_t = env_t.reset()
    assert_obs_close(o_t, o_r, env_r.obs_layout)
    g = torch.Generator().manual_seed(seed)
    seen = collections.Counter()
    per_step = []
    for t in range(steps):
        with use_backend("torch"):
            a = mixed_actions(env_r, g)  # the same actions drive both envs
            r_r = env_r.step(a)
        with use_backend("triton"), count_launches() as launches:
            r_t = env_t.step(a)
        per_step.append(dict(launches))
        for name in FIELDS:
            assert torch.equal(getattr(r_t, name), getattr(r_r, name)), (t, name)
        for key in ("goal_reached", "collided", "offroad", "truncated", "episode_end"):
            assert torch.equal(r_t.info[key], r_r.info[key]), (t, key)
        assert_obs_close(r_t.obs, r_r.obs, env_r.obs_layout)
        torch.testing.assert_close(env_t.state.pos, env_r.state.pos, rtol=1e-5, atol=1e-4)
        for key in ("goal_reached", "collided", "offroad"):
            seen[key] += int(r_r.info[key].sum())
        seen["terminal"] += int(r_r.terminal.sum())
        seen["removed"] += int(r_r.removed.sum())
    with use_backend("torch"):
        m_r = env_r.metrics()
    m_t = env_t.metrics()
    assert m_r.keys() == m_t.keys() and m_r["n"] == m_t["n"] > 0
    for k in m_r:
        assert m_t[k] == pytest.approx(m_r[k], rel=1e-5, abs=1e-6), k
    return seen, per_step


def check(pack, goal, col, off):
    config = EnvConfig(**BASE, goal_behavior=goal, collision_behavior=col, offroad_behavior=off)
    seen, per_step = compare_rollout(pack, config)
    # the comparison is not vacuous: goals, contacts and episode ends happened
    assert seen["goal_reached"] > 0 and seen["collided"] > 0 and seen["terminal"] > 0, seen
    if col == "remove" or (off == "remove" and seen["offroad"] > 0):
        assert seen["removed"] > 0, seen
    # every per-step computation ran as a Triton kernel, once per step
    want = STEP_KERNELS | ({"_hit_by_kernel"} if col == "remove" else set())
    want |= {"respawn": {"_reset_agents_kernel"}, "new_goal": {"_new_goal_kernel"}}.get(goal, set())
    for launches in per_step:
        assert want <= set(launches), want - set(launches)
        # the reset kernel also builds the next episode's state on the step that completes it
        assert all(launches[k] == 1 for k in want if k != "_reset_agents_kernel"), launches


@pytest.mark.parametrize("goal,col,off", FAST)
def test_triton_matches_torch(pack, goal, col, off):
    check(pack, goal, col, off)


@pytest.mark.slow
@pytest.mark.parametrize("goal,col,off", [c for c in SLOW if c not in FAST])
def test_triton_matches_torch_all_combinations(pack, goal, col, off):
    check(pack, goal, col, off)


@pytest.mark.slow
def test_triton_matches_torch_default_sizes(sample_dir):
    """Default EnvConfig sizes (64 agents, 32 slots, 31 partners, 128 roads): block sizes differ."""
    files = sorted(sample_dir.glob("*.json*"))
    config = EnvConfig(scenario_length=4, collision_behavior="remove", offroad_behavior="stop",
                       goal_behavior="respawn")
    big = ScenarioPack.from_json(files, config.data_config())
    compare_rollout(big, config, steps=6, num_worlds=1)
