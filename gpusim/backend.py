"""Which implementation of a computation runs: ``"torch"`` (reference), ``"triton"`` or ``"c"``.

Rules (docs/design.md section 3):

* CUDA tensors run the Triton kernels (and CuPy kernels where a module provides them and CuPy is
  importable); CPU tensors run the vectorised torch reference.
* ``GPUSIM_BACKEND=torch|triton`` overrides the choice. ``triton`` on CPU tensors is only valid
  with ``TRITON_INTERPRET=1`` (Triton's interpreter), which is how kernels are tested without a GPU.
* :func:`use_backend` overrides it for a ``with`` block (used by tests and benchmarks).
* ``"c"``, the hand-written C kernels of the CPU path (CPU tensors only): the env runs them where
  :func:`step_backend` says so (``EnvConfig.cpu_kernels`` on the torch backend with CPU tensors);
  an op's dispatcher takes ``backend=`` (:data:`OP_BACKENDS`, resolved by :func:`op_backend`), and
  forcing ``"c"`` (``use_backend("c")``, ``GPUSIM_BACKEND=c``) runs every op that has a C kernel
  through it (the others run their torch reference).

The kernels package imports only this module from the rest of the project.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch

BACKENDS = ("torch", "triton", "c")
#: What an op's ``backend=`` argument may name (None: :func:`backend_for` of its tensors).
OP_BACKENDS = BACKENDS
_override: list[str] = []


_gpu_sizes: list[bool] = []


def normalize_device(device) -> torch.device:
    """The canonical form of ``device``: ``cpu`` (no index) or ``cuda:<index>`` (index filled in
    from the current CUDA device). Tensors report these forms, while ``torch.device("cuda") !=
    torch.device("cuda:0")`` and ``torch.device("cpu:0") != torch.device("cpu")``: compare
    normalised devices only (docs/design.md section 3)."""
    d = torch.device(device)
    if d.type == "cpu":
        return torch.device("cpu")
    if d.type == "cuda" and d.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return d


def interpreter_active() -> bool:
    """True when Triton kernels run through Triton's CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def interpreting() -> bool:
    """True when launchers should size their launches for Triton's CPU interpreter.

    That is: the interpreter is active (:func:`interpreter_active`) and no
    :func:`gpu_launch_sizes` block is open. Launchers use it to pick block sizes (the interpreter
    costs ~1 ms per program instance, so it wants few, large blocks; a GPU wants smaller ones).
    """
    return interpreter_active() and not _gpu_sizes


@contextlib.contextmanager
def gpu_launch_sizes():
    """Inside the ``with`` block launchers choose the launch sizes they would use on a GPU, even
    under the interpreter (:func:`interpreting` returns False). The ahead-of-time compile test
    (``gpusim/aot.py``) records launches this way, so it compiles what a GPU really runs."""
    _gpu_sizes.append(True)
    try:
        yield
    finally:
        _gpu_sizes.pop()


def requested_backend() -> str | None:
    """The forced backend (from :func:`use_backend` or ``GPUSIM_BACKEND``), or None.

    Raises:
        ValueError: if ``GPUSIM_BACKEND`` names an unknown backend.
    """
    if _override:
        return _override[-1]
    env = os.environ.get("GPUSIM_BACKEND", "").strip().lower()
    if not env:
        return None
    if env not in BACKENDS:
        raise ValueError(f"GPUSIM_BACKEND={env!r}: expected one of {BACKENDS}")
    return env


def backend_for(tensor: torch.Tensor) -> str:
    """The backend that runs a computation on ``tensor``'s device: ``"torch"`` or ``"triton"``
    (``"c"`` only where forced).

    Raises:
        RuntimeError: if ``triton`` is forced on CPU tensors without ``TRITON_INTERPRET=1``, or
            ``c`` on tensors that are not on the CPU.
    """
    forced = requested_backend()
    if forced == "torch":
        return "torch"
    if forced == "c":
        if not tensor.is_cpu:
            raise RuntimeError(f"GPUSIM_BACKEND=c runs CPU tensors only, got a tensor on {tensor.device}")
        return "c"
    if forced == "triton":
        if tensor.device.type != "cuda" and not interpreter_active():
            raise RuntimeError(
                "GPUSIM_BACKEND=triton on CPU tensors needs TRITON_INTERPRET=1 set before gpusim is imported"
            )
        return "triton"
    return "triton" if tensor.device.type == "cuda" else "torch"


@contextlib.contextmanager
def use_backend(name: str):
    """Force backend ``name`` ("torch", "triton" or "c") inside a ``with`` block.

    Raises:
        ValueError: for an unknown name.
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}: expected one of {BACKENDS}")
    _override.append(name)
    try:
        yield
    finally:
        _override.pop()


@functools.lru_cache(maxsize=1)
def cupy_available() -> bool:
    """True if CuPy imports and sees a CUDA device. CuPy is optional (the ``cuda`` extra)."""
    try:
        import cupy  # noqa: F401  (lazy: never required on CPU-only installs)

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def use_cupy(tensor: torch.Tensor) -> bool:
    """True when a CuPy kernel should run for ``tensor``: CUDA tensor, CuPy usable, no override."""
    return tensor.device.type == "cuda" and requested_backend() is None and cupy_available()


def step_backend(tensor: torch.Tensor, cpu_kernels: bool) -> str:
    """The backend of a simulator step on ``tensor``'s device: ``"c"`` where :func:`backend_for`
    says ``"torch"``, the tensor is on the CPU and ``cpu_kernels`` (``EnvConfig.cpu_kernels``);
    else :func:`backend_for`'s answer. Ops whose C kernel cannot be built run their torch
    reference under ``"c"`` (one warning, ``gpusim.kernels.cbuild``)."""
    name = backend_for(tensor)
    return "c" if name == "torch" and cpu_kernels and tensor.is_cpu else name


def op_backend(backend: str | None, tensor: torch.Tensor) -> str:
    """The backend an op's dispatcher runs: ``backend`` when given, else :func:`backend_for`.

    Raises:
        ValueError: a name outside :data:`OP_BACKENDS`; ``"c"`` on a tensor that is not on the CPU.
    """
    if backend is None:
        return backend_for(tensor)
    if backend == "c":
        if not tensor.is_cpu:
            raise ValueError(f"backend 'c' runs CPU tensors only, got a tensor on {tensor.device}")
        return backend
    if backend not in OP_BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: expected one of {OP_BACKENDS}")
    return backend
