"""The hand-written C observation kernel (gpusim/kernels/observations/cpu.c) against the torch
reference: real scenarios, odd world counts, rows subsets, NaN-prefilled and wider output buffers,
the env with and without it (episode ends, trial mode, signals), and the build-failure fallback.

Equality is exact (same sort keys, same float32 operations) except the goal distance (ego column
5): torch's vectorised ``sqrt`` is not correctly rounded on every CPU, ``sqrtf`` is, so that one
column may differ in its last bit.
"""

import dataclasses

import pytest
import torch

from gpusim.config import EnvConfig
from gpusim.data import ScenarioPack
from gpusim.env import DriveEnv
from gpusim.kernels.obs_layout import EGO_FEATURES
from gpusim.kernels.observations import cpu_kernel_status, obs_layout, observations_cpu, observations_reference
from gpusim.kernels.observations.cpu import observations_cpu_state, observations_cpu_static
from gpusim.kernels.observations import cpu as cpu_mod

GOAL_DIST = EGO_FEATURES.index("goal_dist/100")


def assert_same_obs(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal bit for bit but the goal distance column, which may differ by one float32 ulp."""
    other = torch.ones(got.shape[-1], dtype=torch.bool)
    other[GOAL_DIST] = False
    g, w = got[..., other], want[..., other]
    bad = ~((g == w) | (torch.isnan(g) & torch.isnan(w)))
    assert not bad.any(), f"{int(bad.sum())} elements differ, first at {bad.nonzero()[0].tolist()}"
    torch.testing.assert_close(got[..., GOAL_DIST], want[..., GOAL_DIST], rtol=2.4e-7, atol=0.0, equal_nan=True)


@pytest.fixture(scope="module")
def pack(sample_dir):
    cfg = EnvConfig(max_controlled=8)
    return ScenarioPack.from_json(sorted(sample_dir.glob("*.json*")), cfg.data_config())


def kernel_inputs(env: DriveEnv, active: torch.Tensor) -> dict:
    """Keyword arguments of the observation kernels for the env's current state."""
    st, p, C, cfg = env.state, env.pack, env.num_slots, env.config
    g = torch.Generator().manual_seed(int(st.step.sum()) if st.step.dim() else 0)
    return dict(
        pos=st.pos, heading=st.heading, speed=st.speed, length=st.length, width=st.width,
        agent_type=st.agent_type, present=st.present, goal=st.goal[:, :C].contiguous(),
        ego_extra=torch.rand(env.num_worlds, C, 5, generator=g), ego_active=active, scenario=st.scenario,
        road_seg=p.road_seg, road_type=p.road_type, grid_road=p.grid_road, grid_start=p.grid_start,
        grid_origin=p.grid_origin, grid_dims=p.grid_dims, cell_size=p.cell_size,
        num_partners=cfg.num_partners, partner_radius=cfg.partner_radius, road_radius=cfg.road_radius,
    )


def test_kernel_builds():
    st = cpu_kernel_status()
    assert st["available"], st["reason"]


@pytest.mark.parametrize("worlds", [1, 7, 33])
def test_c_matches_reference_on_real_scenarios(pack, worlds):
    """Full output, NaN-prefilled: every element written, equal to the reference; some slots
    inactive (all zero); several states of the episode (agents moved by random actions)."""
    env = DriveEnv(pack, worlds, EnvConfig(max_controlled=8, num_signals=0), seed=worlds)
    g = torch.Generator().manual_seed(1)
    for t in range(3):
        C = env.num_slots
        active = env.state.slot_active & env.state.present[:, :C]
        active &= torch.rand(active.shape, generator=g) < 0.8
        kw = kernel_inputs(env, active.contiguous())
        want = observations_reference(**kw)
        out = torch.full_like(want, float("nan"))
        got = observations_cpu(**kw, out=out)
        assert got is out and not torch.isnan(got).any()
        assert_same_obs(got, want)
        assert (want[~active] == 0).all()
        lay = obs_layout(kw["num_partners"], kw["grid_road"].shape[-1])
        part = got[..., lay.partners].reshape(-1, lay.num_partners, lay.partner_dim)
        roads = got[..., lay.roads].reshape(-1, lay.num_roads, lay.road_dim)
        assert part[..., -1].sum() > 0 and roads[..., -1].sum() > 0  # partners and roads observed
        env.step(torch.randint(0, 91, (worlds, C), generator=g))


@pytest.mark.parametrize("wide", [False, True])
def test_rows_subset_and_wider_buffer(pack, wide):
    """rows: only listed slots written (inactive listed ones zeroed), the rest stays NaN; with
    ``wide`` the kernel writes the first D columns of a wider buffer, leaving the others."""
    env = DriveEnv(pack, 5, EnvConfig(max_controlled=8, num_signals=0), seed=2)
    C = env.num_slots
    active = (env.state.slot_active & env.state.present[:, :C]).contiguous()
    active[1, 0] = False
    kw = kernel_inputs(env, active)
    want = observations_reference(**kw)
    D = want.shape[-1]
    rows = torch.tensor([C + 0, 3, 4 * C + C - 1, 2 * C + 1, 0], dtype=torch.int64)  # any order; C+0 inactive
    full = torch.full((5, C, D + (13 if wide else 0)), float("nan"))
    got = observations_cpu(**kw, out=full[..., :D], rows=rows)
    flat = full.view(5 * C, -1)
    assert_same_obs(flat[rows, :D], want.view(5 * C, D)[rows])
    assert (flat[C, :D] == 0).all()
    listed = torch.zeros(5 * C, dtype=torch.bool)
    listed[rows] = True
    assert torch.isnan(flat[~listed]).all() and torch.isnan(flat[:, D:]).all()
    assert got.data_ptr() == full.data_ptr()


def test_random_scenes_match_reference():
    """Hand-built random scenes (padded int32 grid, P > A - 1, K not a power of two) match too."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_observations import random_scene

    for seed, sizes in ((3, dict(W=3, A=9, C=3, K=13, R=17, P=4)), (4, dict(W=2, A=5, C=5, K=7, R=8, P=6))):
        kw = random_scene(seed=seed, **sizes)
        want = observations_reference(**kw)
        assert_same_obs(observations_cpu(**kw, out=torch.full_like(want, float("nan"))), want)


def test_bad_input_raises(pack):
    env = DriveEnv(pack, 2, EnvConfig(max_controlled=8, num_signals=0), seed=0)
    C = env.num_slots
    kw = kernel_inputs(env, (env.state.slot_active & env.state.present[:, :C]).contiguous())
    D = observations_reference(**kw).shape[-1]
    out = torch.zeros(2, C, D)
    with pytest.raises(ValueError, match="rows must lie"):
        observations_cpu(**kw, out=out, rows=torch.tensor([2 * C]))
    with pytest.raises(ValueError, match="stride"):
        observations_cpu(**kw, out=torch.zeros(C, 2, D).transpose(0, 1))  # worlds interleaved
    with pytest.raises(ValueError, match="int64"):
        observations_cpu(**kw, out=out, rows=torch.tensor([0], dtype=torch.int32))


def run_env(pack, config: EnvConfig, worlds: int, steps: int, seed: int = 5):
    """Observations, rewards and done flags of ``steps`` random-action steps."""
    env = DriveEnv(pack, worlds, config, seed=seed)
    g = torch.Generator().manual_seed(seed)
    out = [env.reset().clone()]
    for _ in range(steps):
        res = env.step(torch.randint(0, 91, (worlds, env.num_slots), generator=g))
        out.append((res.obs.clone(), res.reward.clone(), res.terminal.clone() | res.truncation.clone()))
    return out


@pytest.mark.parametrize(
    "extra",
    [
        dict(collision_behavior="remove", offroad_behavior="remove", num_signals=0),
        dict(goal_behavior="trial", k_trials=2, num_signals=4),  # trial mode, signal block after the C block
    ],
    ids=["remove-nosignals", "trial-signals"],
)
def test_env_c_path_equals_reference(pack, extra):
    """DriveEnv with the C kernel (default) and with the torch reference (cpu_kernels=False) give
    the same observations, rewards and done flags over 32 steps crossing episode ends."""
    config = EnvConfig(max_controlled=8, scenario_length=10, **extra)
    assert config.cpu_kernels
    a = run_env(pack, config, 7, 32)
    b = run_env(pack, dataclasses.replace(config, cpu_kernels=False), 7, 32)
    assert_same_obs(a[0], b[0])
    ends = 0
    for (oa, ra, da), (ob, rb, db) in zip(a[1:], b[1:]):
        assert_same_obs(oa, ob)
        assert torch.equal(ra, rb) and torch.equal(da, db)
        ends += int(da.any())
    assert ends >= 3  # scenario_length 10 (x2 trials): episode ends inside the run


def test_zero_tail_and_env_with_real_signals(pack):
    """zero_tail zeroes the listed rows' columns after D (C kernel); and on a scenario that has
    traffic signals (the bundled TFRecord) the env's C path runs the signal kernel and matches the
    reference path."""
    env = DriveEnv(pack, 3, EnvConfig(max_controlled=8, num_signals=0), seed=0)
    C = env.num_slots
    kw = kernel_inputs(env, (env.state.slot_active & env.state.present[:, :C]).contiguous())
    D = observations_reference(**kw).shape[-1]
    full = torch.full((3, C, D + 4), float("nan"))
    rows = torch.tensor([1, 2 * C], dtype=torch.int64)
    observations_cpu(**kw, out=full[..., :D], rows=rows, zero_tail=3)
    flat = full.view(3 * C, -1)
    assert (flat[rows, D : D + 3] == 0).all() and torch.isnan(flat[rows, D + 3]).all()
    with pytest.raises(ValueError, match="zero_tail"):
        observations_cpu(**kw, out=full[..., :D], rows=rows, zero_tail=5)

    from pathlib import Path

    tfr = Path(__file__).resolve().parents[1] / "data" / "womd_tfrecord" / "motion_data_one_scenario.tfrecord.gz"
    sig_pack = ScenarioPack.from_json([str(tfr)])
    assert int(sig_pack.num_signals.max()) > 0
    config = EnvConfig(num_signals=8, scenario_length=6)
    a = run_env(sig_pack, config, 3, 8)
    b = run_env(sig_pack, dataclasses.replace(config, cpu_kernels=False), 3, 8)
    lay_sig = slice(a[0].shape[-1] - 8 * 11, None)
    assert a[0][..., lay_sig].any()  # the signal block is observed
    for x, y in zip([a[0]] + [t[0] for t in a[1:]], [b[0]] + [t[0] for t in b[1:]]):
        assert_same_obs(x, y)


def test_cpu_kernels_option_is_validated():
    assert EnvConfig().cpu_kernels is True
    with pytest.raises(ValueError, match="cpu_kernels"):
        EnvConfig(cpu_kernels="no")


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """An empty library cache and no loaded library; restored afterwards."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cpu_mod.forget_library()
    yield tmp_path
    cpu_mod.forget_library()


@pytest.mark.parametrize("cc", ["/nonexistent/cc", "false"])
def test_build_failure_falls_back_with_one_warning(pack, fresh_build, monkeypatch, cc):
    monkeypatch.setenv("CC", cc)
    env = DriveEnv(pack, 3, EnvConfig(max_controlled=8, num_signals=0), seed=0)
    C = env.num_slots
    kw = kernel_inputs(env, (env.state.slot_active & env.state.present[:, :C]).contiguous())
    want = observations_reference(**kw)
    D = want.shape[-1]
    full = torch.full((3, C, D + 3), float("nan"))
    with pytest.warns(RuntimeWarning, match="C observation kernel unavailable") as rec:
        got = observations_cpu(**kw, out=full[..., :D])
        observations_cpu(**kw)  # no second warning
    assert len([w for w in rec if "C observation kernel" in str(w.message)]) == 1
    assert torch.equal(got, want) and torch.isnan(full[..., D:]).all()
    rows = torch.tensor([2, 0], dtype=torch.int64)
    observations_cpu(**kw, out=full[..., :D], rows=rows, zero_tail=2)  # fallback zeroes the tail too
    flat = full.view(3 * C, -1)
    assert (flat[rows, D : D + 2] == 0).all() and torch.isnan(flat[rows, D + 2]).all()
    assert torch.isnan(flat[1, D:]).all()
    assert not cpu_kernel_status()["available"] and cc.split("/")[-1] in cpu_kernel_status()["reason"]


def test_unusable_cache_dir_falls_back(fresh_build, monkeypatch):
    blocker = fresh_build / "not_a_dir"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # mkdir below a regular file fails
    with pytest.warns(RuntimeWarning, match="C observation kernel unavailable"):
        st = cpu_kernel_status()
    assert not st["available"] and "Error" in st["reason"]


def test_build_is_cached_in_the_cache_dir(fresh_build):
    st = cpu_kernel_status()
    assert st["available"] and st["path"].startswith(str(fresh_build / "gpusim"))
    cpu_mod.forget_library()
    assert cpu_kernel_status()["path"] == st["path"]  # loaded from the cache, same key


@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize("trial", [False, True])
def test_state_entry_matches_classic_call(pack, check, trial):
    """observations_cpu_state (the env's one-call C path: rows, ego extras, goal slots and in-play
    flags from the state's fields) writes what observations_cpu writes with the classic inputs,
    with random controlled/present/collided/offroad flags, a random ``written`` mask (rows neither
    in play nor written stay untouched: NaN), a column view of a wider buffer and a zero tail."""
    W = 9
    env = DriveEnv(pack, W, EnvConfig(max_controlled=8, num_signals=0), seed=3)
    st, C = env.state, env.num_slots
    A = st.pos.shape[1]
    g = torch.Generator().manual_seed(11)
    controlled = torch.rand(W, A, generator=g) < 0.7
    present = st.present & (torch.rand(W, A, generator=g) < 0.9)
    collided, offroad = torch.rand(W, A, generator=g) < 0.3, torch.rand(W, A, generator=g) < 0.3
    last_reward = torch.randn(W, C, generator=g)
    written = torch.rand(W * C, generator=g) < 0.5
    t_index = torch.rand(W, generator=g) if trial else None
    t_time = torch.rand(W, generator=g) if trial else None
    kw = kernel_inputs(env, (controlled & present)[:, :C].contiguous())
    kw["present"] = present
    D = observations_reference(**kw).shape[-1]
    zeros = torch.zeros(W, C)
    ti = zeros if t_index is None else t_index[:, None] + zeros
    tt = zeros if t_time is None else t_time[:, None] + zeros
    kw["ego_extra"] = torch.stack([collided[:, :C].float(), offroad[:, :C].float(), ti, tt, last_reward], dim=-1)
    want = torch.full((W, C, D + 5), float("nan"))
    flat = kw["ego_active"].view(-1)
    observations_cpu(**kw, out=want[..., :D], rows=(flat | written).nonzero().squeeze(1), zero_tail=3)
    got = torch.full((W, C, D + 5), float("nan"))
    skip = ("goal", "ego_extra", "ego_active")
    inputs = dict(collided=collided, offroad=offroad, t_index=t_index, t_time=t_time, last_reward=last_reward)
    new_written = observations_cpu_state(
        **{k: v for k, v in kw.items() if k not in skip}, goal=st.goal, ego_inputs=inputs, controlled=controlled,
        written=written, out=got[..., :D], zero_tail=3, check=check)
    assert torch.equal(new_written, flat)
    assert_same_obs(got, want)
    assert torch.isnan(got.view(W * C, -1)[~(flat | written)]).all()  # rows not listed are untouched
    # the pack/config arguments computed once (the env caches them per pack): the same result
    static = observations_cpu_static(road_seg=kw["road_seg"], road_type=kw["road_type"], grid_road=kw["grid_road"],
                                     grid_start=kw.get("grid_start"), grid_origin=kw["grid_origin"],
                                     grid_dims=kw["grid_dims"], cell_size=kw["cell_size"],
                                     num_partners=kw["num_partners"], partner_radius=kw["partner_radius"],
                                     road_radius=kw["road_radius"], A=A, C=C)
    again = torch.full((W, C, D + 5), float("nan"))
    observations_cpu_state(
        **{k: v for k, v in kw.items() if k not in skip}, goal=st.goal, ego_inputs=inputs, controlled=controlled,
        written=written, out=again[..., :D], zero_tail=3, check=check, static=static)
    assert torch.equal(again.nan_to_num(7.0), got.nan_to_num(7.0))
    with pytest.raises(ValueError, match="controlled"):
        observations_cpu_state(**{k: v for k, v in kw.items() if k not in skip}, goal=st.goal, ego_inputs=inputs,
                               controlled=controlled[:, :C], written=written, out=got[..., :D])
    # the ego inputs by name (tables.EGO_INPUTS): a missing one, or one of the wrong shape, is named
    with pytest.raises(ValueError, match="ego_inputs must name"):
        observations_cpu_state(**{k: v for k, v in kw.items() if k not in skip}, goal=st.goal,
                               ego_inputs={k: v for k, v in inputs.items() if k != "offroad"},
                               controlled=controlled, written=written, out=got[..., :D])
    with pytest.raises(ValueError, match="last_reward must be a torch.float32 tensor of shape"):
        observations_cpu_state(**{k: v for k, v in kw.items() if k not in skip}, goal=st.goal,
                               ego_inputs={**inputs, "last_reward": last_reward[:, :-1]},
                               controlled=controlled, written=written, out=got[..., :D])


def test_ego_inputs_are_the_state_fields_named_in_the_table(pack):
    """``tables.ego_inputs``: each ego input is the state field its ``EGO_INPUTS`` entry names (the
    observe stage passes no field by position), the trial clock as given; a missing clock is an error."""
    from gpusim.kernels.observations.tables import EGO_INPUTS, ego_inputs

    env = DriveEnv(pack, 2, EnvConfig(max_controlled=8, num_signals=0), seed=1)
    clock = torch.zeros(2)
    got = ego_inputs(env.state, t_index=clock, t_time=None)
    assert list(got) == list(EGO_INPUTS) == ["collided", "offroad", "t_index", "t_time", "last_reward"]
    assert got["collided"] is env.state.collided_now and got["offroad"] is env.state.offroad_now
    assert got["last_reward"] is env.state.last_reward and got["t_index"] is clock and got["t_time"] is None
    with pytest.raises(ValueError, match="the stage computes"):
        ego_inputs(env.state, t_index=clock)
