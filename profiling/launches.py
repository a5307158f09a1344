"""Record or count Triton kernel launches (compiled or interpreted), for tests and profiling.

The helpers patch ``run`` of Triton's ``JITFunction`` (and, when present, the interpreter's
``InterpretedFunction``) for the duration of a ``with`` block and restore it on exit, also when the
block raises (``gpusim.aot.on_launch``, shared with the ahead-of-time compile test). Warm-up calls
are not counted. Results are live: they can be read inside the block.
"""

from __future__ import annotations

import collections
import contextlib

from gpusim.aot import on_launch


@contextlib.contextmanager
def record_launches():
    """Yield a list that receives ``(kernel_name, {arg_name: value})`` for every Triton launch."""
    log: list = []

    def record(fn, args, kwargs):
        bound = dict(zip(fn.arg_names, args))
        bound.update({k: v for k, v in kwargs.items() if k in fn.arg_names})
        log.append((fn.fn.__name__, bound))

    with on_launch(record):
        yield log


@contextlib.contextmanager
def count_launches():
    """Yield a ``collections.Counter`` of Triton launches by kernel name (updated live)."""
    counts: collections.Counter = collections.Counter()

    def count(fn, args, kwargs):
        counts[fn.fn.__name__] += 1

    with on_launch(count):
        yield counts
