"""OBB collisions (separating-axis test): hand cases and Triton kernel vs torch reference."""

import math

import pytest
import torch

from gpusim.backend import use_backend
from gpusim.kernels.collision import collisions, collisions_reference
from synthetic import KERNEL_DEVICE, backend_device, to_cpu, to_kernel_device

BACKENDS = ["torch", "triton", "c"]  # every backend of the op (triton: the interpreter on CPU)


def _boxes(*boxes, present=None, device="cpu"):
    """boxes: (x, y, heading, length, width) -> one world, on ``device``."""
    t = torch.tensor(boxes, dtype=torch.float32)[None]
    pres = torch.ones(1, len(boxes), dtype=torch.bool) if present is None else torch.tensor([present])
    out = t[..., :2].contiguous(), t[..., 2].contiguous(), t[..., 3].contiguous(), t[..., 4].contiguous(), pres
    return tuple(x.to(device) for x in out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_overlap_and_far_apart(backend):
    with use_backend(backend):
        hit = collisions(*_boxes((0, 0, 0, 4, 2), (3, 0.5, 0.3, 4, 2), (100, 100, 0, 4, 2),
                                 device=backend_device(backend)), 1.0)
    assert hit.tolist() == [[True, True, False]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_touching_counts(backend):
    # edges meet exactly at x = 2 (box half lengths 2 and 1), corners meet at (2, 1)
    dev = backend_device(backend)
    with use_backend(backend):
        assert collisions(*_boxes((0, 0, 0, 4, 2), (3, 0, 0, 2, 2), device=dev), 1.0).tolist() == [[True, True]]
        assert collisions(*_boxes((0, 0, 0, 4, 2), (3, 2, 0, 2, 2), device=dev), 1.0).tolist() == [[True, True]]
        assert collisions(*_boxes((0, 0, 0, 4, 2), (3.01, 0, 0, 2, 2), device=dev), 1.0).tolist() == [[False, False]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_rotated_near_miss(backend):
    """A 2x2 square rotated 45 degrees facing a box corner: circles overlap, boxes do not.

    Box A is [-1, 1]^2 (corner at distance sqrt 2 along the diagonal). Square B, centred on the
    diagonal at distance t, turns a face (1 m from its centre) to that corner: separated iff
    t > 1 + sqrt 2 = 2.414, while the bounding circles (radius sqrt 2) overlap for t < 2.828.
    """
    u = 1 / math.sqrt(2)
    with use_backend(backend):
        far = _boxes((0, 0, 0, 2, 2), (2.5 * u, 2.5 * u, math.pi / 4, 2, 2), device=backend_device(backend))
        assert collisions(*far, 1.0).tolist() == [[False, False]]
        near = _boxes((0, 0, 0, 2, 2), (2.35 * u, 2.35 * u, math.pi / 4, 2, 2), device=backend_device(backend))
        assert collisions(*near, 1.0).tolist() == [[True, True]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_box_scale(backend):
    args = _boxes((0, 0, 0, 4, 2), (3.5, 0, 0, 4, 2), device=backend_device(backend))  # overlap 0.5 m at full size
    with use_backend(backend):
        assert collisions(*args, 1.0).tolist() == [[True, True]]
        assert collisions(*args, 0.7).tolist() == [[False, False]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_absent_agents_ignored(backend):
    dev = backend_device(backend)
    args = _boxes((0, 0, 0, 4, 2), (1, 0, 0, 4, 2), (-1, 0, 0, 4, 2), present=[True, False, False], device=dev)
    with use_backend(backend):
        assert collisions(*args, 1.0).tolist() == [[False, False, False]]
    args = _boxes((0, 0, 0, 4, 2), (1, 0, 0, 4, 2), (50, 0, 0, 4, 2), present=[True, True, False], device=dev)
    with use_backend(backend):
        assert collisions(*args, 1.0).tolist() == [[True, True, False]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_degenerate_zero_size_boxes(backend):
    # a point inside a box collides; a point outside does not; two coincident points collide
    args = _boxes((0, 0, 0, 4, 2), (1, 0.5, 0, 0, 0), (3, 3, 0, 0, 0), (3, 3, 1.0, 0, 0), (10, 0, 0, 0, 0),
                  device=backend_device(backend))
    with use_backend(backend):
        assert collisions(*args, 1.0).tolist() == [[True, True, True, True, False]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_worlds_are_independent(backend):
    p, h, L, Wd, pres = _boxes((0, 0, 0, 4, 2), (100, 0, 0, 4, 2), device=backend_device(backend))
    p2 = p.repeat(2, 1, 1)
    p2[1, 1] = torch.tensor([0.5, 0.0], device=p2.device)  # world 1: both at the same place
    with use_backend(backend):
        hit = collisions(p2, h.repeat(2, 1), L.repeat(2, 1), Wd.repeat(2, 1), pres.repeat(2, 1), 1.0)
    assert hit.tolist() == [[False, False], [True, True]]


def _random(W, A, seed):
    g = torch.Generator().manual_seed(seed)
    pos = torch.rand(W, A, 2, generator=g) * 4 * math.sqrt(A)
    heading = (torch.rand(W, A, generator=g) * 2 - 1) * math.pi
    length = 0.5 + torch.rand(W, A, generator=g) * 5
    width = 0.5 + torch.rand(W, A, generator=g) * 2
    present = torch.rand(W, A, generator=g) > 0.2
    pos[~present] = -10000.0
    return pos, heading, length, width, present


@pytest.mark.parametrize("W,A,Q", [(3, 37, None), (2, 64, 32), (1, 9, 3), (2, 130, 77)])
def test_kernel_matches_reference(W, A, Q):
    args = _random(W, A, seed=A)
    ref = collisions_reference(*args, 0.7, num_query=Q)
    assert ref.any() and not ref.all()
    with use_backend("triton"):
        out = to_cpu(collisions(*to_kernel_device(args), 0.7, num_query=Q))
    assert out.dtype == torch.bool and torch.equal(out, ref)


def test_num_query_is_consistent_with_full():
    args = _random(2, 40, seed=5)
    full = collisions_reference(*args, 1.0)
    part = collisions_reference(*args, 1.0, num_query=10)
    assert torch.equal(part[:, :10], full[:, :10])
    assert (part[:, 10:] <= full[:, 10:]).all()  # experts only flagged by query agents


def test_kernel_rejects_bad_input():
    pos, heading, length, width, present = to_kernel_device(_random(2, 5, seed=0))
    with use_backend("triton"):
        with pytest.raises(ValueError, match="present"):
            collisions(pos, heading, length, width, present.float(), 1.0)
        with pytest.raises(ValueError, match="width"):
            collisions(pos, heading, length, width[:, :3], present, 1.0)


# ------------------------------------------------------------------------------ CPU fast path
def _dense_oracle(pos, heading, length, width, present, box_scale, query):
    """All pairs, no pre-check: the separating-axis test of the module docstring on [W, A, A];
    a pair counts when its first agent is a query agent."""
    a, b = 0.5 * box_scale * length, 0.5 * box_scale * width
    ch, sh = torch.cos(heading), torch.sin(heading)
    ai, bi, ci, si = a[:, :, None], b[:, :, None], ch[:, :, None], sh[:, :, None]
    aj, bj, cj, sj = a[:, None, :], b[:, None, :], ch[:, None, :], sh[:, None, :]
    dx = pos[:, None, :, 0] - pos[:, :, None, 0]
    dy = pos[:, None, :, 1] - pos[:, :, None, 1]
    c, s = (ci * cj + si * sj).abs(), (ci * sj - si * cj).abs()
    sep = (dx * ci + dy * si).abs() > ai + aj * c + bj * s
    sep |= (dy * ci - dx * si).abs() > bi + aj * s + bj * c
    sep |= (dx * cj + dy * sj).abs() > aj + ai * c + bi * s
    sep |= (dy * cj - dx * sj).abs() > bj + ai * s + bi * c
    A = heading.shape[1]
    hit = ~sep & present[:, :, None] & present[:, None, :] & ~torch.eye(A, dtype=torch.bool)
    hit &= query[:, :, None]
    return hit.any(2) | hit.any(1)


@pytest.mark.parametrize("W,A,scale", [(3, 37, 0.7), (2, 64, 1.0), (4, 9, 1.3)])
def test_reference_equals_dense_all_pairs(W, A, scale):
    """Compaction + circle pre-check give the answer of the exhaustive test (random, dense scenes)."""
    args = _random(W, A, seed=100 + A)
    g = torch.Generator().manual_seed(A)
    query = torch.rand(W, A, generator=g) < 0.4
    want = _dense_oracle(*args, scale, query)
    got = collisions_reference(*args, scale, query=query)
    assert want.any() and not want.all()
    assert torch.equal(got, want)
    assert torch.equal(collisions_reference(*args, scale), _dense_oracle(*args, scale, torch.ones_like(query)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_query_mask_flags_only_overlaps_with_query_agents(backend):
    # 0 (query) overlaps 1; 2 and 3 overlap each other but neither is a query agent
    dev = backend_device(backend)
    args = _boxes((0, 0, 0, 4, 2), (3, 0, 0, 4, 2), (50, 0, 0, 4, 2), (52, 0, 0, 4, 2), device=dev)
    query = torch.tensor([[True, False, False, False]], device=dev)
    with use_backend(backend):
        hit = collisions(*args, 1.0, query=query)
        assert hit.tolist() == [[True, True, False, False]]
        assert collisions(*args, 1.0).tolist() == [[True, True, True, True]]


def test_query_mask_kernel_matches_reference():
    args = _random(2, 70, seed=9)
    query = torch.rand(2, 70, generator=torch.Generator().manual_seed(1)) < 0.3
    ref = collisions_reference(*args, 0.8, query=query)
    assert ref.any()
    with use_backend("triton"):
        assert torch.equal(to_cpu(collisions(*to_kernel_device(args), 0.8, query=query.to(KERNEL_DEVICE))), ref)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_query_raises(backend):
    dev = backend_device(backend)
    args = tuple(x.to(dev) for x in _random(2, 5, seed=0))
    with use_backend(backend):
        with pytest.raises(ValueError, match="query"):
            collisions(*args, 1.0, query=torch.ones(2, 4, dtype=torch.bool, device=dev))
        with pytest.raises(ValueError, match="query"):
            collisions(*args, 1.0, query=torch.ones(2, 5, device=dev))
