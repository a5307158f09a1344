"""Record or count Triton kernel launches (compiled or interpreted), for tests and profiling.

The helpers patch ``run`` of Triton's ``JITFunction`` (and, when present, the interpreter's
``InterpretedFunction``) for the duration of a ``with`` block and restore it on exit, also when the
block raises. Warm-up calls are not counted. Results are live: they can be read inside the block.
"""

from __future__ import annotations

import collections
import contextlib


@contextlib.contextmanager
def _on_launch(callback):
    """Call ``callback(jit_function, args, kwargs)`` before every (non-warm-up) Triton launch."""
    classes = []
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:  # pragma: no cover
        pass
    from triton.runtime.jit import JITFunction

    classes.append(JITFunction)
    saved = []
    for cls in classes:
        orig = cls.run

        def run(self, *args, __orig=orig, **kwargs):
            if not kwargs.get("warmup", False):
                callback(self, args, kwargs)
            return __orig(self, *args, **kwargs)

        cls.run = run
        saved.append((cls, orig))
    try:
        yield
    finally:
        for cls, orig in saved:
            cls.run = orig


@contextlib.contextmanager
def record_launches():
    """Yield a list that receives ``(kernel_name, {arg_name: value})`` for every Triton launch."""
    log: list = []

    def record(fn, args, kwargs):
        bound = dict(zip(fn.arg_names, args))
        bound.update({k: v for k, v in kwargs.items() if k in fn.arg_names})
        log.append((fn.fn.__name__, bound))

    with _on_launch(record):
        yield log


@contextlib.contextmanager
def count_launches():
    """Yield a ``collections.Counter`` of Triton launches by kernel name (updated live)."""
    counts: collections.Counter = collections.Counter()

    def count(fn, args, kwargs):
        counts[fn.fn.__name__] += 1

    with _on_launch(count):
        yield counts
