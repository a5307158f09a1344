"""Record or count Triton kernel launches (compiled or interpreted), for tests and profiling.

The helpers patch ``run`` of Triton's ``JITFunction`` (and, when present, the interpreter's
``InterpretedFunction``) for the duration of a ``with`` block and restore it on exit, also when the
block raises (``gpusim.aot.on_launch``, shared with the ahead-of-time compile test). Warm-up calls
are not counted. Results are live: they can be read inside the block.
"""

from __future__ import annotations

import collections
import contextlib

from gpusim.aot import jit_classes, on_launch


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


def _is_kernel_op(func) -> bool:
    """True for an aten op that launches device work: not a view/alias, not a bare allocation,
    not a metadata query."""
    if getattr(func, "is_view", False):
        return False
    name = func.overloadpacket.__name__
    return name not in NO_KERNEL_OPS


#: aten ops that allocate or describe memory without launching a kernel.
NO_KERNEL_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset", "is_contiguous", "set_", "resize_", "detach", "lift_fresh",
})


@contextlib.contextmanager
def count_ops():
    """Count Triton launches and the other torch kernels of a ``with`` block.

    Yields a ``collections.Counter`` (updated live) with ``"triton"`` (Triton launches, compiled
    or interpreted), ``"torch"`` (aten ops that launch a kernel on the tensors' device, outside the
    Triton launches) and ``"torch:<op>"`` per op. An aten op is counted as one kernel unless it is
    a view or alias (``OpOverload.is_view``) or in :data:`NO_KERNEL_OPS`; ops that launch several
    kernels (``sort``, ``nonzero``, ...) still count once, and a no-op ``.contiguous()`` never
    reaches the dispatcher, so this is the number of device-op calls, a close proxy for CUDA
    kernel launches. The torch work inside a launch (the interpreter's own tensor handling) is
    not counted.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    counts: collections.Counter = collections.Counter()
    depth = [0]

    class _Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if depth[0] == 0 and _is_kernel_op(func):
                counts["torch"] += 1
                counts["torch:" + func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    saved = []
    for cls in jit_classes():
        orig = cls.run

        def run(self, *args, __orig=orig, **kwargs):
            if not kwargs.get("warmup", False):
                counts["triton"] += 1
            depth[0] += 1
            try:
                return __orig(self, *args, **kwargs)
            finally:
                depth[0] -= 1

        cls.run = run
        saved.append((cls, orig))
    try:
        with _Mode():
            yield counts
    finally:
        for cls, orig in saved:
            cls.run = orig
