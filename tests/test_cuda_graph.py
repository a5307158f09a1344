"""gpusim.cuda_graph: the flag, the eager fallback and the input checks on the CPU; capture and
replay on a CUDA device (skipped without one)."""

import pytest
import torch

from gpusim.cuda_graph import ENV_FLAG, GraphedStep, cuda_graphs_enabled

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _step(x, y):
    return {"sum": x + y, "pair": (x * 2, y.sum()), "tag": "step"}


def test_flag_defaults_and_override(monkeypatch):
    monkeypatch.delenv(ENV_FLAG, raising=False)
    assert cuda_graphs_enabled("cpu") is False
    assert cuda_graphs_enabled() is torch.cuda.is_available()
    monkeypatch.setenv(ENV_FLAG, "0")
    assert cuda_graphs_enabled("cuda") is False and cuda_graphs_enabled() is False
    monkeypatch.setenv(ENV_FLAG, "maybe")
    with pytest.raises(ValueError, match=ENV_FLAG):
        cuda_graphs_enabled()


@pytest.mark.parametrize("enabled", [None, True, False])
def test_cpu_inputs_run_eagerly_with_the_same_results(enabled):
    step = GraphedStep(_step, enabled=enabled, warmup=1)
    for i in range(4):
        x, y = torch.full((3,), float(i)), torch.arange(3.0)
        out = step(x, y)
        assert torch.equal(out["sum"], x + y) and torch.equal(out["pair"][0], 2 * x) and out["tag"] == "step"
        assert out["pair"][1].item() == 3.0
    assert step.calls == 4 and not step.captured and "CUDA" in step.fallback_reason


def test_bad_arguments():
    with pytest.raises(ValueError, match="warmup"):
        GraphedStep(_step, warmup=0)
    with pytest.raises(TypeError, match="input 1 must be a tensor"):
        GraphedStep(_step)(torch.zeros(2), 3.0)


@needs_cuda
def test_capture_replays_with_new_inputs_and_in_place_state():
    state = torch.zeros(4, device="cuda")

    def fn(x):
        state.add_(x)  # state carried in place: replayed
        return state * 2, x.sum()

    step = GraphedStep(fn, enabled=True, warmup=2)
    total = torch.zeros(4, device="cuda")
    for i in range(6):
        x = torch.full((4,), float(i + 1), device="cuda")
        total += x
        a, s = step(x)
        torch.testing.assert_close(a, 2 * total)
        assert s.item() == 4.0 * (i + 1)
    assert step.captured and step.fallback_reason is None
    with pytest.raises(ValueError, match="captured with"):
        step(torch.zeros(5, device="cuda"))


@needs_cuda
def test_disabled_or_failed_capture_falls_back_to_eager():
    step = GraphedStep(lambda x: x + 1, enabled=False, warmup=1)
    for _ in range(3):
        assert torch.equal(step(torch.zeros(2, device="cuda")), torch.ones(2, device="cuda"))
    assert not step.captured and "disabled" in step.fallback_reason

    def syncs(x):
        return x * float(x.sum().item())  # a host sync: not capturable

    step = GraphedStep(syncs, enabled=True, warmup=1)
    for _ in range(3):
        assert torch.equal(step(torch.ones(2, device="cuda")), torch.full((2,), 2.0, device="cuda"))
    assert not step.captured and step.fallback_reason.startswith("capture failed")


@needs_cuda
def test_failed_capture_leaves_the_generators_usable():
    """A capture that fails after a draw from the default generator must not leave it in capture
    mode: the eager fallback samples (torch 2.11 raised "Offset increment outside graph capture
    encountered unexpectedly" at the next ``rand_like`` before gpusim.cuda_graph.capture_graph)."""
    user = torch.Generator(device="cuda").manual_seed(1)

    def draws_then_syncs(x):
        y = x + torch.rand_like(x) + torch.rand(x.shape, device=x.device, generator=user)
        return y * float(y.sum().item())

    step = GraphedStep(draws_then_syncs, enabled=True, warmup=1)
    for _ in range(3):
        assert torch.isfinite(step(torch.ones(4, device="cuda"))).all()
    assert not step.captured and step.fallback_reason.startswith("capture failed")
    from gpusim.cuda_graph import CudaGraphCapture

    cap = CudaGraphCapture("cuda", (user,))
    x = torch.ones(4, device="cuda")
    cap.warm(lambda: draws_then_syncs(x))
    with pytest.raises(RuntimeError):
        cap.capture(lambda: draws_then_syncs(x))
    a = torch.rand(3, device="cuda")
    b = torch.rand(3, device="cuda", generator=user)
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
