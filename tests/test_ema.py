"""Per-agent EMA logging (docs/design.md section 13): semantics on the torch reference and the Triton
kernels (interpreter on CPU), Triton vs reference, EmaLog, bad input."""

from __future__ import annotations

import pytest
import torch

from gpusim.backend import cupy_available, interpreting, use_backend
from gpusim.kernels import ema as ema_mod
from gpusim.kernels.ema import EmaLog, ema_report, ema_report_reference, ema_update, ema_update_reference
from synthetic import backend_device, to_cpu, to_kernel_device

HAVE_TRITON = torch.cuda.is_available() or interpreting()
HAVE_CUPY = torch.cuda.is_available() and cupy_available()
BACKENDS = ["torch",
            pytest.param("triton", marks=pytest.mark.skipif(not HAVE_TRITON, reason="no CUDA, no interpreter")),
            pytest.param("cupy", marks=pytest.mark.skipif(not HAVE_CUPY, reason="needs a CUDA device and CuPy"))]


def python_ema(history, alpha):
    """Oracle: per slot, the list of finished episodes' metric vectors -> (EMA per slot or None)."""
    out = []
    for episodes in history:
        val = None
        for ep in episodes:
            val = list(ep) if val is None else [alpha * s + (1 - alpha) * e for s, e in zip(val, ep)]
        out.append(val)
    return out


def run_steps(backend, N, M, steps, alpha, seed, p_done=0.2):
    """Random completions over several steps through the public API; returns the final state and
    the oracle's history. Non-finished rows of `episode` hold NaN (they must be ignored). Inputs are
    drawn on the CPU; the state lives on the backend's device (backend_device)."""
    g = torch.Generator().manual_seed(seed)
    dev = backend_device(backend)
    slots = torch.full((N, M), float("nan"), device=dev)
    has = torch.zeros(N, dtype=torch.bool, device=dev)
    history = [[] for _ in range(N)]
    with use_backend(backend):
        for _ in range(steps):
            done = torch.rand(N, generator=g) < p_done
            ep = torch.randn(N, M, generator=g)
            for i in torch.nonzero(done).flatten().tolist():
                history[i].append(ep[i].tolist())
            ep[~done] = float("nan")
            s_out, h_out = ema_update(slots, has, ep.to(dev), done.to(dev), alpha)
            assert s_out is slots and h_out is has  # in place on every backend
    return slots, has, history


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("N,M,alpha", [(1, 1, 0.707), (37, 5, 0.707), (130, 7, 0.3), (19, 3, 0.0)])
def test_update_matches_python_oracle(backend, N, M, alpha):
    slots_dev, has_dev, history = run_steps(backend, N, M, steps=12, alpha=alpha, seed=N + M)
    slots, has = to_cpu((slots_dev, has_dev))
    want = python_ema(history, alpha)
    for i in range(N):
        if want[i] is None:
            assert not has[i]
            assert torch.isnan(slots[i]).all(), "a slot that never finished must be untouched"
        else:
            assert has[i]
            torch.testing.assert_close(slots[i], torch.tensor(want[i]), rtol=1e-5, atol=1e-6)
    with use_backend(backend):
        mean, n = to_cpu(ema_report(slots_dev, has_dev))
    assert n.dtype == torch.int64 and n.shape == () and mean.shape == (M,) and mean.dtype == torch.float32
    done_rows = [w for w in want if w is not None]
    assert int(n) == len(done_rows)
    if done_rows:
        expect = torch.tensor(done_rows, dtype=torch.float64).mean(0)
        torch.testing.assert_close(mean.double(), expect, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nothing_before_first_completion(backend):
    dev = backend_device(backend)
    log = EmaLog(11, ["episode_return", "goal_reached"], alpha=0.707, device=dev)
    with use_backend(backend):
        for _ in range(3):
            log.update(torch.full((11, 2), float("nan"), device=dev), torch.zeros(11, dtype=torch.bool, device=dev))
            assert log.report() == {}
        mean, n = to_cpu(ema_report(log.slots, log.has_data))
    assert int(n) == 0 and torch.equal(mean, torch.zeros(2))
    with use_backend(backend):
        done = torch.zeros(11, dtype=torch.bool)
        done[4] = True
        log.update(torch.tensor([[2.5, 1.0]]).repeat(11, 1).to(dev), done.to(dev))
        rep = log.report()
    assert rep == {"episode_return": 2.5, "goal_reached": 1.0, "n": 1.0}


@pytest.mark.parametrize("backend", BACKENDS)
def test_n_counts_completed_slots_until_all(backend):
    N = 23
    dev = backend_device(backend)
    log = EmaLog(N, ["score"], alpha=0.5, device=dev)
    g = torch.Generator().manual_seed(0)
    finished: set[int] = set()
    with use_backend(backend):
        for _ in range(200):
            done = torch.rand(N, generator=g) < 0.1
            finished |= set(torch.nonzero(done).flatten().tolist())
            log.update(torch.rand(N, 1, generator=g).to(dev), done.to(dev))
            rep = log.report()
            assert rep.get("n", 0) == len(finished)
            if len(finished) == N:
                break
    assert len(finished) == N and log.report()["n"] == N


@pytest.mark.parametrize("backend", BACKENDS)
def test_reports_are_stable_without_completions(backend):
    slots, has, _ = run_steps(backend, 29, 4, steps=6, alpha=0.707, seed=3)
    dev = backend_device(backend)
    with use_backend(backend):
        m1, n1 = ema_report(slots, has)
        before = slots.clone(), has.clone()
        ema_update(slots, has, torch.randn(29, 4).to(dev), torch.zeros(29, dtype=torch.bool, device=dev), 0.707)
        m2, n2 = ema_report(slots, has)
    assert torch.equal(slots.nan_to_num(123.0), before[0].nan_to_num(123.0)) and torch.equal(has, before[1])
    assert torch.equal(m1, m2) and torch.equal(n1, n2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_alpha_zero_keeps_last_episode(backend):
    N, M = 9, 3
    dev = backend_device(backend)
    slots, has = torch.zeros(N, M, device=dev), torch.zeros(N, dtype=torch.bool, device=dev)
    g = torch.Generator().manual_seed(1)
    last = torch.full((N, M), float("nan"))
    with use_backend(backend):
        for _ in range(8):
            done = torch.rand(N, generator=g) < 0.5
            ep = torch.randn(N, M, generator=g)
            ema_update(slots, has, ep.to(dev), done.to(dev), 0.0)
            last[done] = ep[done]
    slots, has = to_cpu((slots, has))
    assert torch.equal(slots[has], last[has])


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_agent_weighs_the_same(backend):
    """Slot 0 finishes ten short episodes (score 1), slot 1 a single long one (score 0): the
    population mean is 0.5, not 10/11 as an average over episodes would give."""
    dev = backend_device(backend)
    log = EmaLog(2, ["score", "episode_length"], alpha=0.707, device=dev)
    with use_backend(backend):
        for k in range(10):
            done = torch.tensor([True, k == 9], device=dev)
            ep = torch.tensor([[1.0, 9.0], [0.0, 91.0]], device=dev)
            log.update(ep, done)
        rep = log.report()
    assert rep["n"] == 2
    assert rep["score"] == pytest.approx(0.5, abs=1e-6)
    assert rep["episode_length"] == pytest.approx(50.0, abs=1e-4)


def test_first_completion_overwrites_and_blend_formula():
    slots = torch.tensor([[100.0, -100.0], [4.0, 8.0]])
    has = torch.tensor([False, True])
    ep = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    ema_update_reference(slots, has, ep, torch.tensor([True, True]), 0.75)
    assert torch.equal(slots[0], ep[0])
    torch.testing.assert_close(slots[1], torch.tensor([3.0, 6.0]))
    assert has.all()


@pytest.mark.parametrize("N,M,block_n", [(37, 5, 16), (130, 7, 64), (5, 70, 16), (1, 1, 16)])
def test_triton_matches_reference_with_nan_prefill(N, M, block_n):
    if not HAVE_TRITON:
        pytest.skip("no CUDA device and TRITON_INTERPRET is not set")
    g = torch.Generator().manual_seed(N * M)
    s_ref = torch.full((N, M), float("nan"))
    h_ref = torch.zeros(N, dtype=torch.bool)
    s_tri, h_tri = to_kernel_device((s_ref.clone(), h_ref.clone()))
    for _ in range(4):
        done = torch.rand(N, generator=g) < 0.4
        ep = torch.randn(N, M, generator=g)
        ep[~done] = float("nan")
        ema_update_reference(s_ref, h_ref, ep, done, 0.6)
        ema_mod._ema_update_triton(s_tri, h_tri, *to_kernel_device((ep, done)), 0.6, block_n=block_n)
        assert torch.equal(h_ref, h_tri.cpu())
        torch.testing.assert_close(s_tri.cpu(), s_ref, rtol=1e-6, atol=1e-6, equal_nan=True)
        out = to_kernel_device((torch.full((M,), float("nan")), torch.full((1,), -7, dtype=torch.int64)))
        mean, n = to_cpu(ema_mod._ema_report_triton(s_tri, h_tri, block_n=block_n, out=out))
        m_ref, n_ref = ema_report_reference(s_ref, h_ref)
        assert int(n) == int(n_ref)
        torch.testing.assert_close(mean, m_ref, rtol=1e-5, atol=1e-6)


def test_empty_population():
    for backend in ["torch"] + (["triton"] if HAVE_TRITON else []):
        dev = backend_device(backend)
        with use_backend(backend):
            mean, n = to_cpu(ema_report(torch.zeros(0, 3, device=dev), torch.zeros(0, dtype=torch.bool, device=dev)))
        assert int(n) == 0 and torch.equal(mean, torch.zeros(3))


@pytest.mark.parametrize("fn", [ema_update_reference, ema_update])
def test_update_bad_inputs(fn):
    s, h = torch.zeros(4, 2), torch.zeros(4, dtype=torch.bool)
    e, d = torch.zeros(4, 2), torch.zeros(4, dtype=torch.bool)
    with pytest.raises(ValueError, match="episode"):
        fn(s, h, e[:3], d, 0.5)
    with pytest.raises(TypeError, match="done"):
        fn(s, h, e, d.float(), 0.5)
    with pytest.raises(TypeError, match="slots"):
        fn(s.double(), h, e, d, 0.5)
    with pytest.raises(ValueError, match="alpha"):
        fn(s, h, e, d, 1.0)
    with pytest.raises(ValueError, match="contiguous"):
        fn(torch.zeros(2, 4).t(), h, e, d, 0.5)


@pytest.mark.parametrize("fn", [ema_report_reference, ema_report])
def test_report_bad_inputs(fn):
    with pytest.raises(ValueError, match="has_data"):
        fn(torch.zeros(4, 2), torch.zeros(3, dtype=torch.bool))
    with pytest.raises(TypeError, match="has_data"):
        fn(torch.zeros(4, 2), torch.zeros(4))
    with pytest.raises(ValueError, match=r"\[N, M\]"):
        fn(torch.zeros(4), torch.zeros(4, dtype=torch.bool))


def test_emalog_validation_and_casts():
    with pytest.raises(ValueError, match="duplicate"):
        EmaLog(3, ["a", "a"])
    with pytest.raises(ValueError, match="reserved"):
        EmaLog(3, ["n"])
    with pytest.raises(ValueError, match="alpha"):
        EmaLog(3, ["a"], alpha=1.2)
    log = EmaLog(3, ["a", "b"], alpha=0.5)
    log.update(torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=torch.float64), torch.tensor([1, 0, 1]))
    assert log.report() == {"a": 3.0, "b": 4.0, "n": 2.0}
    with pytest.raises(ValueError):
        log.update(torch.zeros(2, 2), torch.zeros(2, dtype=torch.bool))
