"""Per-stage wall-clock timers for :class:`gpusim.env.DriveEnv`, switched on only while profiling.

:func:`instrument_env` installs, for the duration of a ``with`` block, a stage hook
(``DriveEnv.stage_hook``, see :mod:`gpusim.sim.pipeline`) that adds the wall time of every named
stage of the step (``motion``, ``replay``, ``contacts``, ``rewards``, ``goals``, ``trial``,
``accounting``, ``restart``, ``observe``) and of ``expert_actions`` to a :class:`KernelTimer`.
Nothing is patched: outside the block the hook is ``None`` and costs nothing.

On CUDA the hook synchronises the device before and after each stage, so a stage's time is its
own (this serialises the step; use it for the breakdown, not for the headline throughput).

Everything the step does outside the stages (action check, building the result) is reported as
``other`` = step time - sum of the stages.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import torch

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

    def hook(self, name: str, call):
        """Stage hook (``DriveEnv.stage_hook``): run ``call()`` and add its wall time under ``name``."""
        return self.wrap(name, call)()

    def report(self, steps: int) -> dict[str, float]:
        """Milliseconds per step of each name (``steps`` >= 1)."""
        return {k: 1000.0 * v / max(1, steps) for k, v in sorted(self.seconds.items())}


@contextlib.contextmanager
def instrument_env(timer, env):
    """Inside the block, ``env`` reports every stage call to ``timer.hook(name, call)``.

    Args:
        timer: a :class:`KernelTimer` (or anything with a ``hook(name, call)`` method).
        env: the :class:`~gpusim.env.DriveEnv` to instrument; its previous ``stage_hook`` comes
            back on exit, also when the block raises.
    """
    saved = env.stage_hook
    env.stage_hook = timer.hook
    try:
        yield timer
    finally:
        env.stage_hook = saved
