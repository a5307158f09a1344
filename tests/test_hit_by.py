"""``events.hit_by`` (collision REMOVE: which agents each source agent hit): Triton kernel
(interpreter on CPU) against the torch reference, and the box geometry on hand-made cases."""

from __future__ import annotations

import math

import pytest
import torch

from gpusim.backend import interpreting, use_backend
from gpusim.kernels.collision import _hit_by_triton, collisions_reference, hit_by, hit_by_reference
from synthetic import KERNEL_DEVICE, backend_device, to_kernel_device

HAVE_TRITON = torch.cuda.is_available() or interpreting()
needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason="no CUDA, no Triton interpreter")


def crowded(W, A, seed, spread=12.0):
    """Random boxes packed densely enough that many overlap (cars and pedestrian-size boxes)."""
    g = torch.Generator().manual_seed(seed)
    pos = (torch.rand(W, A, 2, generator=g) - 0.5) * spread
    heading = (torch.rand(W, A, generator=g) - 0.5) * 2 * math.pi
    length = torch.where(torch.rand(W, A, generator=g) < 0.2, 0.6, 3.0 + 2.0 * torch.rand(W, A, generator=g))
    width = torch.where(length < 1.0, 0.6, 1.6 + 0.6 * torch.rand(W, A, generator=g))
    present = torch.rand(W, A, generator=g) < 0.85
    return pos, heading, length, width, present, g


@needs_triton
@pytest.mark.parametrize("W,A,S,block,block_s", [(1, 5, 3, 16, 16), (3, 37, 11, 16, 16), (2, 64, 64, 32, 16), (5, 19, 19, None, None), (2, 70, 33, 64, 32)])
@pytest.mark.parametrize("box_scale", [0.7, 1.0])
def test_triton_matches_reference(W, A, S, block, block_s, box_scale):
    pos, heading, length, width, present, g = crowded(W, A, seed=W * 100 + A + S)
    source = torch.rand(W, S, generator=g) < 0.5
    want = hit_by_reference(pos, heading, length, width, present, source, box_scale)
    out = torch.full((W, A), 7, dtype=torch.int8, device=KERNEL_DEVICE)  # sentinel: every element must be overwritten
    k_args = to_kernel_device((pos, heading, length, width, present, source))
    got = _hit_by_triton(*k_args, box_scale, block=block, block_s=block_s, out=out)
    assert set(out.unique().tolist()) <= {0, 1}
    assert torch.equal(got.cpu(), want)
    assert want.any() and not want.all()  # the scene exercises both outcomes
    with use_backend("triton"):
        assert torch.equal(hit_by(*k_args, box_scale).cpu(), want)


def test_reference_agrees_with_collision_test():
    # With every present agent a source, "hit by someone" equals "collides with someone".
    W, A = 4, 23
    pos, heading, length, width, present, _ = crowded(W, A, seed=3)
    src = torch.ones(W, A, dtype=torch.bool)
    for scale in (0.7, 1.0):
        assert torch.equal(hit_by_reference(pos, heading, length, width, present, src, scale),
                           collisions_reference(pos, heading, length, width, present, scale))


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton), "c"])
def test_geometry_and_masks(backend):
    # agent 0 at the origin heading +x (4 x 2 box); agent 1 rotated 90 deg with its centre 2.4 m
    # ahead (its half-width 1 m reaches x = 1.4 < 2: overlap); agent 2 5 m to the side (no);
    # agent 3 overlaps agent 2 only; agent 4 sits on agent 0 but is absent.
    pos = torch.tensor([[[0.0, 0.0], [2.4, 0.0], [0.0, 5.0], [0.5, 5.5], [0.5, 0.0]]])
    heading = torch.tensor([[0.0, math.pi / 2, 0.0, 0.3, 0.0]])
    length = torch.full((1, 5), 4.0)
    width = torch.full((1, 5), 2.0)
    present = torch.tensor([[True, True, True, True, False]])
    dev = backend_device(backend)
    pos, heading, length, width, present = (x.to(dev) for x in (pos, heading, length, width, present))
    src_0, src_1, src_only0 = (torch.tensor(v, device=dev) for v in ([[True, False]], [[False, True]], [[True]]))
    with use_backend(backend):
        hit = hit_by(pos, heading, length, width, present, src_0, 1.0)
        assert hit.tolist() == [[False, True, False, False, False]]
        # touching counts: move agent 1 so its near edge is exactly at x = 2 (centre 3.0)
        p2 = pos.clone()
        p2[0, 1, 0] = 3.0
        assert hit_by(p2, heading, length, width, present, src_only0, 1.0)[0, 1]
        p2[0, 1, 0] = 3.01
        assert not hit_by(p2, heading, length, width, present, src_only0, 1.0)[0, 1]
        # smaller boxes: the near miss disappears (2.4 > 0.5 * 0.5 * 4 + 0.5 * 0.5 * 2)
        assert not hit_by(pos, heading, length, width, present, src_0, 0.5).any()
        # an absent source hits nothing; sources are symmetric
        absent = present.clone()
        absent[0, 0] = False
        assert not hit_by(pos, heading, length, width, absent, src_0, 1.0).any()
        assert hit_by(pos, heading, length, width, present, src_1, 1.0).tolist() == \
            [[True, False, False, False, False]]


@needs_triton
def test_bad_input_raises():
    pos, heading, length, width, present = to_kernel_device(crowded(2, 6, seed=0)[:5])
    src = torch.zeros(2, 3, dtype=torch.bool, device=KERNEL_DEVICE)
    with use_backend("triton"):
        with pytest.raises(ValueError, match="source"):
            hit_by(pos, heading, length, width, present, torch.zeros(2, 7, dtype=torch.bool, device=KERNEL_DEVICE), 1.0)
        with pytest.raises(ValueError, match="heading"):
            hit_by(pos, heading.double(), length, width, present, src, 1.0)
        with pytest.raises(ValueError, match="present"):
            hit_by(pos, heading, length, width, present.float(), src, 1.0)
