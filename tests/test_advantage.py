"""GAE / V-trace advantage: torch reference vs a plain Python double loop, contract properties,
bad input, and the Triton kernel (interpreter on CPU) vs the reference."""

from __future__ import annotations

import math

import pytest
import torch

from gpusim.backend import cupy_available, interpreting
from gpusim.kernels import advantage as adv_mod
from gpusim.kernels.advantage import advantage, advantage_reference
from synthetic import backend_device, to_cpu, to_kernel_device

#: Every backend of the public dispatcher (``backend=``): "c" runs the reference (no C kernel),
#: "cupy" the CUDA C kernel (skipped without a GPU and CuPy).
BACKENDS = ["torch", "c",
            pytest.param("triton", marks=pytest.mark.skipif(not (torch.cuda.is_available() or interpreting()),
                                                            reason="no CUDA, no interpreter")),
            pytest.param("cupy", marks=pytest.mark.skipif(not (torch.cuda.is_available() and cupy_available()),
                                                          reason="needs a CUDA device and CuPy"))]


# --------------------------------------------------------------------------------------------
# Inputs: bootstrap_stop built the way the trainer builds it (docs/contracts.md).


def make_stop(pattern: str, B: int, T: int, g: torch.Generator) -> torch.Tensor:
    """[B, T] bool bootstrap_stop for one mask pattern."""
    if pattern == "none":
        stop = torch.zeros(B, T, dtype=torch.bool)
        stop[:, -1] = True
        return stop
    if pattern == "open_end":  # no stop at all: the last column bootstraps from last_value
        return torch.zeros(B, T, dtype=torch.bool)
    if pattern == "all":
        return torch.ones(B, T, dtype=torch.bool)
    if pattern == "random":
        return torch.rand(B, T, generator=g) < 0.15
    if pattern == "episodes":
        # Trial mode: k trials of length L; some agents reach the goal mid-trial and sit in limbo
        # (removed) until the trial ends; an early-truncated world idles after its terminal.
        k = 3
        L = max(1, T // k)
        terminal = torch.zeros(B, T, dtype=torch.bool)
        truncation = torch.zeros(B, T, dtype=torch.bool)
        removed = torch.zeros(B, T, dtype=torch.bool)
        loss_mask = torch.ones(B, T, dtype=torch.bool)
        for b in range(B):
            end = T if b % 4 else int(torch.randint(1, T + 1, (1,), generator=g))  # early terminal
            for start in range(0, end, L):
                stop_at = min(start + L, end) - 1
                truncation[b, stop_at] = True
                if torch.rand(1, generator=g).item() < 0.5:  # goal reached mid-trial -> limbo
                    goal = int(torch.randint(start, stop_at + 1, (1,), generator=g))
                    removed[b, goal + 1:stop_at + 1] = True  # out of play when obs[t] was taken
                    loss_mask[b, goal + 1:stop_at + 1] = False
            truncation[b, end - 1] = False
            terminal[b, end - 1] = True
            loss_mask[b, end:] = False
        next_invalid = torch.ones(B, T, dtype=torch.bool)
        next_invalid[:, :-1] = ~loss_mask[:, 1:]
        return terminal | truncation | removed | next_invalid
    raise ValueError(pattern)


PATTERNS = ["none", "open_end", "all", "random", "episodes"]


def make_inputs(B, T, pattern, seed, with_rho=False):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(B, T, generator=g)
    values = torch.randn(B, T, generator=g)
    last_value = torch.randn(B, generator=g)
    stop = make_stop(pattern, B, T, g)
    log_rho = (torch.randn(B, T, generator=g) * 0.7) if with_rho else None
    return rewards, values, stop, last_value, log_rho


def double_loop(rewards, values, stop, last_value, gamma, lam, log_rho=None, rho_clip=1.0, c_clip=1.0):
    """The recursion written out element by element in Python floats (float64)."""
    B, T = rewards.shape
    r, v, s, lv = rewards.tolist(), values.tolist(), stop.tolist(), last_value.tolist()
    lr = log_rho.tolist() if log_rho is not None else None
    adv = [[0.0] * T for _ in range(B)]
    for b in range(B):
        a_next = 0.0
        for t in range(T - 1, -1, -1):
            v_next = lv[b] if t == T - 1 else v[b][t + 1]
            nonterm = 0.0 if s[b][t] else 1.0
            rho = c = 1.0
            if lr is not None:
                rho = min(rho_clip, math.exp(lr[b][t]))
                c = min(c_clip, math.exp(lr[b][t]))
            delta = rho * (r[b][t] + gamma * v_next * nonterm - v[b][t])
            a_next = delta + gamma * lam * c * nonterm * a_next
            adv[b][t] = a_next
    adv = torch.tensor(adv, dtype=torch.float64)
    return adv, adv + values.double()


def assert_close(got, want, what):
    torch.testing.assert_close(got.double(), want.double(), rtol=1e-5, atol=2e-5, msg=lambda m: f"{what}: {m}")


# --------------------------------------------------------------------------------------------
# Reference


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("B,T", [(1, 1), (7, 13), (33, 91), (5, 273)])
@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (1.0, 1.0), (0.9, 0.0)])
def test_reference_matches_double_loop(pattern, B, T, gamma, lam):
    rewards, values, stop, last_value, _ = make_inputs(B, T, pattern, seed=B * 1000 + T)
    a, ret = advantage_reference(rewards, values, stop, last_value, gamma, lam)
    a_ref, ret_ref = double_loop(rewards, values, stop, last_value, gamma, lam)
    assert a.dtype == torch.float32 and a.shape == (B, T) and ret.shape == (B, T)
    assert_close(a, a_ref, "advantages")
    assert_close(ret, ret_ref, "returns")


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("rho_clip,c_clip", [(1.0, 1.0), (2.0, 0.5), (0.7, 1.5)])
def test_reference_vtrace_matches_double_loop(pattern, rho_clip, c_clip):
    B, T = 19, 57
    rewards, values, stop, last_value, log_rho = make_inputs(B, T, pattern, seed=7, with_rho=True)
    a, ret = advantage_reference(rewards, values, stop, last_value, 0.97, 0.9, log_rho, rho_clip, c_clip)
    a_ref, ret_ref = double_loop(rewards, values, stop, last_value, 0.97, 0.9, log_rho, rho_clip, c_clip)
    assert_close(a, a_ref, "advantages")
    assert_close(ret, ret_ref, "returns")


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("rho_clip,c_clip", [(1.0, 1.0), (1.0, 3.0), (5.0, 1.0)])
def test_vtrace_with_zero_log_rho_is_gae(pattern, rho_clip, c_clip):
    rewards, values, stop, last_value, _ = make_inputs(11, 41, pattern, seed=3)
    gae = advantage_reference(rewards, values, stop, last_value, 0.99, 0.95)
    vt = advantage_reference(rewards, values, stop, last_value, 0.99, 0.95, torch.zeros(11, 41), rho_clip, c_clip)
    assert torch.equal(gae[0], vt[0]) and torch.equal(gae[1], vt[1])


def test_vtrace_clipping_changes_result():
    rewards, values, stop, last_value, log_rho = make_inputs(8, 30, "random", seed=5, with_rho=True)
    gae = advantage_reference(rewards, values, stop, last_value, 0.99, 0.95)[0]
    vt = advantage_reference(rewards, values, stop, last_value, 0.99, 0.95, log_rho, 1.0, 1.0)[0]
    assert not torch.allclose(gae, vt)
    # Huge importance ratios are clipped to rho_clip / c_clip: same as log_rho = log(clip) exactly.
    big = advantage_reference(rewards, values, stop, last_value, 0.99, 0.95, torch.full((8, 30), 50.0), 1.0, 1.0)[0]
    assert torch.isfinite(big).all()
    assert torch.equal(big, gae)


def test_returns_are_discounted_sums_when_lambda_one_and_zero_values():
    """gamma = lambda = 1, V = 0: A_t is the undiscounted reward-to-go (+ last_value) within each
    stop-delimited segment."""
    B, T = 6, 25
    rewards, _, stop, last_value, _ = make_inputs(B, T, "random", seed=11)
    values = torch.zeros(B, T)
    a, ret = advantage_reference(rewards, values, stop, last_value, 1.0, 1.0)
    for b in range(B):
        acc = float(last_value[b])
        for t in range(T - 1, -1, -1):
            acc = float(rewards[b, t]) + (0.0 if stop[b, t] else acc)
            assert a[b, t].item() == pytest.approx(acc, abs=1e-4)
    assert torch.equal(a, ret)


def test_lambda_zero_is_one_step_td():
    rewards, values, stop, last_value, _ = make_inputs(9, 17, "episodes", seed=2)
    a, _ = advantage_reference(rewards, values, stop, last_value, 0.9, 0.0)
    nxt = torch.cat([values[:, 1:], last_value[:, None]], 1)
    td = rewards + 0.9 * nxt * (~stop).float() - values
    torch.testing.assert_close(a, td, rtol=0, atol=1e-6)


def test_stop_cuts_the_future():
    """Changing anything after a stop at column t leaves A[:, :t+1] bit-identical, and a stopped
    last column ignores a non-finite last_value."""
    B, T, t = 4, 20, 8
    rewards, values, stop, last_value, log_rho = make_inputs(B, T, "none", seed=4, with_rho=True)
    stop[:, t] = True
    a1, _ = advantage_reference(rewards, values, stop, last_value, 0.99, 0.95, log_rho)
    rewards2, values2, log_rho2 = rewards.clone(), values.clone(), log_rho.clone()
    rewards2[:, t + 1:] += 100.0
    values2[:, t + 1:] = -1e6
    log_rho2[:, t + 1:] = -3.0
    a2, _ = advantage_reference(rewards2, values2, stop, last_value * 7, 0.99, 0.95, log_rho2)
    assert torch.equal(a1[:, : t + 1], a2[:, : t + 1])
    # last column stopped -> last_value unused even when NaN.
    stop[:, -1] = True
    a3, _ = advantage_reference(rewards, values, stop, torch.full((B,), float("nan")), 0.99, 0.95)
    assert torch.isfinite(a3).all()


def test_empty_and_zero_length():
    a, r = advantage_reference(torch.zeros(0, 5), torch.zeros(0, 5), torch.zeros(0, 5, dtype=torch.bool),
                               torch.zeros(0), 0.99, 0.95)
    assert a.shape == (0, 5) and r.shape == (0, 5)
    a, r = advantage_reference(torch.zeros(3, 0), torch.zeros(3, 0), torch.zeros(3, 0, dtype=torch.bool),
                               torch.zeros(3), 0.99, 0.95)
    assert a.shape == (3, 0)


@pytest.mark.parametrize("fn", [advantage_reference, advantage])
def test_bad_inputs(fn):
    r, v, s, lv, _ = make_inputs(3, 5, "random", seed=0)
    with pytest.raises(ValueError, match="values"):
        fn(r, v[:, :4], s, lv, 0.9, 0.9)
    with pytest.raises(ValueError, match="last_value"):
        fn(r, v, s, lv[:2], 0.9, 0.9)
    with pytest.raises(TypeError, match="bootstrap_stop"):
        fn(r, v, s.float(), lv, 0.9, 0.9)
    with pytest.raises(TypeError, match="rewards"):
        fn(r.double(), v, s, lv, 0.9, 0.9)
    with pytest.raises(ValueError, match=r"rewards must be \[B, T\]"):
        fn(r[0], v, s, lv, 0.9, 0.9)
    with pytest.raises(ValueError, match="gamma"):
        fn(r, v, s, lv, 1.5, 0.9)
    with pytest.raises(ValueError, match="gae_lambda"):
        fn(r, v, s, lv, 0.9, -0.1)
    with pytest.raises(ValueError, match="log_rho"):
        fn(r, v, s, lv, 0.9, 0.9, log_rho=torch.zeros(3, 4))
    with pytest.raises(ValueError, match="rho_clip"):
        fn(r, v, s, lv, 0.9, 0.9, log_rho=torch.zeros(3, 5), rho_clip=0.0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_rho", [False, True])
def test_every_backend_matches_double_loop(backend, with_rho):
    """The public dispatcher on each named backend (its tensors on that backend's device) against
    the element-by-element recursion."""
    r, v, s, lv, lr = make_inputs(19, 23, "episodes", seed=5, with_rho=with_rho)
    dev = backend_device(backend)
    moved = [None if x is None else x.to(dev) for x in (r, v, s, lv, lr)]
    a, ret = to_cpu(advantage(*moved[:4], 0.97, 0.9, moved[4], 1.3, 0.9, backend=backend))
    want_a, want_r = double_loop(r, v, s, lv, 0.97, 0.9, lr, 1.3, 0.9)
    assert_close(a, want_a, f"{backend} advantages")
    assert_close(ret, want_r, f"{backend} returns")


def test_public_cpu_dispatches_to_reference():
    r, v, s, lv, lr = make_inputs(5, 9, "episodes", seed=1, with_rho=True)
    from gpusim.backend import use_backend

    with use_backend("torch"):
        got = advantage(r, v, s, lv, 0.99, 0.95, lr, 1.0, 1.0)
    want = advantage_reference(r, v, s, lv, 0.99, 0.95, lr, 1.0, 1.0)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# --------------------------------------------------------------------------------------------
# Triton (interpreter on CPU) vs the reference


@pytest.mark.parametrize("pattern", ["random", "episodes", "open_end"])
@pytest.mark.parametrize("B,T,block_b,with_rho", [(37, 29, 16, False), (37, 29, 16, True), (5, 91, 8, True),
                                                  (130, 7, 64, False)])
def test_triton_matches_reference(pattern, B, T, block_b, with_rho):
    from gpusim.backend import interpreting

    if not torch.cuda.is_available() and not interpreting():
        pytest.skip("no CUDA device and TRITON_INTERPRET is not set")
    r, v, s, lv, lr = make_inputs(B, T, pattern, seed=B + T, with_rho=with_rho)
    out = to_kernel_device((torch.full((B, T), float("nan")), torch.full((B, T), float("nan"))))
    a, ret = adv_mod._advantage_triton(*to_kernel_device((r, v, s, lv)), 0.98, 0.93, to_kernel_device(lr), 1.2, 0.8,
                                       block_b=block_b, out=out)
    assert a is out[0] and ret is out[1]
    want_a, want_r = advantage_reference(r, v, s, lv, 0.98, 0.93, lr, 1.2, 0.8)
    assert_close(a.cpu(), want_a, "triton advantages")
    assert_close(ret.cpu(), want_r, "triton returns")


def test_triton_via_public_dispatch():
    from gpusim.backend import interpreting, use_backend

    if not torch.cuda.is_available() and not interpreting():
        pytest.skip("no CUDA device and TRITON_INTERPRET is not set")
    r, v, s, lv, _ = make_inputs(21, 15, "episodes", seed=9)
    with use_backend("triton"):
        a, ret = to_cpu(advantage(*to_kernel_device((r, v, s, lv)), 0.99, 0.95))
    want = advantage_reference(r, v, s, lv, 0.99, 0.95)
    assert_close(a, want[0], "advantages")
    assert_close(ret, want[1], "returns")
