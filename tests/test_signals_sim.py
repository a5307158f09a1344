"""Traffic signals in the simulator (docs/signals.md): the signal observation block and the
red-light violation test (torch reference vs Triton), the log clock (trial restart, past the log),
the metric and the optional penalty on crafted scenes, and the bundled real TFRecord scenario."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from gpusim.backend import interpreter_active, use_backend
from gpusim.config import EnvConfig
from gpusim.enums import SignalState
from gpusim.env import DriveEnv
from gpusim.kernels.obs_layout import SIGNAL_FEATURES, obs_layout
from gpusim.kernels.signals import (
    SIGNAL_DIM,
    red_light_violation,
    red_light_violation_reference,
    signal_observations,
    signal_observations_reference,
)
from tests.synthetic import driver, lane, small_config, synthetic_pack, to_cpu, to_kernel_device

ROOT = Path(__file__).resolve().parents[1]
TFRECORD = ROOT / "data" / "womd_tfrecord" / "motion_data_one_scenario.tfrecord.gz"
triton_only = pytest.mark.skipif(not interpreter_active() and not torch.cuda.is_available(),
                                 reason="needs the Triton interpreter or CUDA")
F = {name.split("/")[0]: i for i, name in enumerate(SIGNAL_FEATURES)}


def _signals(S=2, T=7, L=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    sp = torch.rand(S, L, 2, generator=g) * 40 - 20
    sp[0, 1] = sp[0, 0]  # an exact tie (two lanes sharing a stop point)
    ang = torch.rand(S, L, generator=g) * 6.28
    sd = torch.stack([ang.cos(), ang.sin()], -1)
    sd[0, L - 1] = 0.0  # a lane not in the map
    st = torch.randint(0, 9, (S, T, L), generator=g).to(torch.int8)
    sv = torch.rand(S, T, L, generator=g) > 0.2
    st = torch.where(sv, st, torch.zeros_like(st))
    ns = torch.tensor([L] + [max(1, L - 2)] * (S - 1), dtype=torch.int32)
    return dict(signal_pos=sp, signal_dir=sd, signal_state=st, signal_valid=sv, num_signals=ns), g


# ----------------------------------------------------------------------------- kernels
@triton_only
@pytest.mark.parametrize("W,C,N,L", [(3, 5, 1, 6), (2, 7, 3, 5), (1, 3, 8, 6), (4, 1, 16, 3)])
def test_signal_observations_triton_matches_reference(W, C, N, L):
    sig, g = _signals(L=L)
    pos = torch.rand(W, C, 2, generator=g) * 40 - 20
    pos[0, 0] = sig["signal_pos"][0, 0]  # a signal exactly at the agent's centre
    args = dict(pos=pos, heading=torch.rand(W, C, generator=g) * 6 - 3, active=torch.rand(W, C, generator=g) > 0.2,
                scenario=torch.randint(0, 2, (W,), generator=g), log_index=torch.tensor([0, 3, 9, -1][:W]).int(),
                num_obs=N, radius=25.0, **sig)
    D = 5 + N * SIGNAL_DIM + 4
    ref = signal_observations_reference(**args, out=torch.full((W, C, D), float("nan")), offset=5)
    with use_backend("triton"):
        tri = to_cpu(signal_observations(**to_kernel_device(args), out=to_kernel_device(torch.full((W, C, D), float("nan"))),
                                         offset=5))
    blk = slice(5, 5 + N * SIGNAL_DIM)
    assert not ref[..., blk].isnan().any() and not tri[..., blk].isnan().any()  # every column written
    assert ref[..., :5].isnan().all() and tri[..., 5 + N * SIGNAL_DIM:].isnan().all()  # nothing else
    torch.testing.assert_close(tri[..., blk], ref[..., blk], atol=1e-6, rtol=0)
    # against a direct per-slot computation
    slots = ref[..., blk].view(W, C, N, SIGNAL_DIM)
    for w in range(W):
        s = int(args["scenario"][w])
        for c in range(C):
            if not args["active"][w, c]:
                assert (slots[w, c] == 0).all()
                continue
            n = int(sig["num_signals"][s])
            d = (sig["signal_pos"][s, :n] - pos[w, c]).norm(dim=-1)
            near = [int(i) for i in torch.argsort(d, stable=True) if d[i] <= 25.0][:N]
            assert int(slots[w, c, :, -1].sum()) == len(near)
            assert (slots[w, c, len(near):] == 0).all()
            h = float(args["heading"][w, c])
            for k, i in enumerate(near):
                rel = sig["signal_pos"][s, i] - pos[w, c]
                ex = (rel[0] * math.cos(h) + rel[1] * math.sin(h)) / 25.0
                assert abs(float(slots[w, c, k, F["stop_x"]]) - float(ex)) < 1e-5
                assert float(slots[w, c, k, 4:10].sum()) >= 1.0  # one group, maybe a flag


def test_signal_state_groups_and_past_log():
    """Each of the nine codes gives its group one-hot and flags; past the log = unknown."""
    L = 9
    sig = dict(signal_pos=torch.zeros(1, L, 2), signal_dir=torch.tensor([[1.0, 0.0]]).repeat(1, L, 1).view(1, L, 2),
               signal_state=torch.arange(9, dtype=torch.int8).view(1, 1, L).repeat(1, 3, 1),
               signal_valid=torch.ones(1, 3, L, dtype=torch.bool), num_signals=torch.tensor([L], dtype=torch.int32))
    base = dict(pos=torch.tensor([[[0.0, 0.0]]]), heading=torch.zeros(1, 1), active=torch.ones(1, 1, dtype=torch.bool),
                scenario=torch.zeros(1, dtype=torch.int64), num_obs=L, radius=10.0, **sig)
    out = signal_observations_reference(**base, log_index=torch.tensor([1])).view(L, SIGNAL_DIM)
    want = {  # code: (unknown, stop, caution, go, arrow, flashing)
        0: (1, 0, 0, 0, 0, 0), 1: (0, 1, 0, 0, 1, 0), 2: (0, 0, 1, 0, 1, 0), 3: (0, 0, 0, 1, 1, 0),
        4: (0, 1, 0, 0, 0, 0), 5: (0, 0, 1, 0, 0, 0), 6: (0, 0, 0, 1, 0, 0), 7: (0, 1, 0, 0, 0, 1),
        8: (0, 0, 1, 0, 0, 1)}
    for code, groups in want.items():  # all at the same point: ties keep the signal index order
        assert tuple(out[code, 4:10].tolist()) == groups, code
        assert out[code, F["dir_cos"]] == 1.0 and out[code, -1] == 1.0
    past = signal_observations_reference(**base, log_index=torch.tensor([3])).view(L, SIGNAL_DIM)
    assert (past[:, F["is_unknown"]] == 1).all() and (past[:, 5:10] == 0).all() and (past[:, -1] == 1).all()


def _crossing_case(W=5, C=7, L=5, seed=1):
    sig, g = _signals(S=2, T=4, L=L, seed=seed)
    codes = torch.tensor([4, 1, 4, 6, 7, 0, 2], dtype=torch.int8)  # mostly red, some other states
    sig["signal_state"][:] = codes[torch.randint(0, len(codes), sig["signal_state"].shape, generator=g)]
    sig["signal_valid"][:] = True
    s = torch.randint(0, 2, (W,), generator=g)
    pick = torch.randint(0, L, (W, C), generator=g)
    sp, sd = sig["signal_pos"][s[:, None], pick], sig["signal_dir"][s[:, None], pick]
    perp = torch.stack([-sd[..., 1], sd[..., 0]], -1)
    lat = (torch.rand(W, C, 1, generator=g) * 5 - 2.5)
    a = sp + perp * lat - sd * torch.rand(W, C, 1, generator=g) * 2
    b = sp + perp * lat + sd * (torch.rand(W, C, 1, generator=g) * 2 - 0.5)
    heading = torch.atan2(sd[..., 1], sd[..., 0]) + torch.rand(W, C, generator=g) * 2.4 - 1.2
    return dict(pos_before=a.contiguous(), pos=b.contiguous(), heading=heading.contiguous(),
                moving=torch.rand(W, C, generator=g) > 0.1, scenario=s,
                log_index=torch.randint(0, 4, (W,), generator=g), **sig)


@triton_only
@pytest.mark.parametrize("W,C,L", [(5, 7, 5), (3, 3, 9), (2, 13, 3)])
def test_red_light_triton_matches_reference(W, C, L):
    args = _crossing_case(W, C, L)
    ref = red_light_violation_reference(**args)
    assert ref.any() and not ref.all()
    with use_backend("triton"):
        tri = to_cpu(red_light_violation(**to_kernel_device(args)))
    assert torch.equal(ref, tri)


@pytest.mark.parametrize("backend", ["torch", "triton", "c"])  # every backend of the op
def test_red_light_geometry(backend):
    """Behind -> beyond on red flags; green, flashing red, sideways, reversing, outside the
    half-width, a lane not in the map, not moving: no flag."""
    def one(before, after, heading=0.0, code=4, d=(1.0, 0.0), moving=True, li=0):
        sig = dict(signal_pos=torch.zeros(1, 1, 2), signal_dir=torch.tensor([[d]]),
                   signal_state=torch.full((1, 2, 1), code, dtype=torch.int8),
                   signal_valid=torch.ones(1, 2, 1, dtype=torch.bool), num_signals=torch.ones(1, dtype=torch.int32))
        kw = dict(pos_before=torch.tensor([[before]]), pos=torch.tensor([[after]]), heading=torch.tensor([[heading]]),
                  moving=torch.tensor([[moving]]), scenario=torch.zeros(1, dtype=torch.int64),
                  log_index=torch.tensor([li]), **sig)
        if backend == "triton":
            kw = to_kernel_device(kw)
        return bool(to_cpu(red_light_violation(**kw, backend=backend))[0, 0])
    assert one((-1.0, 0.5), (0.5, 0.5))                    # red: crossing
    assert one((-1.0, 0.0), (0.0, 0.0))                    # landing on the line counts (once)
    assert not one((0.0, 0.0), (1.0, 0.0))                 # ... and leaving it does not again
    assert one((-1.0, 0.0), (1.0, 0.0), code=1)            # red arrow
    assert not one((-1.0, 0.0), (1.0, 0.0), code=6)        # green
    assert not one((-1.0, 0.0), (1.0, 0.0), code=7)        # flashing red = stop sign
    assert not one((-1.0, 0.0), (1.0, 0.0), code=0)        # unknown
    assert not one((1.0, 0.0), (-1.0, 0.0), heading=math.pi)  # reversing across it
    assert not one((-1.0, 0.0), (1.0, 0.0), heading=1.2)   # heading 69 deg off the lane
    assert not one((-1.0, 2.0), (1.0, 2.0))                # beside the lane (2 m > 1.75 m)
    assert not one((-1.0, 0.0), (1.0, 0.0), d=(0.0, 0.0))  # lane not in the map
    assert not one((-1.0, 0.0), (1.0, 0.0), moving=False)
    assert not one((-1.0, 0.0), (1.0, 0.0), li=2)          # past the log: unknown


# ----------------------------------------------------------------------------- env, crafted scenes
def _scene_pack(code_at, **data_kw):
    """One car driving along +x at 8 m/s from x = -20 (crossing x = 0 between steps 25 and 26),
    a parked car far away, one signal with its stop point at the origin; ``code_at(t)`` gives the
    state at log step t."""
    cfg = small_config(**data_kw)
    pack = synthetic_pack([{"agents": [driver(-20.0, 0.0, 0.0, 8.0, (50.0, 0.0)),
                                       driver(-20.0, 40.0, 0.0, 0.0, (-20.0, 40.0))],
                            "num_controlled": 1, "roads": lane(-60, 100, 0.0) + lane(-60, 100, 40.0)}], cfg)
    T = pack.traj_pos.shape[2]
    pack.signal_lane = torch.tensor([[7]], dtype=torch.int32)
    pack.signal_pos = torch.zeros(1, 1, 2)
    pack.signal_dir = torch.tensor([[[1.0, 0.0]]])
    pack.signal_state = torch.tensor([int(code_at(t)) for t in range(T)], dtype=torch.int8).view(1, T, 1)
    pack.signal_valid = torch.ones(1, T, 1, dtype=torch.bool)
    pack.num_signals = torch.ones(1, dtype=torch.int32)
    pack.validate()
    return pack, cfg


def _expert_run(pack, cfg, **env_kw):
    config = EnvConfig(max_agents=cfg.max_agents, max_controlled=cfg.max_controlled, num_roads=cfg.grid_k,
                       num_partners=2, goal_behavior="respawn", scenario_length=40, **env_kw)
    env = DriveEnv(pack, num_worlds=1, config=config, seed=0)
    env.reset()
    rewards, reds, obs = [], [], []
    for _ in range(config.horizon):
        r = env.step(env.expert_actions())
        rewards.append(float(r.reward[0, 0]))
        reds.append(bool(env.state.red_light_now[0, 0]))
        obs.append(r.obs[0, 0].clone())
    return env, rewards, reds, obs


@pytest.mark.parametrize("code,expected", [(SignalState.STOP, 1.0), (SignalState.ARROW_STOP, 1.0),
                                           (SignalState.GO, 0.0), (SignalState.FLASHING_STOP, 0.0)])
def test_crafted_crossing_metric(code, expected):
    pack, cfg = _scene_pack(lambda t: code)
    env, rewards, reds, _ = _expert_run(pack, cfg)
    assert sum(reds) == int(expected) and (not expected or reds.index(True) == 25)
    assert env.metrics(kind="mean")["red_light_violation"] == expected


def test_penalty_only_when_set():
    pack, cfg = _scene_pack(lambda t: SignalState.STOP)
    _, base, reds, _ = _expert_run(pack, cfg)
    _, pen, _, _ = _expert_run(pack, cfg, reward_red_light=-0.75)
    i = reds.index(True)
    assert pen[i] == pytest.approx(base[i] - 0.75)
    assert [b for j, b in enumerate(base) if j != i] == [p for j, p in enumerate(pen) if j != i]
    green, _ = _scene_pack(lambda t: SignalState.GO)
    _, g0, _, _ = _expert_run(green, cfg)
    _, g1, _, _ = _expert_run(green, cfg, reward_red_light=-0.75)
    assert g0 == g1


def test_signal_clock_restarts_with_each_trial():
    """The signal block replays the log from init_steps again in every trial."""
    pack, cfg = _scene_pack(lambda t: SignalState.GO if (t // 3) % 2 else SignalState.STOP, init_steps=4)
    config = EnvConfig(max_agents=cfg.max_agents, max_controlled=cfg.max_controlled, num_roads=cfg.grid_k,
                       num_partners=2, goal_behavior="trial", k_trials=2, scenario_length=10, init_steps=4)
    env = DriveEnv(pack, num_worlds=1, config=config, seed=0)
    lay = env.obs_layout
    first = env.reset()[0, 0, lay.signals].view(-1, SIGNAL_DIM)[0].clone()  # the buffer is reused
    seen = [first]
    for _ in range(config.horizon - 1):
        r = env.step(torch.zeros(1, config.max_controlled, dtype=torch.int64))
        seen.append(r.obs[0, 0, lay.signals].view(-1, SIGNAL_DIM)[0].clone())
    stop = [bool(s[F["is_stop"]]) for s in seen]
    want = [((4 + t) // 3) % 2 == 0 for t in range(10)]
    assert stop == want + want


# ----------------------------------------------------------------------------- real scenario
@pytest.fixture(scope="module")
def tfrecord_pack():
    assert TFRECORD.exists(), f"bundled TFRecord scenario missing: {TFRECORD} (part of the repository)"
    from gpusim.data import ScenarioPack
    return ScenarioPack.from_json([str(TFRECORD)])


def test_real_scenario_signal_block_and_expert_rate(tfrecord_pack):
    """The bundled WOMD record (12 signals): observed signals are the nearest within the radius,
    and logged (expert) driving runs no red light."""
    pack = tfrecord_pack
    assert int(pack.num_signals[0]) == 12
    env = DriveEnv(pack, num_worlds=1, config=EnvConfig(), seed=0)
    lay = env.obs_layout
    assert lay == obs_layout(31, 128, 16) and lay.obs_dim == 1632 + 16 * SIGNAL_DIM
    obs = env.reset()
    blk = obs[0, :, lay.signals].view(env.num_slots, 16, SIGNAL_DIM)
    active = env.state.slot_active[0]
    assert (blk[~active] == 0).all()
    for c in torch.nonzero(active).flatten().tolist():
        valid = blk[c, :, -1]
        n = int(valid.sum())
        assert valid[:n].eq(1).all() and (blk[c, n:] == 0).all()  # valid slots first, padding zero
        d = blk[c, :n, :2].norm(dim=-1)
        assert (d[1:] >= d[:-1] - 1e-6).all() and (d <= 1.0 + 1e-6).all()  # nearest first, within radius
        want = int(((pack.signal_pos[0, :12] - env.state.pos[0, c]).norm(dim=-1) <= 50.0).sum())
        assert n == min(16, want)
    for _ in range(env.config.horizon):
        env.step(env.expert_actions())
    m = env.metrics(kind="mean")
    assert m["n"] == int(active.sum()) and m["red_light_violation"] == 0.0


# ----------------------------------------------------------------------------- policy
def test_policy_encodes_valid_signal_slots_only():
    from policy import ObsDims
    from policy.encoders import ObsEncoder

    lay = obs_layout(3, 4, 5)
    dims = ObsDims.from_layout(lay)
    assert dims.num_signals == 5 and dims.signal_dim == SIGNAL_DIM and dims.obs_dim == lay.obs_dim
    assert ObsDims.from_layout(obs_layout(3, 4)).num_signals == 0  # no block: no signal encoder
    assert ObsEncoder(ObsDims.from_layout(obs_layout(3, 4)), d_model=16, hidden=8).signal_set is None
    torch.manual_seed(0)
    enc = ObsEncoder(dims, d_model=16, hidden=8)
    obs = torch.randn(2, lay.obs_dim)
    sig = obs[:, lay.signals].view(2, 5, SIGNAL_DIM)
    sig[..., -1] = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0])
    base = enc(obs)
    pad = obs.clone()
    pad[:, lay.signals].view(2, 5, SIGNAL_DIM)[:, 3, :-1] = 7.0  # a padding slot's contents
    torch.testing.assert_close(enc(pad), base)
    moved = obs.clone()
    moved[:, lay.signals].view(2, 5, SIGNAL_DIM)[:, 0, 0] += 3.0  # a valid slot's position
    assert not torch.allclose(enc(moved), base)
