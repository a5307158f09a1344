"""The hand-written C kernels of the contacts and replay stages (gpusim/kernels/collision.c,
offroad.c, replay.c)
against their torch references: real scenarios at odd world counts over many random-action steps
(collisions, offroad and hits occur and are counted), perturbed states (near-touching and
overlapping boxes, NaN poses, out-of-range log indices), garbage-prefilled outputs, the env with
and without them (ignore / remove behaviours, episode ends), and the build-failure fallback.

Equality is exact: booleans identical, replayed floats bit for bit.
"""

import dataclasses

import pytest
import torch

from gpusim.config import EnvConfig
from gpusim.data import ScenarioPack
from gpusim.env import DriveEnv
from gpusim.kernels.cbuild import forget_step_libraries, step_kernels_status
from gpusim.kernels.collision import collisions_cpu, collisions_reference, hit_by_cpu, hit_by_reference
from gpusim.kernels.obs_layout import EGO_FEATURES
from gpusim.kernels.observations import cpu as obs_cpu
from gpusim.kernels.offroad import offroad_cpu, offroad_reference
from gpusim.kernels.replay import replay_cpu, replay_reference


@pytest.fixture(scope="module")
def pack(sample_dir):
    cfg = EnvConfig(max_controlled=8)
    return ScenarioPack.from_json(sorted(sample_dir.glob("*.json*")), cfg.data_config())


def garbage_bool(W, A):
    return torch.ones(W, A, dtype=torch.bool)


def compare_all(env, g, cfg) -> dict:
    """Every C kernel against its reference on the env's current state; returns event counts."""
    st, p, C = env.state, env.pack, env.num_slots
    W, A = st.present.shape
    live = st.present & st.controlled
    box = dict(pos=st.pos, heading=st.heading, length=st.length, width=st.width)
    want = collisions_reference(**box, present=st.present, box_scale=cfg.collision_box_scale, query=live)
    got = collisions_cpu(**box, present=st.present, box_scale=cfg.collision_box_scale, query=live,
                         out=garbage_bool(W, A))
    assert torch.equal(got, want)
    for q in (None, 3):  # num_query forms
        assert torch.equal(collisions_cpu(**box, present=st.present, box_scale=0.9, num_query=q),
                           collisions_reference(**box, present=st.present, box_scale=0.9, num_query=q))
    grid = dict(scenario=st.scenario, road_seg=p.road_seg, grid_edge=p.grid_edge, grid_start=p.grid_start,
                grid_origin=p.grid_origin, grid_dims=p.grid_dims, cell_size=p.cell_size,
                box_scale=cfg.offroad_box_scale)
    sl = (slice(None), slice(0, C))
    off_want = offroad_reference(st.pos[sl], st.heading[sl], st.length[sl], st.width[sl], live[sl], **grid)
    off_got = offroad_cpu(**box, present=live, num_slots=C, out=garbage_bool(W, A), **grid)
    assert torch.equal(off_got[:, :C], off_want) and not off_got[:, C:].any()
    all_slots = offroad_reference(**box, present=st.present, **grid)
    assert torch.equal(offroad_cpu(**box, present=st.present, **grid), all_slots)
    source = want[:, :C] & (torch.rand(W, C, generator=g) < 0.7)
    hit_want = hit_by_reference(**box, present=st.present, source=source, box_scale=cfg.collision_box_scale)
    hit_got = hit_by_cpu(**box, present=st.present, source=source, box_scale=cfg.collision_box_scale,
                         out=garbage_bool(W, A))
    assert torch.equal(hit_got, hit_want)
    log_index = torch.randint(-2, p.traj_valid.shape[2] + 2, (W,), generator=g)
    rkw = dict(pos=st.pos, heading=st.heading, speed=st.speed, present=st.present,
               replayed=torch.rand(W, A, generator=g) < 0.8, scenario=st.scenario, log_index=log_index,
               traj_pos=p.traj_pos, traj_heading=p.traj_heading, traj_vel=p.traj_vel, traj_valid=p.traj_valid)
    r_want = replay_reference(**rkw)
    nan = (torch.full((W, A, 2), float("nan")), torch.full((W, A), float("nan")), torch.full((W, A), float("nan")),
           torch.ones(W, A, dtype=torch.bool))
    r_got = replay_cpu(**rkw, out=nan)
    for x, y in zip(r_got, r_want):
        assert x.dtype == y.dtype and torch.equal(x.view(torch.int32) if x.is_floating_point() else x,
                                                  y.view(torch.int32) if y.is_floating_point() else y)
    return {"collided": int(want.sum()), "offroad": int(off_want.sum()), "hit": int(hit_want.sum()),
            "moved": int((r_want[2] > 0).sum())}


def test_library_builds():
    st = step_kernels_status()
    assert st["available"], st["reason"]


@pytest.mark.parametrize("worlds", [1, 7, 33])
def test_c_kernels_match_references_over_a_rollout(pack, worlds):
    """Random actions over 40 steps (episodes end and restart): every kernel equals its reference
    at every step, with garbage-prefilled outputs; collisions, offroad and hits do occur."""
    cfg = EnvConfig(max_controlled=8, num_signals=0, scenario_length=20, cpu_kernels=False)
    env = DriveEnv(pack, worlds, cfg, seed=worlds)
    g = torch.Generator().manual_seed(worlds)
    counts = {}
    for _ in range(40):
        for k, v in compare_all(env, g, cfg).items():
            counts[k] = counts.get(k, 0) + v
        env.step(torch.randint(0, 91, (worlds, env.num_slots), generator=g))
    assert counts["collided"] > 0 and counts["offroad"] > 0 and counts["moved"] > 0, counts
    if worlds > 1:
        assert counts["hit"] > 0, counts


def test_c_kernels_on_perturbed_states(pack):
    """Boxes pulled onto each other (touching, overlapping, near misses), random headings, NaN
    poses, zero-size boxes: still identical to the references."""
    cfg = EnvConfig(max_controlled=8, num_signals=0, cpu_kernels=False)
    env = DriveEnv(pack, 17, cfg, seed=3)
    g = torch.Generator().manual_seed(3)
    st = env.state
    W, A = st.present.shape
    counts = {"collided": 0, "offroad": 0}
    for t in range(6):
        other = torch.randint(0, A, (W, A), generator=g)
        near = torch.gather(st.pos, 1, other[..., None].expand(W, A, 2))
        pull = torch.rand(W, A, 1, generator=g) < 0.5
        jitter = torch.randn(W, A, 2, generator=g) * (3.0 / (t + 1))
        st.pos = torch.where(pull, near + jitter, st.pos + torch.randn(W, A, 2, generator=g)).contiguous()
        st.heading = (st.heading + torch.randn(W, A, generator=g) * t).contiguous()
        if t == 3:
            st.length[:, 1] = 0.0
            st.width[:, 1] = 0.0
        if t >= 4:
            st.pos[0, :3] = float("nan")
            st.heading[1, 2] = float("nan")
        for k, v in compare_all(env, g, cfg).items():
            counts[k] = counts.get(k, 0) + v
    assert counts["collided"] > 50 and counts["offroad"] > 10, counts


def test_touching_boxes_collide():
    """Boxes sharing an edge or a corner collide (reference contract) in C too."""
    pos = torch.tensor([[[0.0, 0.0], [2.0, 0.0], [4.0, 2.0], [10.0, 10.0]]])
    heading = torch.zeros(1, 4)
    size = torch.full((1, 4), 2.0)
    present = torch.ones(1, 4, dtype=torch.bool)
    want = collisions_reference(pos, heading, size, size, present, 1.0)
    got = collisions_cpu(pos, heading, size, size, present, 1.0)
    assert torch.equal(got, want) and want.tolist() == [[True, True, True, False]]  # edge 0-1, corner 1-2


def test_offroad_contract_cases():
    """A 2 m box at the origin against one road edge per world: a proper crossing that pokes only
    5 mm into the box (the pre-check margin must keep it) is offroad; an edge whose endpoint only
    touches the box outline, and an edge along a box side, are not (strict test)."""
    segs = [[0.0, 0.995, 0.0, 3.0], [0.0, 1.0, 0.0, 3.0], [-3.0, 1.0, 3.0, 1.0], [0.5, -0.5, 0.5, 0.5]]
    W = len(segs)
    kw = dict(pos=torch.zeros(W, 1, 2), heading=torch.zeros(W, 1), length=torch.full((W, 1), 2.0),
              width=torch.full((W, 1), 2.0), present=torch.ones(W, 1, dtype=torch.bool),
              scenario=torch.arange(W), road_seg=torch.tensor(segs)[:, None, :],
              grid_edge=torch.zeros(W, 1, 1, dtype=torch.int32), grid_origin=torch.full((W, 2), -50.0),
              grid_dims=torch.ones(W, 2, dtype=torch.int32), cell_size=100.0, box_scale=1.0)
    want = offroad_reference(**kw)
    assert want[:, 0].tolist() == [True, False, False, False]  # the last edge lies inside the box
    assert torch.equal(offroad_cpu(**kw, out=garbage_bool(W, 1)), want)


def obs_equal(a, b):
    """Observations equal bit for bit but the goal distance (C observation kernel: last bit)."""
    col = EGO_FEATURES.index("goal_dist/100")
    keep = torch.ones(a.shape[-1], dtype=torch.bool)
    keep[col] = False
    return torch.equal(a[..., keep], b[..., keep]) and torch.allclose(a[..., col], b[..., col], rtol=3e-7, atol=0)


def run_env(pack, config, worlds, steps, seed=11):
    env = DriveEnv(pack, worlds, config, seed=seed)
    g = torch.Generator().manual_seed(seed)
    out = [(env.reset().clone(),)]
    for _ in range(steps):
        res = env.step(torch.randint(0, 91, (worlds, env.num_slots), generator=g))
        st = env.state
        out.append((res.obs.clone(), res.reward.clone(), res.terminal | res.truncation, st.pos.clone(),
                    st.heading.clone(), st.speed.clone(), st.present.clone(), st.collided_now.clone(),
                    st.offroad_now.clone(), st.removed.clone()))
    return out


@pytest.mark.parametrize("behavior", ["ignore", "remove", "stop"])
def test_env_c_kernels_equal_reference(pack, behavior):
    """DriveEnv with the C kernels (cpu_kernels=True) equals cpu_kernels=False over 32 steps that
    cross episode ends: observations, rewards, dones and the state after each step."""
    config = EnvConfig(max_controlled=8, scenario_length=10, num_signals=0, collision_behavior=behavior,
                       offroad_behavior=behavior)
    a = run_env(pack, config, 9, 32)
    b = run_env(pack, dataclasses.replace(config, cpu_kernels=False), 9, 32)
    assert obs_equal(a[0][0], b[0][0])
    events = 0
    for x, y in zip(a[1:], b[1:]):
        assert obs_equal(x[0], y[0])
        for u, v in zip(x[1:], y[1:]):
            assert torch.equal(u, v)
        events += int(x[7].any()) + int(x[8].any())
    assert events > 5


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """An empty library cache and no loaded C library (observation kernel too, so a failed build
    there cannot outlive the test); both are loaded afresh afterwards."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    forget_step_libraries()
    obs_cpu.forget_library()
    yield tmp_path
    forget_step_libraries()
    obs_cpu.forget_library()


@pytest.mark.filterwarnings("ignore:gpusim. C observation kernel unavailable")  # same fresh cache and CC
def test_build_failure_falls_back_with_one_warning(pack, fresh_build, monkeypatch):
    """No compiler: one RuntimeWarning, then every function returns its reference's result and
    the env runs (same results as cpu_kernels=False)."""
    monkeypatch.setenv("CC", "/nonexistent/cc")
    cfg = EnvConfig(max_controlled=8, num_signals=0, scenario_length=6, cpu_kernels=False)
    env = DriveEnv(pack, 3, cfg, seed=0)
    with pytest.warns(RuntimeWarning, match="C step kernels unavailable") as rec:
        compare_all(env, torch.Generator().manual_seed(0), cfg)
        a = run_env(pack, dataclasses.replace(cfg, cpu_kernels=True), 3, 8)
    assert len([w for w in rec if "C step kernels" in str(w.message)]) == 1
    b = run_env(pack, cfg, 3, 8)
    for x, y in zip(a[1:], b[1:]):
        for u, v in zip(x[1:], y[1:]):
            assert torch.equal(u, v)
    st = step_kernels_status()
    assert not st["available"] and "nonexistent" in st["reason"]


def test_bad_inputs_raise():
    pos, h = torch.zeros(2, 3, 2), torch.zeros(2, 3)
    present = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="collisions: heading"):
        collisions_cpu(pos, h.double(), h, h, present, 1.0)
    with pytest.raises(ValueError, match="hit_by: source"):
        hit_by_cpu(pos, h, h, h, present, torch.ones(2, 4, dtype=torch.bool), 1.0)
    with pytest.raises(ValueError, match="collisions: out"):
        collisions_cpu(pos, h, h, h, present, 1.0, out=torch.ones(3, 2, dtype=torch.bool))
