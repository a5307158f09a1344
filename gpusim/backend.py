"""Which implementation of a computation runs: ``"torch"`` (reference), ``"triton"``, ``"c"`` or
``"cupy"``.

Rules (docs/design.md section 3, docs/kernels.md "Backends"):

* The backend is chosen once and handed down: the env's step resolves it once
  (:func:`step_backend`, kept in ``StepVars.backend``) and every op's dispatcher takes it as
  ``backend=``; a dispatcher called with ``backend=None`` resolves it with :func:`op_backend`. No
  other module chooses a backend from its tensors.
* The default (:func:`backend_for`): CPU tensors run the vectorised torch reference (the env's step:
  the C kernels, :func:`step_backend`); CUDA tensors run ``"cupy"`` when CuPy is usable
  (:func:`cupy_available`) and ``"triton"`` otherwise.
* ``"cupy"``: the CUDA C kernels launched through CuPy (``gpusim/kernels/cuda/``) for the ops that
  have one (the EMA log and the advantages); every other op runs its Triton kernel
  (:data:`FALLBACK`). So on CUDA the default runs CuPy exactly where a CuPy kernel exists and
  Triton elsewhere; forcing ``"triton"`` runs Triton everywhere. CUDA tensors only, CuPy required.
* ``"c"``, the hand-written C kernels of the CPU path (CPU tensors only): the env runs them where
  :func:`step_backend` says so (``EnvConfig.cpu_kernels`` on the torch backend with CPU tensors);
  an op without a C kernel runs its torch reference under ``"c"`` (:data:`FALLBACK`).
* ``GPUSIM_BACKEND=torch|triton|c|cupy`` or :func:`use_backend` (a ``with`` block, used by tests
  and benchmarks) forces one. ``triton`` on CPU tensors is only valid with ``TRITON_INTERPRET=1``
  (Triton's interpreter), which is how kernels are tested without a GPU.

The kernels package imports only this module from the rest of the project.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch

BACKENDS = ("torch", "triton", "c", "cupy")
#: What an op's ``backend=`` argument may name (None: :func:`backend_for` of its tensors).
OP_BACKENDS = BACKENDS
#: The backends of CUDA tensors (compiled GPU kernels; a CUDA graph can capture their steps).
GPU_BACKENDS = ("triton", "cupy")
#: The kernel an op runs under a backend it has no kernel for: ``"cupy"`` -> its Triton kernel,
#: ``"c"`` -> its torch reference (:func:`op_backend`).
FALLBACK = {"cupy": "triton", "c": "torch"}
#: The kernels every op has (its ``kernels=`` in :func:`op_backend` adds ``"c"`` / ``"cupy"``).
BASE_KERNELS = ("torch", "triton")
#: ``kernels=`` of an op with a C kernel (``gpusim/kernels/<op>.c``).
WITH_C = (*BASE_KERNELS, "c")
#: ``kernels=`` of an op with a CuPy kernel (``gpusim/kernels/cuda/<op>.cu``).
WITH_CUPY = (*BASE_KERNELS, "cupy")
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
    """The backend that runs a computation on ``tensor``'s device: the forced one
    (:func:`requested_backend`), else ``"torch"`` on the CPU and, on CUDA, ``"cupy"`` when CuPy is
    usable (:func:`cupy_available`), ``"triton"`` otherwise.

    Raises:
        RuntimeError: if ``triton`` is forced on CPU tensors without ``TRITON_INTERPRET=1``, ``c``
            on tensors that are not on the CPU, or ``cupy`` on tensors that are not on a CUDA
            device or where CuPy is not usable (the message names what is missing).
    """
    forced = requested_backend()
    if forced is None:
        if tensor.device.type == "cuda":
            return "cupy" if cupy_available() else "triton"
        return "torch"
    if forced == "torch":
        return "torch"
    if forced == "c":
        if not tensor.is_cpu:
            raise RuntimeError(f"GPUSIM_BACKEND=c runs CPU tensors only, got a tensor on {tensor.device}")
        return "c"
    if forced == "cupy":
        problem = _cupy_problem(tensor)
        if problem is not None:
            raise RuntimeError(f"GPUSIM_BACKEND=cupy {problem}")
        return "cupy"
    if tensor.device.type != "cuda" and not interpreter_active():
        raise RuntimeError(
            "GPUSIM_BACKEND=triton on CPU tensors needs TRITON_INTERPRET=1 set before gpusim is imported"
        )
    return "triton"


@contextlib.contextmanager
def use_backend(name: str):
    """Force backend ``name`` (one of :data:`BACKENDS`) inside a ``with`` block.

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
def cupy_missing() -> str | None:
    """Why CuPy cannot launch kernels in this process (None when it can): not installed, or it sees
    no CUDA device. CuPy is optional (the ``cuda`` extra); it is imported here, lazily, once."""
    try:
        import cupy  # noqa: F401  (lazy: never required on CPU-only installs)
    except Exception as e:  # ImportError, or a broken install failing at import
        return f"CuPy is not importable ({type(e).__name__}: {e}); install the 'cuda' extra: pip install 'gpusim[cuda]'"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, no device
        return f"CuPy sees no CUDA device ({type(e).__name__}: {e})"
    return None if count > 0 else "CuPy sees no CUDA device"


def cupy_available() -> bool:
    """True if CuPy imports and sees a CUDA device (:func:`cupy_missing` is None)."""
    return cupy_missing() is None


def _cupy_problem(tensor: torch.Tensor) -> str | None:
    """Why the ``"cupy"`` backend cannot run ``tensor`` (None when it can), as the end of a sentence."""
    if tensor.device.type != "cuda":
        return f"runs CUDA tensors only, got a tensor on {tensor.device}"
    missing = cupy_missing()
    return None if missing is None else f"needs CuPy with a CUDA device: {missing}"


def step_backend(tensor: torch.Tensor, cpu_kernels: bool) -> str:
    """The backend of a simulator step on ``tensor``'s device, chosen once per step and handed to
    every op: ``"c"`` where :func:`backend_for` says ``"torch"``, the tensor is on the CPU and
    ``cpu_kernels`` (``EnvConfig.cpu_kernels``); else :func:`backend_for`'s answer. Ops whose C
    kernel cannot be built run their torch reference under ``"c"`` (one warning,
    ``gpusim.kernels.cbuild``).

    Raises:
        RuntimeError: as :func:`backend_for`.
    """
    name = backend_for(tensor)
    return "c" if name == "torch" and cpu_kernels and tensor.is_cpu else name


def op_backend(backend: str | None, tensor: torch.Tensor, kernels: tuple[str, ...] = BASE_KERNELS) -> str:
    """The kernel an op's dispatcher runs, one of ``kernels``: ``backend`` when given (the step's
    backend, handed down), else :func:`backend_for` of ``tensor``; a backend the op has no kernel
    for runs its :data:`FALLBACK` (``"cupy"`` -> ``"triton"``, ``"c"`` -> ``"torch"``).

    Args:
        backend: one of :data:`OP_BACKENDS`, or None.
        tensor: a tensor of the op (its device decides the default and is checked).
        kernels: the op's kernels: :data:`BASE_KERNELS` plus ``"c"`` / ``"cupy"`` where it has them.

    Raises:
        ValueError: a name outside :data:`OP_BACKENDS`; ``"c"`` on a tensor that is not on the CPU;
            ``"cupy"`` on a tensor that is not on a CUDA device.
        RuntimeError: ``"cupy"`` where CuPy is not usable (the message says why); as
            :func:`backend_for` when ``backend`` is None.
    """
    name = backend_for(tensor) if backend is None else backend
    if backend is not None:
        if backend == "c":
            if not tensor.is_cpu:
                raise ValueError(f"backend 'c' runs CPU tensors only, got a tensor on {tensor.device}")
        elif backend == "cupy":
            problem = _cupy_problem(tensor)
            if problem is not None:
                raise (ValueError if tensor.device.type != "cuda" else RuntimeError)(f"backend 'cupy' {problem}")
        elif backend not in OP_BACKENDS:
            raise ValueError(f"unknown backend {backend!r}: expected one of {OP_BACKENDS}")
    return name if name in kernels else FALLBACK.get(name, name)
