"""episode_mask: torch reference vs a plain-Python oracle, and the Triton kernel (interpreter) vs
the reference, with outputs pre-filled so unwritten elements fail."""

from __future__ import annotations

import pytest
import torch

from gpusim.backend import use_backend
from gpusim.kernels.episode_mask import _episode_mask_triton, episode_mask, episode_mask_reference
from synthetic import KERNEL_DEVICE, to_cpu, to_kernel_device


def _oracle(terminal, removed):
    B, T = terminal.shape
    allowed = torch.zeros(B, T, T, dtype=torch.bool)
    pos = torch.zeros(B, T, dtype=torch.int64)
    for b in range(B):
        ep, start = 0, 0
        eps = []
        for t in range(T):
            eps.append(ep)
            pos[b, t] = t - start
            if terminal[b, t]:
                ep += 1
                start = t + 1
        for q in range(T):
            for k in range(q + 1):
                allowed[b, q, k] = eps[k] == eps[q] and (k == q or not removed[b, k])
    return allowed, pos


def _inputs(B, T, p_term, p_rem, seed):
    g = torch.Generator().manual_seed(seed)
    term = torch.rand(B, T, generator=g) < p_term
    rem = torch.rand(B, T, generator=g) < p_rem
    if T > 2:
        rem[0, :2] = True  # a row starting with removed steps
    return term, rem


@pytest.mark.parametrize("B,T,p_term,p_rem", [(3, 17, 0.15, 0.3), (1, 1, 0.5, 0.5), (2, 40, 0.0, 0.0), (2, 33, 1.0, 0.5)])
def test_reference_matches_python_oracle(B, T, p_term, p_rem):
    term, rem = _inputs(B, T, p_term, p_rem, seed=T)
    allowed, pos = episode_mask_reference(term, rem)
    a2, p2 = _oracle(term, rem)
    assert torch.equal(allowed, a2)
    assert torch.equal(pos, p2)
    assert allowed.diagonal(dim1=1, dim2=2).all()  # every query sees itself: no empty softmax row


def test_known_example():
    term = torch.tensor([[False, True, False, False]])
    rem = torch.tensor([[False, False, True, False]])
    allowed, pos = episode_mask_reference(term, rem)
    assert pos.tolist() == [[0, 1, 0, 1]]
    expect = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(allowed[0], expect)


@pytest.mark.parametrize("B,T", [(3, 91), (2, 7), (1, 130), (2, 1)])
def test_triton_kernel_matches_reference(B, T):
    term, rem = _inputs(B, T, 0.05, 0.2, seed=B * 1000 + T)
    ref_a, ref_p = episode_mask_reference(term, rem)
    out_a = torch.full((B, T, T), 7, dtype=torch.int8, device=KERNEL_DEVICE)  # not a bool value: unwritten entries fail
    out_p = torch.full((B, T), -1, dtype=torch.int64, device=KERNEL_DEVICE)
    a, p = to_cpu(_episode_mask_triton(*to_kernel_device((term, rem)), out_a, out_p))
    assert torch.equal(out_a.cpu(), ref_a.to(torch.int8))
    assert torch.equal(p, ref_p)
    assert torch.equal(a, ref_a)
    with use_backend("triton"):
        a3, p3 = to_cpu(episode_mask(*to_kernel_device((term, rem))))
    assert torch.equal(a3, ref_a) and torch.equal(p3, ref_p)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="bool"):
        episode_mask(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        episode_mask(torch.zeros(2, 3, dtype=torch.bool), torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        episode_mask(torch.zeros(3, dtype=torch.bool), torch.zeros(3, dtype=torch.bool))
