"""CUDA C kernels launched through CuPy (the ``cuda`` extra), with zero-copy torch interop.

Sources live next to this file: ``<name>.cu`` holds thin ``extern "C" __global__`` wrappers, the
math lives in ``__host__ __device__`` functions of ``<name>.cuh`` (shared with the host-side test
library ``host_abi.cpp``), and ``common.cuh`` holds the portability macros.

* CuPy is imported lazily, only when a kernel is launched: ``import gpusim`` never needs it.
* :func:`module` compiles ``<name>.cu`` once per process with ``cupy.RawModule`` (NVRTC, options
  :func:`compile_options`; CuPy also caches the binary on disk under ``~/.cupy/kernel_cache``).
* Tensors cross over without copies via DLPack (``cupy.from_dlpack``, falling back to
  ``__cuda_array_interface__`` through ``cupy.asarray``); kernels run on the tensor's device and on
  torch's current CUDA stream, so they order correctly with surrounding torch work.

They run under the ``"cupy"`` backend: the calling kernel module's dispatcher runs them when
``gpusim.backend.op_backend`` resolves to ``"cupy"`` (the default on CUDA tensors with CuPy usable).
"""

from __future__ import annotations

import functools
import pathlib

import torch

SOURCE_DIR = pathlib.Path(__file__).resolve().parent
#: module name -> (source file, kernel names it defines)
SOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "advantage": ("advantage.cu", ("gpusim_advantage_kernel",)),
    "ema": ("ema.cu", ("gpusim_ema_update_kernel", "gpusim_ema_report_kernel")),
}
#: Threads per block of the one-thread-per-row kernels.
ROW_THREADS = 128
#: Must equal GPUSIM_EMA_REPORT_THREADS in ema.cuh.
EMA_REPORT_THREADS = 256


def compile_options() -> tuple[str, ...]:
    """Compiler options for NVRTC (also used by the tests' ``nvcc -ptx`` check): include path of
    the headers and the C++ standard."""
    return (f"-I{SOURCE_DIR}", "--std=c++17")


def source_path(name: str) -> pathlib.Path:
    """Path of the ``.cu`` file of kernel module ``name``.

    Raises:
        KeyError: unknown module name.
    """
    if name not in SOURCES:
        raise KeyError(f"no CUDA source module {name!r}; known: {sorted(SOURCES)}")
    return SOURCE_DIR / SOURCES[name][0]


@functools.lru_cache(maxsize=None)
def module(name: str):
    """The compiled ``cupy.RawModule`` of ``<name>.cu`` (compiled once per process).

    Raises:
        ImportError: CuPy is not installed (install the ``cuda`` extra).
        KeyError: unknown module name.
    """
    import cupy  # lazy: CuPy is optional

    return cupy.RawModule(code=source_path(name).read_text(), options=compile_options())


def kernel(module_name: str, kernel_name: str):
    """A ``cupy.RawKernel`` from :func:`module`."""
    return module(module_name).get_function(kernel_name)


def as_cupy(t: torch.Tensor):
    """Zero-copy CuPy view of a contiguous CUDA tensor (bool tensors are viewed as uint8)."""
    import cupy

    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    try:
        return cupy.from_dlpack(t)
    except Exception:  # older CuPy/torch pairs: the CUDA array interface, also zero-copy
        return cupy.asarray(t)


class _StreamHandle:
    """A raw ``cudaStream_t`` behind the CUDA stream protocol (``__cuda_stream__``: version 0 and
    the handle, as cuda-python's ``IsStreamT`` protocol defines it)."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def cupy_stream(handle: int, device_index: int):
    """A CuPy stream object for the external CUDA stream ``handle`` (an int, e.g. torch's
    ``current_stream().cuda_stream``) on device ``device_index``: ``cupy.cuda.Stream.from_external``
    where CuPy has it (CuPy 14 deprecates ``ExternalStream``), else ``cupy.cuda.ExternalStream``
    (CuPy 13). Use it as a context manager to make it CuPy's current stream."""
    import cupy

    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(_StreamHandle(int(handle)))
    return cupy.cuda.ExternalStream(int(handle), device_index)


def _launch(t: torch.Tensor, kern, grid: int, block: int, args: tuple) -> None:
    """Launch ``kern`` on ``t``'s device and torch's current stream; ``args`` holds torch tensors
    (viewed through :func:`as_cupy` here) and NumPy scalars.

    The tensors are handed to CuPy *inside* the stream context: DLPack's export makes the
    consumer's current stream wait on torch's, and outside the context that is CuPy's legacy
    default stream, a dependency that invalidates a CUDA-graph capture (seen on an H100: the
    trainer's graphed rollout failed in the accounting stage's EMA update)."""
    import cupy

    with cupy.cuda.Device(t.device.index):
        with cupy_stream(torch.cuda.current_stream(t.device).cuda_stream, t.device.index):
            kern((grid,), (block,), tuple(as_cupy(a) if isinstance(a, torch.Tensor) else a for a in args))


def advantage_args(rewards, values, bootstrap_stop, last_value, gamma, gae_lambda, log_rho, rho_clip, c_clip,
                   adv, ret) -> tuple:
    """Argument tuple of ``gpusim_advantage_kernel`` (order and C types of its signature; tensors
    stay torch tensors until :func:`_launch`)."""
    import numpy as np

    B, T = rewards.shape
    rho = log_rho if log_rho is not None else rewards  # dummy pointer, ignored when has_rho = 0
    return (rewards, values, bootstrap_stop, last_value, rho, adv, ret) + (
        np.int64(B), np.int64(T), np.float32(gamma), np.float32(gae_lambda), np.float32(rho_clip),
        np.float32(c_clip), np.int32(log_rho is not None))


def advantage_cupy(rewards, values, bootstrap_stop, last_value, gamma, gae_lambda, log_rho=None,
                   rho_clip=1.0, c_clip=1.0):
    """CuPy launch of ``gpusim_advantage_kernel`` (inputs validated by
    :func:`gpusim.kernels.advantage.advantage`). Returns new (advantages, returns) [B, T] float32."""
    B, T = rewards.shape
    rewards, values, last_value = rewards.contiguous(), values.contiguous(), last_value.contiguous()
    stop = bootstrap_stop.contiguous()
    log_rho = log_rho.contiguous() if log_rho is not None else None
    adv, ret = torch.empty_like(rewards), torch.empty_like(rewards)
    if B == 0 or T == 0:
        return adv, ret
    args = advantage_args(rewards, values, stop, last_value, gamma, gae_lambda, log_rho, rho_clip, c_clip, adv, ret)
    _launch(rewards, kernel("advantage", "gpusim_advantage_kernel"), (B + ROW_THREADS - 1) // ROW_THREADS,
            ROW_THREADS, args)
    return adv, ret


def ema_update_args(slots, has_data, episode, done, alpha) -> tuple:
    """Argument tuple of ``gpusim_ema_update_kernel``."""
    import numpy as np

    N, M = slots.shape
    return (slots, has_data, episode, done) + (np.int64(N), np.int64(M), np.float32(alpha))


def ema_update_cupy(slots, has_data, episode, done, alpha):
    """CuPy launch of ``gpusim_ema_update_kernel``, in place on ``slots``/``has_data`` (validated by
    :func:`gpusim.kernels.ema.ema_update`)."""
    N, M = slots.shape
    episode, done = episode.contiguous(), done.contiguous()
    if N == 0:
        return slots, has_data
    _launch(slots, kernel("ema", "gpusim_ema_update_kernel"), (N + ROW_THREADS - 1) // ROW_THREADS,
            ROW_THREADS, ema_update_args(slots, has_data, episode, done, alpha))
    return slots, has_data


def ema_report_args(slots, has_data, mean, n) -> tuple:
    """Argument tuple of ``gpusim_ema_report_kernel``."""
    import numpy as np

    N, M = slots.shape
    return (slots, has_data, mean, n) + (np.int64(N), np.int64(M))


def ema_report_cupy(slots, has_data):
    """CuPy launch of ``gpusim_ema_report_kernel`` (one block per metric column). Returns
    (mean [M] float32, n [] int64)."""
    N, M = slots.shape
    slots, has_data = slots.contiguous(), has_data.contiguous()
    mean = torch.zeros(M, dtype=torch.float32, device=slots.device)
    n = torch.zeros(1, dtype=torch.int64, device=slots.device)
    if M == 0:
        return mean, has_data.sum(dtype=torch.int64)
    if N == 0:
        return mean, n.view(())
    _launch(slots, kernel("ema", "gpusim_ema_report_kernel"), M, EMA_REPORT_THREADS,
            ema_report_args(slots, has_data, mean, n))
    return mean, n.view(())
