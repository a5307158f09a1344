"""Action coding, kinematic bicycle, inverse dynamics and the Triton math helpers."""

import math

import pytest
import torch
import triton
import triton.language as tl

from gpusim.backend import use_backend
from gpusim.kernels import dynamics as D
from gpusim.kernels import trimath
from gpusim.kernels.trimath import wrap_angle_torch
from synthetic import KERNEL_DEVICE, backend_device, to_cpu, to_kernel_device

DT = 0.1


def _state(W, A, seed=0):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randn(W, A, 2, generator=g) * 50
    heading = (torch.rand(W, A, generator=g) * 2 - 1) * math.pi
    speed = torch.rand(W, A, generator=g) * 20
    length = 1 + torch.rand(W, A, generator=g) * 5
    return g, pos, heading, speed, length


# ----------------------------------------------------------------------------- constants / coding
def test_action_grid_constants():
    assert D.NUM_ACTIONS == 91 == D.NUM_ACCEL * D.NUM_STEER
    assert D.ACCEL_VALUES == (-4.0, -2.667, -1.333, 0.0, 1.333, 2.667, 4.0)
    assert len(D.STEER_VALUES) == 13 and D.STEER_VALUES[0] == -1.0 and D.STEER_VALUES[-1] == 1.0
    assert D.STEER_VALUES[6] == 0.0
    assert all(abs((b - a) - 1 / 6) < 1e-5 for a, b in zip(D.STEER_VALUES, D.STEER_VALUES[1:]))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_decode_encode_roundtrip_discrete(dtype):
    k = torch.arange(91, dtype=dtype).reshape(7, 13)
    accel, steer = D.decode_actions(k, 0)
    assert accel.dtype == steer.dtype == torch.float32
    # joint index = accel_idx * 13 + steer_idx
    assert accel[2, 5] == pytest.approx(D.ACCEL_VALUES[2]) and steer[2, 5] == pytest.approx(D.STEER_VALUES[5])
    assert torch.equal(D.encode_actions(accel, steer, 0), k.long())
    # nearest grid point for off-grid controls
    a2, s2 = D.decode_actions(D.encode_actions(torch.tensor([[3.5, -0.1]]), torch.tensor([[0.45, -0.99]]), 0), 0)
    assert a2.tolist()[0] == pytest.approx([4.0, 0.0]) and s2.tolist()[0] == pytest.approx([0.5, -1.0])


def test_decode_encode_continuous():
    a = torch.tensor([[[-1.0, 1.0], [0.5, -0.25], [2.0, -3.0]]])
    accel, steer = D.decode_actions(a, 1)
    assert accel.tolist()[0] == pytest.approx([-4.0, 2.0, 4.0])
    assert steer.tolist()[0] == pytest.approx([1.0, -0.25, -1.0])
    back = D.encode_actions(accel, steer, 1)
    assert torch.allclose(back, a.clamp(-1, 1))


def _decode_seed(actions):
    """The former per-call decoding (tables built from Python data on every call), for bit-identity."""
    k = actions.long().clamp(0, D.NUM_ACTIONS - 1)
    av = torch.tensor(D.ACCEL_VALUES, dtype=torch.float32)
    sv = torch.tensor(D.STEER_VALUES, dtype=torch.float32)
    return av[k // D.NUM_STEER], sv[k % D.NUM_STEER]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_decode_bit_identical_to_per_call_tables(dtype):
    k = torch.randint(-5, 100, (9, 17), generator=torch.Generator().manual_seed(1)).to(dtype)
    for got, want in zip(D.decode_actions(k, 0), _decode_seed(k)):
        assert got.dtype == torch.float32 and torch.equal(got, want)
    g = torch.Generator().manual_seed(2)
    accel, steer = torch.randn(9, 17, generator=g) * 4, torch.randn(9, 17, generator=g)
    av = torch.tensor(D.ACCEL_VALUES, dtype=torch.float32)
    sv = torch.tensor(D.STEER_VALUES, dtype=torch.float32)
    want = (accel[..., None] - av).abs().argmin(-1) * D.NUM_STEER + (steer[..., None] - sv).abs().argmin(-1)
    assert torch.equal(D.encode_actions(accel, steer, 0), want)


class _SyncOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Collects the aten ops that read device data on the host or build tensors from Python data."""

    # lift_fresh: torch.tensor(python data); the others read device values on the host
    WATCH = ("_local_scalar_dense", "item", "nonzero", "lift_fresh", "masked_select")

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.WATCH:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_action_coding_and_expert_path_build_no_tensors_per_call(backend):
    """After a first call per device, decode/encode/inverse_bicycle issue no op that would be a
    host sync or a host-to-device copy on CUDA (tables cached per device)."""
    g, pos, heading, speed, length = _state(3, 5)
    tpos = pos + torch.randn(3, 5, 2, generator=g)
    valid = torch.rand(3, 5, generator=g) < 0.8
    k = torch.randint(0, 91, (3, 5), generator=g)
    k32 = k.int()
    cont = torch.rand(3, 5, 2, generator=g) * 2 - 1
    dev = backend_device(backend)
    pos, heading, speed, length, tpos, valid, k, k32, cont = (
        x.to(dev) for x in (pos, heading, speed, length, tpos, valid, k, k32, cont))

    def calls():
        D.decode_actions(k, 0)
        D.decode_actions(k32, 0)
        D.decode_actions(cont, 1)
        a, s = D.inverse_bicycle(pos, heading, speed, length, tpos, heading, speed, valid, DT)
        D.encode_actions(a, s, 0)
        D.encode_actions(a, s, 1)

    with use_backend(backend):
        calls()  # first call: builds the cached tables
        assert D.action_tables(torch.device(dev.type)) is D.action_tables(str(dev))
        with _SyncOps() as mode:
            calls()
    assert mode.seen == []


def test_decode_rejects_wrong_dtype():
    with pytest.raises(ValueError, match="int32/int64"):
        D.decode_actions(torch.zeros(2, 3), 0)
    with pytest.raises(ValueError, match="continuous"):
        D.decode_actions(torch.zeros(2, 3, dtype=torch.long), 1)
    with pytest.raises(ValueError, match="action_space"):
        D.decode_actions(torch.zeros(2, 3, dtype=torch.long), 7)


# ----------------------------------------------------------------------------- bicycle, by hand
def _one(x=0.0, y=0.0, h=0.0, v=10.0, L=4.0, a=0.0, d=0.0, moving=True, device="cpu"):
    t = lambda val: torch.tensor([[val]], dtype=torch.float32, device=device)  # noqa: E731
    return (torch.tensor([[[x, y]]], device=device), t(h), t(v), t(L), t(a), t(d),
            torch.tensor([[moving]], device=device))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_straight_line_constant_speed(backend):
    state = _one(h=0.3, v=10.0, device=backend_device(backend))
    pos, h, v = state[0], state[1], state[2]
    with use_backend(backend):
        for _ in range(10):
            pos, h, v = D.bicycle_step(pos, h, v, *state[3:], DT)
    assert v.item() == pytest.approx(10.0)
    assert h.item() == pytest.approx(0.3)
    assert pos[0, 0].tolist() == pytest.approx([10 * math.cos(0.3), 10 * math.sin(0.3)], abs=1e-4)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_constant_steer_yaw_rate(backend):
    v0, L, d = 5.0, 4.0, 0.4
    beta = math.atan(0.5 * math.tan(d))
    omega = v0 * math.cos(beta) * math.tan(d) / L
    state = _one(v=v0, L=L, d=d, device=backend_device(backend))
    pos, h, v = state[0], state[1], state[2]
    with use_backend(backend):
        p1, h1, v1 = D.bicycle_step(pos, h, v, *state[3:], DT)
    assert h1.item() == pytest.approx(omega * DT, rel=1e-5)
    assert p1[0, 0].tolist() == pytest.approx([v0 * DT * math.cos(beta), v0 * DT * math.sin(beta)], rel=1e-5)
    # a full circle: constant yaw rate, the centre stays on a circle of radius v / omega
    n = int(round(2 * math.pi / (omega * DT)))
    pts = [pos]
    with use_backend(backend):
        for _ in range(n):
            pos, h, v = D.bicycle_step(pos, h, v, *state[3:], DT)
            pts.append(pos)
    pts = torch.cat(pts, 0)[:, 0]
    centre = pts.mean(0)
    r = (pts - centre).norm(dim=-1)
    assert r.std() / r.mean() < 0.01
    # chord-based radius of the discrete orbit: step length / (2 sin(omega dt / 2))
    expect = v0 * DT / (2 * math.sin(omega * DT / 2))
    assert r.mean().item() == pytest.approx(expect, rel=0.01)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_speed_clipping_and_no_reverse(backend):
    dev = backend_device(backend)
    state = _one(v=0.2, a=-4.0, device=dev)
    with use_backend(backend):
        p, h, v = D.bicycle_step(*state, DT)
        assert v.item() == 0.0 and torch.equal(p, state[0])  # braking stops the car, never reverses
        p, h, v = D.bicycle_step(*_one(v=99.9, a=4.0, device=dev), DT)
        assert v.item() == pytest.approx(D.MAX_SPEED)
        p, h, v = D.bicycle_step(*_one(v=1.0, a=40.0, device=dev), DT)  # accel clipped to +4
        assert v.item() == pytest.approx(1.4)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_not_moving_is_untouched(backend):
    g, pos, heading, speed, length = _state(3, 37)
    accel = torch.randn(3, 37, generator=g) * 4
    steer = torch.randn(3, 37, generator=g)
    moving = torch.rand(3, 37, generator=g) > 0.5
    pos[0, 0] = float("nan")  # a NaN in a still agent must not leak anywhere
    moving[0, 0] = False
    dev = backend_device(backend)
    with use_backend(backend):
        p, h, v = to_cpu(D.bicycle_step(*(x.to(dev) for x in (pos, heading, speed, length, accel, steer, moving)), DT))
    still = ~moving
    assert torch.equal(p[still][1:], pos[still][1:]) and torch.equal(h[still], heading[still])
    assert torch.equal(v[still], speed[still])
    assert not torch.equal(p[moving], pos[moving])
    assert torch.isfinite(p[moving]).all()


def test_heading_wrapped():
    p, h, v = D.bicycle_step(*_one(h=math.pi - 0.01, v=10.0, d=1.0), DT)
    assert -math.pi < h.item() <= math.pi and h.item() < 0
    x = torch.tensor([math.pi, -math.pi, 3 * math.pi, 0.0, -7.0])
    w = wrap_angle_torch(x)
    assert ((w > -math.pi) & (w <= math.pi)).all()
    assert torch.allclose(torch.cos(w), torch.cos(x), atol=1e-5) and torch.allclose(torch.sin(w), torch.sin(x), atol=1e-5)


# ----------------------------------------------------------------------------- inverse dynamics
def test_inverse_reproduces_reachable_step():
    """For a target produced by bicycle_step within the limits, the inverse recovers the controls."""
    g, pos, heading, speed, length = _state(4, 33, seed=3)
    # targets >= 0.26 m ahead (beyond TRACK_LOOKAHEAD); from a standstill steering is unobservable
    speed = speed.clamp_min(3.0)
    accel = (torch.rand(4, 33, generator=g) * 2 - 1) * 3.9
    steer = (torch.rand(4, 33, generator=g) * 2 - 1) * 0.95
    moving = torch.ones(4, 33, dtype=torch.bool)
    tp, th, tv = D.bicycle_step(pos, heading, speed, length, accel, steer, moving, DT)
    a2, s2 = D.inverse_bicycle(pos, heading, speed, length, tp, th, tv, moving, DT)
    assert torch.allclose(s2, steer, atol=2e-3)
    p2, _, _ = D.bicycle_step(pos, heading, speed, length, a2, s2, moving, DT)
    assert (p2 - tp).norm(dim=-1).max() < 2e-3


def test_inverse_limits_and_invalid_targets():
    g, pos, heading, speed, length = _state(2, 21, seed=4)
    tpos = pos + torch.randn(2, 21, 2, generator=g) * 30  # mostly unreachable
    th = heading + torch.randn(2, 21, generator=g)
    tv = torch.rand(2, 21, generator=g) * 30
    valid = torch.rand(2, 21, generator=g) > 0.3
    a, s = D.inverse_bicycle(pos, heading, speed, length, tpos, th, tv, valid, DT)
    assert a.abs().max() <= D.MAX_ACCEL and s.abs().max() <= D.MAX_STEER
    assert (a[~valid] == 0).all() and (s[~valid] == 0).all()
    assert torch.isfinite(a).all() and torch.isfinite(s).all()


def test_inverse_catches_up_without_overshoot():
    """An agent 10 m behind a target moving at 10 m/s closes the gap and settles, no oscillation."""
    x, v = torch.zeros(1, 1, 2), torch.full((1, 1), 10.0)
    h, L = torch.zeros(1, 1), torch.full((1, 1), 4.0)
    ok = torch.ones(1, 1, dtype=torch.bool)
    gaps = []
    for t in range(80):
        target = torch.tensor([[[10.0 + 10.0 * (t + 1) * DT, 0.0]]])
        a, s = D.inverse_bicycle(x, h, v, L, target, h, torch.full((1, 1), 10.0), ok, DT)
        x, h, v = D.bicycle_step(x, h, v, L, a, s, ok, DT)
        gaps.append(float(target[0, 0, 0] - x[0, 0, 0]))
    assert abs(gaps[-1]) < 0.01
    assert min(gaps) > -0.05  # never passes the target by more than 5 cm
    assert abs(v.item() - 10.0) < 0.05


# ----------------------------------------------------------------------------- Triton vs reference
@pytest.mark.parametrize("shape", [(3, 37), (1, 1), (2, 700)])
def test_bicycle_kernel_matches_reference(shape):
    W, A = shape
    g, pos, heading, speed, length = _state(W, A, seed=W * A)
    accel = torch.randn(W, A, generator=g) * 5
    steer = torch.randn(W, A, generator=g)
    moving = torch.rand(W, A, generator=g) > 0.2
    ref = D.bicycle_step_reference(pos, heading, speed, length, accel, steer, moving, DT)
    with use_backend("triton"):
        out = to_cpu(D.bicycle_step(*to_kernel_device((pos, heading, speed, length, accel, steer, moving)), DT))
    for r, o in zip(ref, out):
        assert not torch.isnan(o).any()
        assert torch.allclose(o, r, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("shape", [(3, 37), (2, 700)])
def test_inverse_kernel_matches_reference(shape):
    W, A = shape
    g, pos, heading, speed, length = _state(W, A, seed=7 + W)
    tpos = pos + torch.randn(W, A, 2, generator=g) * 2
    th = heading + torch.randn(W, A, generator=g) * 0.2
    tv = torch.rand(W, A, generator=g) * 20
    valid = torch.rand(W, A, generator=g) > 0.2
    ref = D.inverse_bicycle_reference(pos, heading, speed, length, tpos, th, tv, valid, DT)
    with use_backend("triton"):
        out = to_cpu(D.inverse_bicycle(*to_kernel_device((pos, heading, speed, length, tpos, th, tv, valid)), DT))
    for r, o in zip(ref, out):
        assert not torch.isnan(o).any()
        assert torch.allclose(o, r, atol=2e-4, rtol=1e-4)


def test_kernel_launcher_rejects_bad_input():
    g, pos, heading, speed, length = to_kernel_device(_state(2, 5))
    z = torch.zeros(2, 5, device=KERNEL_DEVICE)
    ok = torch.ones(2, 5, dtype=torch.bool, device=KERNEL_DEVICE)
    with use_backend("triton"):
        with pytest.raises(ValueError, match="speed"):
            D.bicycle_step(pos, heading, speed[:, :4], length, z, z, ok, DT)
        with pytest.raises(ValueError, match="moving must be bool"):
            D.bicycle_step(pos, heading, speed, length, z, z, ok.float(), DT)
        with pytest.raises(ValueError, match="float32"):
            D.inverse_bicycle(pos.double(), heading, speed, length, pos, heading, speed, ok, DT)


# ----------------------------------------------------------------------------- trimath
@triton.jit
def _math_probe_kernel(y_ptr, x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    y = tl.load(y_ptr + offs, mask=m, other=0.0)
    x = tl.load(x_ptr + offs, mask=m, other=1.0)
    tl.store(out_ptr + 5 * offs, trimath.atan2(y, x), mask=m)
    tl.store(out_ptr + 5 * offs + 1, trimath.atan(y), mask=m)
    tl.store(out_ptr + 5 * offs + 2, trimath.tanh(y), mask=m)
    tl.store(out_ptr + 5 * offs + 3, trimath.wrap_angle(y * 3.0), mask=m)
    tl.store(out_ptr + 5 * offs + 4, trimath.tan(x * 0.25), mask=m)


def test_trimath_helpers_accuracy():
    g = torch.Generator().manual_seed(0)
    n = 4001
    y = torch.randn(n, generator=g) * 5
    x = torch.randn(n, generator=g) * 5
    y[:8] = torch.tensor([0.0, 0.0, 1.0, -1.0, 0.0, 2.0, -3.0, 1e-8])
    x[:8] = torch.tensor([0.0, -1.0, 0.0, 0.0, 2.0, -2.0, -1e-8, -5.0])
    out = torch.full((n, 5), float("nan"), device=KERNEL_DEVICE)
    _math_probe_kernel[(1,)](*to_kernel_device((y, x)), out, n, BLOCK=4096)
    out = out.cpu()
    assert not torch.isnan(out).any()
    assert torch.allclose(out[:, 0], torch.atan2(y, x), atol=3e-7)
    assert torch.allclose(out[:, 1], torch.atan(y), atol=3e-7)
    assert torch.allclose(out[:, 2], torch.tanh(y), atol=3e-7)
    assert torch.allclose(out[:, 3], wrap_angle_torch(y * 3.0), atol=1e-6)
    assert torch.allclose(out[:, 4], torch.tan(x * 0.25), rtol=1e-5, atol=1e-6)
