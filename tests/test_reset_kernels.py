"""Reset writes (``gpusim.kernels.reset``) and NEW_GOAL sampling (``gpusim.kernels.new_goal``):
Triton kernels (interpreter on CPU) against the torch references on odd sizes with garbage-filled
outputs, the references against brute-force Python loops on the real sample scenarios, the rule's
edge cases, argument errors, and the kernels' use by ``DriveEnv``."""

from __future__ import annotations

import collections
import math

import pytest
import torch

from gpusim.backend import interpreting, use_backend
from gpusim.config import EnvConfig, RoadType
from gpusim.data import ScenarioPack
from gpusim.env import DriveEnv
from gpusim.sim.goals import NEW_GOAL_FALLBACK, NEW_GOAL_MAX_DIST, NEW_GOAL_MIN_AHEAD
from gpusim.kernels import new_goal as ng_mod
from gpusim.kernels import reset as reset_mod
from gpusim.kernels.new_goal import (
    LANE_TYPE,
    new_goal_compact,
    new_goal,
    new_goal_reference,
)
from gpusim.kernels.reset import reset_agents, reset_agents_reference
from profiling.launches import count_launches
from synthetic import KERNEL_DEVICE, backend_device, to_cpu, to_kernel_device, torch_reference_config

needs_triton = pytest.mark.skipif(not (torch.cuda.is_available() or interpreting()),
                                  reason="no CUDA and no Triton interpreter")
SMALL = dict(max_agents=24, max_controlled=4, num_partners=7, num_roads=32)


@pytest.fixture(scope="module")
def real_pack(sample_dir):
    files = sorted(sample_dir.glob("*.json*"))
    if not files:
        pytest.fail("data/womd_sample/ is empty: the bundled scenarios are missing")
    return ScenarioPack.from_json(files, EnvConfig(**SMALL).data_config())


def garbage_outputs(monkeypatch, module):
    """Make ``module``'s launcher allocate NaN / 77-filled outputs; returns the allocated list."""
    made = []

    def fake(shape, dtype, device):
        t = torch.full(shape, float("nan") if dtype.is_floating_point else 77, dtype=dtype, device=device)
        made.append(t)
        return t

    monkeypatch.setattr(module, "_empty", fake)
    return made


def assert_all_written(made):
    for t in made:
        if t.dtype.is_floating_point:
            assert not torch.isnan(t).any(), "kernel left an output element unwritten"
        else:
            assert ((t == 0) | (t == 1)).all(), "kernel left a flag unwritten"


def make_mask(kind, W, A, g):
    if kind == "none":
        return None
    if kind == "empty":
        return torch.zeros(W, A, dtype=torch.bool)
    if kind == "all":
        return torch.ones(W, A, dtype=torch.bool)
    return torch.rand(W, A, generator=g) < 0.4


# ================================================================== reset_agents
def random_logs(S, A, T, g):
    return dict(
        traj_pos=torch.randn(S, A, T, 2, generator=g) * 50,
        traj_heading=(torch.rand(S, A, T, generator=g) * 2 - 1) * math.pi,
        traj_vel=torch.randn(S, A, T, 2, generator=g) * 5,
        traj_valid=torch.rand(S, A, T, generator=g) < 0.7,
        agent_exists=torch.rand(S, A, generator=g) < 0.8,
    )


def reset_inputs(W, A, S, T, kind, seed):
    g = torch.Generator().manual_seed(seed)
    logs = random_logs(S, A, T, g)
    return dict(
        mask=make_mask(kind, W, A, g), scenario=torch.randint(0, S, (W,), generator=g), log_index=int(T // 2),
        **logs, pos=torch.randn(W, A, 2, generator=g), heading=torch.randn(W, A, generator=g),
        speed=torch.rand(W, A, generator=g), present=torch.rand(W, A, generator=g) < 0.5,
    )


@needs_triton
@pytest.mark.parametrize("W,A,S,T", [(3, 7, 2, 5), (5, 33, 3, 11), (1, 64, 4, 91)])
@pytest.mark.parametrize("kind", ["none", "empty", "all", "random"])
@pytest.mark.parametrize("set_present", [True, False])
def test_reset_kernel_matches_reference(W, A, S, T, kind, set_present, monkeypatch):
    inp = reset_inputs(W, A, S, T, kind, seed=W * 100 + A)
    ref = reset_agents_reference(**inp, set_present=set_present)
    made = garbage_outputs(monkeypatch, reset_mod)
    kinp = to_kernel_device(inp)
    with use_backend("triton"):
        kout = reset_agents(**kinp, set_present=set_present)
    assert_all_written(made)
    out = to_cpu(kout)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    torch.testing.assert_close(out[2], ref[2], rtol=2e-7, atol=0)  # sqrt(vx^2 + vy^2) vs torch's norm
    if set_present:
        assert out[3].dtype == torch.bool and torch.equal(out[3], ref[3])
    else:
        assert kout[3] is kinp["present"] and ref[3] is inp["present"]  # presence untouched


@pytest.mark.parametrize("set_present", [True, False])
def test_reset_reference_matches_loop_on_real_logs(real_pack, set_present):
    """Brute force over every (world, agent): masked agents take the logged pose at log index 7,
    speed |v|, presence valid & exists; the others keep every value."""
    p = real_pack
    g = torch.Generator().manual_seed(1)
    W, A, i = 5, p.max_agents, 7
    scen = torch.randint(0, p.num_scenarios, (W,), generator=g)
    mask = torch.rand(W, A, generator=g) < 0.5
    pos, heading = torch.randn(W, A, 2, generator=g), torch.randn(W, A, generator=g)
    speed, present = torch.rand(W, A, generator=g), torch.rand(W, A, generator=g) < 0.5
    out = reset_agents_reference(mask, scen, i, p.traj_pos, p.traj_heading, p.traj_vel, p.traj_valid,
                                 p.agent_exists, pos, heading, speed, present, set_present=set_present)
    n_changed_presence = 0
    for w in range(W):
        s = int(scen[w])
        for a in range(A):
            if mask[w, a]:
                want_pos = p.traj_pos[s, a, i].tolist()
                want = (want_pos, float(p.traj_heading[s, a, i]), math.hypot(*p.traj_vel[s, a, i].tolist()),
                        bool(p.traj_valid[s, a, i] and p.agent_exists[s, a]) if set_present else bool(present[w, a]))
            else:
                want = (pos[w, a].tolist(), float(heading[w, a]), float(speed[w, a]), bool(present[w, a]))
            assert out[0][w, a].tolist() == want[0] and float(out[1][w, a]) == want[1]
            assert float(out[2][w, a]) == pytest.approx(want[2], rel=1e-6, abs=1e-6)
            assert bool(out[3][w, a]) == want[3]
            n_changed_presence += bool(out[3][w, a]) != bool(present[w, a])
    assert (n_changed_presence > 0) == set_present  # the real logs have both valid and absent agents


def test_reset_fresh_state_is_the_log_at_init_steps(real_pack):
    """``mask=None`` is the episode-reset path: pose and presence exactly as logged."""
    p = real_pack
    scen = torch.arange(p.num_scenarios)
    pos, heading, speed, present = reset_agents(None, scen, 3, p.traj_pos, p.traj_heading, p.traj_vel,
                                                p.traj_valid, p.agent_exists, None, None, None, None)
    assert torch.equal(pos, p.traj_pos[:, :, 3]) and torch.equal(heading, p.traj_heading[:, :, 3])
    assert torch.equal(present, p.traj_valid[:, :, 3] & p.agent_exists)
    torch.testing.assert_close(speed, p.traj_vel[:, :, 3].norm(dim=-1))
    assert present.any() and not present.all()


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
def test_reset_errors(backend):
    inp = {k: v.to(backend_device(backend)) if isinstance(v, torch.Tensor) else v
           for k, v in reset_inputs(3, 5, 2, 9, "random", seed=0).items()}
    with use_backend(backend):
        for bad in (-1, 9):
            with pytest.raises(ValueError, match="log_index"):
                reset_agents(**{**inp, "log_index": bad})
        with pytest.raises(ValueError, match="pos"):
            reset_agents(**{**inp, "pos": None})
        with pytest.raises(ValueError, match="present"):
            reset_agents(**{**inp, "present": None})
        reset_agents(**{**inp, "present": None}, set_present=False)  # fine: presence not written
    if backend == "triton":
        with use_backend("triton"):
            with pytest.raises(ValueError, match="scenario.*dtype"):
                reset_agents(**{**inp, "scenario": inp["scenario"].to(torch.int32)})
            with pytest.raises(ValueError, match="contiguous"):
                reset_agents(**{**inp, "heading": inp["heading"].t().contiguous().t()})
            with pytest.raises(ValueError, match="mask.*shape"):
                reset_agents(**{**inp, "mask": inp["mask"][:, :4]})


# ================================================================== new_goal
def synthetic_tables(S, K, R, g, nx=6, ny=5, cell=8.0):
    """Random roads in a ~48 x 40 m box per scenario; grid rows mix real candidates (random order,
    repeats allowed), -1 padding at the tail, and some rows that are all -1."""
    origin = torch.randn(S, 2, generator=g) * 3 - 4
    dims = torch.tensor([[nx, ny]] * S, dtype=torch.int32)
    seg0 = origin[:, None, :] + torch.rand(S, R, 2, generator=g) * torch.tensor([nx * cell, ny * cell])
    seg1 = seg0 + torch.randn(S, R, 2, generator=g) * 3
    road_seg = torch.cat([seg0, seg1], -1).contiguous()
    other = torch.randint(1, 4, (S, R), generator=g)
    road_type = torch.where(torch.rand(S, R, generator=g) < 0.7, 0, other).to(torch.int8)
    road_type[:, -1] = -1  # a padding segment that grid rows may (wrongly) name: must not qualify
    NC = nx * ny
    grid = torch.randint(0, R, (S, NC, K), generator=g, dtype=torch.int32)
    n_real = torch.randint(0, K + 1, (S, NC, 1), generator=g)
    grid = torch.where(torch.arange(K)[None, None, :] < n_real, grid, torch.full_like(grid, -1))
    grid[:, ::7] = -1  # cells with no candidate at all
    return dict(grid_road=grid.contiguous(), grid_origin=origin, grid_dims=dims, cell_size=cell,
                road_seg=road_seg, road_type=road_type)


def new_goal_inputs(W, A, S, K, kind, seed, min_ahead=3.0, max_dist=25.0, fallback=20.0):
    g = torch.Generator().manual_seed(seed)
    tab = synthetic_tables(S, K, 41, g)
    mask = make_mask(kind, W, A, g)
    return dict(
        mask=mask, rand=torch.rand(W, A, generator=g), scenario=torch.randint(0, S, (W,), generator=g),
        # positions over the grid and up to ~10 m beyond it (border cells clamp)
        pos=tab["grid_origin"][0] + torch.rand(W, A, 2, generator=g) * torch.tensor([68.0, 60.0]) - 10.0,
        heading=(torch.rand(W, A, generator=g) * 2 - 1) * math.pi, goal=torch.randn(W, A, 2, generator=g),
        **tab, min_ahead=min_ahead, max_dist=max_dist, fallback=fallback,
    )


def fallback_points(inp):
    h = inp["heading"]
    return inp["pos"] + inp["fallback"] * torch.stack([torch.cos(h), torch.sin(h)], -1)


def assert_goals_match(out, ref, inp):
    """Equal bit for bit where a lane midpoint was chosen or the goal kept; fallback points (cos/sin
    of two libraries) within float32 rounding."""
    mask = inp["mask"]
    assert torch.equal(out[~mask], inp["goal"][~mask]) and torch.equal(ref[~mask], inp["goal"][~mask])
    fb = fallback_points(inp)
    is_fb = (ref - fb).abs().amax(-1) < 1e-4
    lane = mask & ~is_fb
    assert torch.equal(out[lane], ref[lane])
    torch.testing.assert_close(out[mask & is_fb], ref[mask & is_fb], rtol=0, atol=1e-4)
    return int(lane.sum()), int((mask & is_fb).sum())


@needs_triton
@pytest.mark.parametrize("W,A,S,K", [(7, 33, 3, 13), (3, 17, 2, 37), (2, 64, 1, 128)])
@pytest.mark.parametrize("kind", ["empty", "all", "random"])
def test_new_goal_kernel_matches_reference(W, A, S, K, kind, monkeypatch):
    inp = new_goal_inputs(W, A, S, K, kind, seed=W * 1000 + A + K)
    ref = new_goal_reference(**inp)
    made = garbage_outputs(monkeypatch, ng_mod)
    with use_backend("triton"):
        out = to_cpu(new_goal(**to_kernel_device(inp)))
    assert_all_written(made)
    n_lane, n_fb = assert_goals_match(out, ref, inp)
    if kind != "empty":
        assert n_lane > 0 and n_fb > 0  # both outcomes exercised


@needs_triton
def test_new_goal_kernel_matches_reference_on_real_roads(real_pack, monkeypatch):
    inp = real_goal_inputs(real_pack, W=4, seed=5)
    ref = new_goal_reference(**inp)
    made = garbage_outputs(monkeypatch, ng_mod)
    with use_backend("triton"):
        out = to_cpu(new_goal(**to_kernel_device(inp)))
    assert_all_written(made)
    n_lane, n_fb = assert_goals_match(out, ref, inp)
    assert n_lane > 10 and n_fb > 0


def real_goal_inputs(p, W, seed):
    """Agents of the real sample at their logged poses (valid steps), env constants."""
    g = torch.Generator().manual_seed(seed)
    A = p.max_agents
    scen = torch.randint(0, p.num_scenarios, (W,), generator=g)
    t = torch.randint(0, p.num_steps, (W, A), generator=g)
    s = scen[:, None].expand(W, A)
    a = torch.arange(A)[None, :].expand(W, A)
    valid = p.traj_valid[s, a, t]
    return dict(mask=valid & (torch.rand(W, A, generator=g) < 0.8), rand=torch.rand(W, A, generator=g),
                scenario=scen, pos=p.traj_pos[s, a, t].contiguous(), heading=p.traj_heading[s, a, t].contiguous(),
                goal=p.agent_goal[scen].contiguous(), grid_road=p.grid_road, grid_start=p.grid_start,
                grid_origin=p.grid_origin,
                grid_dims=p.grid_dims, cell_size=p.cell_size, road_seg=p.road_seg, road_type=p.road_type,
                min_ahead=NEW_GOAL_MIN_AHEAD, max_dist=NEW_GOAL_MAX_DIST, fallback=NEW_GOAL_FALLBACK)


def brute_force_goal(inp, w, a):
    """The rule of gpusim/kernels/new_goal.py, one agent, plain Python (float64)."""
    s = int(inp["scenario"][w])
    x, y = inp["pos"][w, a].tolist()
    h = float(inp["heading"][w, a])
    fx, fy = math.cos(h), math.sin(h)
    ox, oy = inp["grid_origin"][s].tolist()
    nx, ny = inp["grid_dims"][s].tolist()
    cs = inp["cell_size"]
    ix = min(max(math.floor((x - ox) / cs), 0), nx - 1)
    iy = min(max(math.floor((y - oy) / cs), 0), ny - 1)
    qualifying = []
    for c in inp["grid_road"][int(inp["grid_start"][s]) + iy * nx + ix].tolist():  # compact layout
        if c < 0 or int(inp["road_type"][s, c]) != int(RoadType.LANE):
            continue
        x0, y0, x1, y1 = inp["road_seg"][s, c].tolist()
        mx, my = 0.5 * (x0 + x1), 0.5 * (y0 + y1)
        if (mx - x) * fx + (my - y) * fy >= inp["min_ahead"] and math.hypot(mx - x, my - y) <= inp["max_dist"]:
            qualifying.append((mx, my))
    if not qualifying:
        return (x + inp["fallback"] * fx, y + inp["fallback"] * fy), None
    j = min(int(math.floor(float(inp["rand"][w, a]) * len(qualifying))), len(qualifying) - 1)
    return qualifying[j], j


def test_new_goal_reference_matches_brute_force_on_real_roads(real_pack):
    inp = real_goal_inputs(real_pack, W=6, seed=3)
    ref = new_goal_reference(**inp)
    ranks = collections.Counter()
    for w in range(inp["mask"].shape[0]):
        for a in range(inp["mask"].shape[1]):
            if not inp["mask"][w, a]:
                assert torch.equal(ref[w, a], inp["goal"][w, a])
                continue
            want, j = brute_force_goal(inp, w, a)
            assert ref[w, a].tolist() == pytest.approx(list(want), abs=1e-3), (w, a)
            ranks[j] += 1
    # not vacuous: fallbacks and lane picks at several ranks of the candidate order
    assert ranks[None] > 0 and sum(v for k, v in ranks.items() if k is not None) > 20
    assert len([k for k in ranks if k is not None and k > 0]) >= 3, ranks


@pytest.mark.parametrize("kind", ["empty", "all", "random"])
def test_new_goal_cpu_compaction_equals_dense_reference(kind, real_pack):
    inp = new_goal_inputs(9, 31, 3, 17, kind, seed=11)
    assert torch.equal(new_goal_compact(**inp), new_goal_reference(**inp))
    with use_backend("torch"):
        assert torch.equal(new_goal(**inp), new_goal_reference(**inp))  # the public CPU path
    real = real_goal_inputs(real_pack, W=5, seed=2)
    if kind != "random":
        real["mask"] = make_mask(kind, *real["mask"].shape, None)
    assert torch.equal(new_goal_compact(**real), new_goal_reference(**real))


def one_cell_case(cands, types, mids, rand, heading=0.0):
    """One scenario with one grid cell whose candidate list is ``cands``; segment r is a 2 m piece
    of road of type ``types[r]`` centred at ``mids[r]``; one masked agent at the origin."""
    m = torch.tensor(mids, dtype=torch.float32)
    seg = torch.cat([m - torch.tensor([1.0, 0.0]), m + torch.tensor([1.0, 0.0])], -1)[None].contiguous()
    n = len(rand)
    return dict(
        mask=torch.ones(1, n, dtype=torch.bool), rand=torch.tensor([rand], dtype=torch.float32),
        scenario=torch.zeros(1, dtype=torch.int64), pos=torch.zeros(1, n, 2),
        heading=torch.full((1, n), heading), goal=torch.full((1, n, 2), 99.0),
        grid_road=torch.tensor([[cands]], dtype=torch.int32), grid_origin=torch.tensor([[-100.0, -100.0]]),
        grid_dims=torch.tensor([[1, 1]], dtype=torch.int32), cell_size=200.0, road_seg=seg,
        road_type=torch.tensor([types], dtype=torch.int8), min_ahead=10.0, max_dist=40.0, fallback=20.0,
    )


LANE, EDGE = int(RoadType.LANE), int(RoadType.ROAD_EDGE)


@pytest.mark.parametrize("backend", ["torch", "reference", pytest.param("triton", marks=needs_triton)])
def test_new_goal_rule_edge_cases(backend):
    def run(inp):
        if backend == "reference":
            return new_goal_reference(**inp)
        with use_backend(backend):
            return to_cpu(new_goal(**{k: v.to(backend_device(backend)) if isinstance(v, torch.Tensor) else v
                                      for k, v in inp.items()}))

    # segments: 0 lane behind, 1 lane 15 m ahead, 2 edge ahead, 3 lane 20 m ahead, 4 lane 60 m
    # ahead (too far), 5 lane 30 m ahead, 6 lane 5 m ahead (too close)
    types = [LANE, LANE, EDGE, LANE, LANE, LANE, LANE]
    mids = [(-20.0, 0.0), (15.0, 1.0), (20.0, 0.0), (20.0, -2.0), (60.0, 0.0), (30.0, 3.0), (5.0, 0.0)]
    # candidate order 6, 1, 0, 2, 3, -1, 4, 5: qualifying in order = 1, 3, 5
    cands = [6, 1, 0, 2, 3, -1, 4, 5]
    out = run(one_cell_case(cands, types, mids, [0.0, 0.3, 0.34, 0.5, 0.7, 0.999999]))
    picked = [mids[r] for r in (1, 1, 3, 3, 5, 5)]
    assert out[0].tolist() == [list(p) for p in picked]
    # heading pi: only segment 0 (20 m behind = ahead now) qualifies
    out = run(one_cell_case(cands, types, mids, [0.0, 0.9], heading=math.pi))
    assert out[0].tolist() == [[-20.0, 0.0]] * 2
    # no lane ahead (edges only / all -1 padded / lanes too far or behind) -> 20 m straight ahead
    h = 0.7
    ahead = [20.0 * math.cos(h), 20.0 * math.sin(h)]
    for c, t in (([2, 2, -1], types), ([-1, -1, -1, -1], types), ([0, 4, 6], types),
                 ([1, 3, 5], [EDGE] * 7)):
        out = run(one_cell_case(c, t, mids, [0.5], heading=h))
        assert out[0, 0].tolist() == pytest.approx(ahead, abs=1e-5)
    # no agent masked: goals unchanged
    inp = one_cell_case(cands, types, mids, [0.5, 0.5])
    inp["mask"][:] = False
    assert torch.equal(run(inp), inp["goal"])


def test_lane_type_matches_config():
    assert LANE_TYPE == int(RoadType.LANE)


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
def test_new_goal_errors(backend):
    inp = {k: v.to(backend_device(backend)) if isinstance(v, torch.Tensor) else v
           for k, v in new_goal_inputs(2, 3, 1, 5, "random", seed=0).items()}
    with use_backend(backend):
        for key, val, match in (("cell_size", 0.0, "cell_size"), ("max_dist", float("nan"), "max_dist"),
                                ("fallback", float("inf"), "fallback"), ("max_dist", -1.0, "max_dist")):
            with pytest.raises(ValueError, match=match):
                new_goal(**{**inp, key: val})
    if backend == "triton":
        with use_backend("triton"):
            with pytest.raises(ValueError, match="rand"):
                new_goal(**{**inp, "rand": inp["rand"].double()})
            with pytest.raises(ValueError, match="grid_road"):
                new_goal(**{**inp, "grid_road": inp["grid_road"].long()})
            with pytest.raises(ValueError, match="contiguous"):
                new_goal(**{**inp, "pos": inp["pos"].transpose(0, 1).contiguous().transpose(0, 1)})


# ================================================================== DriveEnv uses the kernels


@needs_triton
@pytest.mark.parametrize("goal_behavior,kernel", [("respawn", "_reset_agents_kernel"),
                                                  ("new_goal", "_new_goal_kernel")])
def test_env_launches_reset_and_goal_kernels(real_pack, goal_behavior, kernel):
    """Under the Triton backend the reset runs ``_reset_agents_kernel`` and every step of RESPAWN /
    NEW_GOAL launches its kernel once (also in steps where no goal is reached: no host decision),
    with the same results as the torch backend."""
    config = EnvConfig(**SMALL, scenario_length=3, goal_behavior=goal_behavior)
    # both on KERNEL_DEVICE (same device: the same env random streams); the reference forces torch
    env_r = DriveEnv(real_pack, 2, torch_reference_config(config), seed=4, device=KERNEL_DEVICE)
    env_t = DriveEnv(real_pack, 2, config, seed=4, device=KERNEL_DEVICE)
    with use_backend("torch"):
        env_r.reset()
    with use_backend("triton"), count_launches() as at_reset:
        env_t.reset()
    assert at_reset["_reset_agents_kernel"] == 1
    assert torch.equal(env_t.state.pos, env_r.state.pos) and torch.equal(env_t.state.present, env_r.state.present)
    for t in range(3):  # the third step completes the episode and resets every world
        with use_backend("torch"):
            a = env_r.expert_actions()
            r_r = env_r.step(a)
        with use_backend("triton"), count_launches() as launches:
            r_t = env_t.step(a)
        assert launches[kernel] == 1 + (t == 2 and kernel == "_reset_agents_kernel"), launches
        assert torch.equal(r_t.reward, r_r.reward)
        torch.testing.assert_close(env_t.state.goal, env_r.state.goal, rtol=0, atol=1e-4)
        torch.testing.assert_close(env_t.state.pos, env_r.state.pos, rtol=1e-5, atol=1e-4)
