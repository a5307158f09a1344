"""Interpreter-safe math helpers for Triton kernels (shared by every kernel module).

Triton's CPU interpreter (``TRITON_INTERPRET=1``, how kernels are tested without a GPU) has no
libdevice, so ``atan2``, ``tanh``, ``pow``, ``rsqrt``, ... are unavailable there. These helpers
build them from the core ops that work both compiled and interpreted (``tl.exp``, ``tl.sqrt``,
``tl.sin``, ``tl.cos``, ``tl.abs``, ``tl.where``, ``tl.floor``, ``tl.ceil``, arithmetic).
All take and return float32 blocks.

Accuracy (float32, measured against ``torch`` over dense grids in ``tests/test_dynamics.py``):
``atan``/``atan2`` within 2e-7 rad, ``tanh`` within 1e-7, ``tan`` within a few ulp for
``|x| <= 1``, ``wrap_angle`` exact up to float32 rounding of ``2 * pi``.

``atan`` uses the classic Cephes single-precision scheme (argument reduction to
``|x| <= tan(pi/8)`` followed by a degree-9 odd polynomial; coefficients from the Cephes
``atanf`` documentation, S. L. Moshier).
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

# Float versions, for torch code (and anything on the host).
PI = math.pi
HALF_PI = math.pi / 2
QUARTER_PI = math.pi / 4
TWO_PI = 2 * math.pi
#: tan(3 pi / 8) and tan(pi / 8), the argument-reduction thresholds of the Cephes atanf scheme.
TAN_3PI_8 = 2.414213562373095
TAN_PI_8 = 0.4142135623730950

# The same values as ``tl.constexpr``, for use inside ``@triton.jit`` code. The compiler only
# accepts module-level globals that are constexpr (a plain float works under the interpreter and
# fails to compile with ``NameError``; tests/test_aot_compile.py checks every kernel).
PI_C: tl.constexpr = tl.constexpr(PI)
HALF_PI_C: tl.constexpr = tl.constexpr(HALF_PI)
QUARTER_PI_C: tl.constexpr = tl.constexpr(QUARTER_PI)
TWO_PI_C: tl.constexpr = tl.constexpr(TWO_PI)
TAN_3PI_8_C: tl.constexpr = tl.constexpr(TAN_3PI_8)
TAN_PI_8_C: tl.constexpr = tl.constexpr(TAN_PI_8)


@triton.jit
def atan(x):
    """Arc tangent of a float32 block (rad, in [-pi/2, pi/2])."""
    ax = tl.abs(x)
    big = ax > TAN_3PI_8_C
    mid = (ax > TAN_PI_8_C) & (~big)
    safe = tl.where(big, ax, 1.0)
    r = tl.where(big, -1.0 / safe, tl.where(mid, (ax - 1.0) / (ax + 1.0), ax))
    base = tl.where(big, HALF_PI_C, tl.where(mid, QUARTER_PI_C, 0.0))
    z = r * r
    p = (((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z - 3.33329491539e-1) * z * r + r
    y = base + p
    return tl.where(x < 0, -y, y)


@triton.jit
def atan2(y, x):
    """Angle of the vector (x, y) (rad, in [-pi, pi]); ``atan2(0, 0) = 0``."""
    ax = tl.abs(x)
    ay = tl.abs(y)
    mx = tl.maximum(ax, ay)
    mn = tl.minimum(ax, ay)
    t = mn / tl.where(mx > 0, mx, 1.0)  # in [0, 1]
    r = atan(t)
    r = tl.where(ay > ax, HALF_PI_C - r, r)
    r = tl.where(x < 0, PI_C - r, r)
    return tl.where(y < 0, -r, r)


@triton.jit
def tanh(x):
    """Hyperbolic tangent of a float32 block (overflow-safe)."""
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def tan(x):
    """Tangent of a float32 block (``sin / cos``; callers keep ``|x|`` well below pi/2)."""
    return tl.sin(x) / tl.cos(x)


@triton.jit
def wrap_angle(a):
    """Wrap angles to (-pi, pi] (same formula as :func:`wrap_angle_torch`)."""
    return a - TWO_PI_C * tl.ceil((a - PI_C) / TWO_PI_C)


def wrap_angle_torch(a):
    """Torch twin of :func:`wrap_angle`: ``a - 2 pi * ceil((a - pi) / (2 pi))``, in (-pi, pi]."""
    import torch

    return a - TWO_PI * torch.ceil((a - PI) / TWO_PI)
