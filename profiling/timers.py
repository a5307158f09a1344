"""Per-kernel wall-clock timers for :class:`gpusim.env.DriveEnv`, switched on only while profiling.

:func:`instrument_env` replaces, for the duration of a ``with`` block, the kernel entry points that
``gpusim.env`` calls (``observations``, ``offroad``, ``collisions``, ``events``, ``replay``,
``hit_by``, the ``dynamics`` functions and, when present, ``trial_step``) by thin wrappers that
add their wall time to a :class:`KernelTimer`. Nothing in the simulator changes: outside the block
the env calls the kernels directly, so the timers cost nothing when off.

On CUDA the wrapper synchronises the device before and after each call, so a kernel's time is its
own (this serialises the step; use it for the breakdown, not for the headline throughput).

Everything the step does outside these calls (state bookkeeping, ``torch.where`` / ``cat`` glue,
metrics, the auto-reset) is reported as ``other`` = step time - sum of the kernels.
"""

from __future__ import annotations

import contextlib
import time
import types
from collections import defaultdict

import torch

#: Names in ``gpusim.env``'s namespace that are wrapped (missing ones are skipped).
ENV_KERNELS = ("observations", "offroad", "collisions", "events", "replay", "hit_by", "trial_step", "cell_index")
#: Functions of the ``gpusim.kernels.dynamics`` module that the env calls as ``dynamics.<name>``.
DYNAMICS_FUNCS = ("decode_actions", "bicycle_step", "inverse_bicycle", "encode_actions")


class KernelTimer:
    """Accumulates seconds and call counts per name.

    Args:
        sync_cuda: synchronise CUDA before and after each timed call (default: when CUDA is
            available).

    Attributes:
        seconds: dict name -> total seconds. calls: dict name -> number of calls.
    """

    def __init__(self, sync_cuda: bool | None = None):
        self.sync_cuda = torch.cuda.is_available() if sync_cuda is None else bool(sync_cuda)
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def reset(self) -> None:
        """Forget all accumulated times."""
        self.seconds.clear()
        self.calls.clear()

    def wrap(self, name: str, fn):
        """``fn`` wrapped so that each call adds its wall time under ``name``."""

        def timed(*args, **kwargs):
            if self.sync_cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.sync_cuda:
                    torch.cuda.synchronize()
                self.seconds[name] += time.perf_counter() - t0
                self.calls[name] += 1

        timed.__wrapped__ = fn
        timed.__doc__ = fn.__doc__
        return timed

    def report(self, steps: int) -> dict[str, float]:
        """Milliseconds per step of each name (``steps`` >= 1)."""
        return {k: 1000.0 * v / max(1, steps) for k, v in sorted(self.seconds.items())}


@contextlib.contextmanager
def instrument_env(timer: KernelTimer):
    """Inside the block, every ``DriveEnv`` times its kernel calls into ``timer``.

    Patches names in the ``gpusim.env`` module (not the kernels themselves) and restores them on
    exit, also when the block raises.
    """
    import gpusim.env as env_mod

    saved = {}
    for name in ENV_KERNELS:
        if hasattr(env_mod, name):
            saved[name] = getattr(env_mod, name)
            setattr(env_mod, name, timer.wrap(name, saved[name]))
    dyn = getattr(env_mod, "dynamics", None)
    if dyn is not None:
        saved["dynamics"] = dyn
        proxy = types.SimpleNamespace(**{k: getattr(dyn, k) for k in dir(dyn) if not k.startswith("__")})
        for name in DYNAMICS_FUNCS:
            if hasattr(dyn, name):
                setattr(proxy, name, timer.wrap(name, getattr(dyn, name)))
        env_mod.dynamics = proxy
    try:
        yield timer
    finally:
        for name, fn in saved.items():
            setattr(env_mod, name, fn)
