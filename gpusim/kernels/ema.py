"""Per-agent EMA metric slots (docs/design.md section 13): update on episode completion, population report.

Each controlled slot (a row of ``slots [N, M]``, N = worlds x controlled slots, M = metrics) keeps a
smoothed log of the metrics of the episodes it finished. On its first completion the row is set to
that episode's metrics; on later ones ``slot = alpha * slot + (1 - alpha) * episode``. A report
averages the rows that have data, so every agent weighs the same however often it finishes (an agent
that finishes ten short episodes counts once, like one that finishes a single long episode), never
resets them, and reports nothing while no row has data.

Choice where the design is silent: :func:`ema_update` writes **in place** on every backend (the
returned tensors are the ``slots`` / ``has_data`` arguments), which avoids an allocation per step on
the GPU and keeps the backends interchangeable.

Backends: torch reference (CPU), Triton kernels (update: one program per block of rows; report: one
program per block of metric columns, each looping over all rows — deterministic, no atomics) and CUDA
C kernels through CuPy (update: one thread per row; report: one block per metric column with a
shared-memory tree reduction; math in ``cuda/ema.cuh``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpusim import backend as _backend


def _check_update(slots, has_data, episode, done, alpha):
    for name, x in (("slots", slots), ("has_data", has_data), ("episode", episode), ("done", done)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"ema_update: {name} must be a torch.Tensor, got {type(x).__name__}")
    if slots.dim() != 2:
        raise ValueError(f"ema_update: slots must be [N, M], got shape {tuple(slots.shape)}")
    N, M = slots.shape
    for name, x, dtype, shape in (("slots", slots, torch.float32, (N, M)), ("has_data", has_data, torch.bool, (N,)),
                                  ("episode", episode, torch.float32, (N, M)), ("done", done, torch.bool, (N,))):
        if tuple(x.shape) != shape:
            raise ValueError(f"ema_update: {name} must have shape {shape}, got {tuple(x.shape)}")
        if x.dtype != dtype:
            raise TypeError(f"ema_update: {name} must be {dtype}, got {x.dtype}")
        if x.device != slots.device:
            raise ValueError(f"ema_update: {name} is on {x.device} but slots is on {slots.device}")
    if not slots.is_contiguous() or not has_data.is_contiguous():
        raise ValueError("ema_update: slots and has_data are updated in place and must be contiguous")
    if not 0.0 <= float(alpha) < 1.0:
        raise ValueError(f"ema_update: alpha must be in [0, 1), got {alpha}")


def _check_report(slots, has_data):
    for name, x in (("slots", slots), ("has_data", has_data)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"ema_report: {name} must be a torch.Tensor, got {type(x).__name__}")
    if slots.dim() != 2:
        raise ValueError(f"ema_report: slots must be [N, M], got shape {tuple(slots.shape)}")
    if slots.dtype != torch.float32:
        raise TypeError(f"ema_report: slots must be torch.float32, got {slots.dtype}")
    if tuple(has_data.shape) != (slots.shape[0],):
        raise ValueError(f"ema_report: has_data must have shape ({slots.shape[0]},), got {tuple(has_data.shape)}")
    if has_data.dtype != torch.bool:
        raise TypeError(f"ema_report: has_data must be torch.bool, got {has_data.dtype}")
    if has_data.device != slots.device:
        raise ValueError(f"ema_report: has_data is on {has_data.device} but slots is on {slots.device}")


# ------------------------------------------------------------------------------------------------
# Torch reference


def ema_update_reference(
    slots: torch.Tensor, has_data: torch.Tensor, episode: torch.Tensor, done: torch.Tensor, alpha: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold the metrics of just-finished episodes into the per-agent EMA slots, in place.

    Args:
        slots: [N, M] float32 EMA of each slot's episode metrics (contiguous; updated in place).
        has_data: [N] bool, True once the slot has completed an episode (contiguous; in place).
        episode: [N, M] float32 metrics of the episode that finished at this step (rows without
            ``done`` are ignored, whatever they hold, NaN included).
        done: [N] bool, True where a slot's episode finished at this step.
        alpha: smoothing factor in [0, 1) (``EnvConfig.log_ema_alpha``, default 0.707); 0 keeps
            only the last episode.

    Returns:
        ``(slots, has_data)``: the same tensor objects, updated. For ``done`` rows: first
        completion -> ``slot = episode``; later -> ``alpha * slot + (1 - alpha) * episode``;
        ``has_data |= done``. Other rows are unchanged.

    Raises:
        TypeError: non-tensor or wrong dtype. ValueError: wrong shapes, mixed devices,
        non-contiguous ``slots``/``has_data``, alpha outside [0, 1).
    """
    _check_update(slots, has_data, episode, done, alpha)
    blended = torch.where(has_data[:, None], alpha * slots + (1.0 - alpha) * episode, episode)
    slots.copy_(torch.where(done[:, None], blended, slots))
    has_data.logical_or_(done)
    return slots, has_data


def ema_report_reference(slots: torch.Tensor, has_data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Population mean of the EMA slots that have data.

    Args:
        slots: [N, M] float32 EMA slots (rows without data are ignored, whatever they hold).
        has_data: [N] bool.

    Returns:
        ``(mean [M] float32, n [] int64)``: mean over rows with ``has_data`` and their number;
        zeros and ``n = 0`` when no row has data. Nothing is reset. No host sync.

    Raises:
        TypeError: non-tensor or wrong dtype. ValueError: wrong shapes or mixed devices.
    """
    _check_report(slots, has_data)
    n = has_data.sum(dtype=torch.int64)
    total = torch.where(has_data[:, None], slots, 0.0).sum(0)
    return total / n.clamp_min(1).to(torch.float32), n


# ------------------------------------------------------------------------------------------------
# Triton kernels


@triton.jit
def _ema_update_kernel(slots_ptr, has_ptr, ep_ptr, done_ptr, N, M, alpha,
                       BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """One program per BLOCK_N rows; each row's M metrics in BLOCK_M-wide chunks."""
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    rmask = rows < N
    done = tl.load(done_ptr + rows, mask=rmask, other=0) != 0
    had = tl.load(has_ptr + rows, mask=rmask, other=0) != 0
    for m0 in range(0, M, BLOCK_M):
        cols = m0 + tl.arange(0, BLOCK_M).to(tl.int64)
        off = rows[:, None] * M + cols[None, :]
        upd = (rmask & done)[:, None] & (cols < M)[None, :]
        s = tl.load(slots_ptr + off, mask=upd, other=0.0)
        e = tl.load(ep_ptr + off, mask=upd, other=0.0)
        new = tl.where(had[:, None], alpha * s + (1.0 - alpha) * e, e)
        tl.store(slots_ptr + off, new, mask=upd)
    tl.store(has_ptr + rows, (had | done).to(tl.uint8), mask=rmask & done)


@triton.jit
def _ema_report_kernel(slots_ptr, has_ptr, mean_ptr, n_ptr, N, M,
                       BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """One program per BLOCK_M metric columns, looping over all N rows (deterministic order)."""
    pid = tl.program_id(0)
    cols = pid.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    cmask = cols < M
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    cnt = tl.zeros([BLOCK_N], dtype=tl.int64)
    for n0 in range(0, N, BLOCK_N):
        rows = n0 + tl.arange(0, BLOCK_N).to(tl.int64)
        rmask = rows < N
        has = (tl.load(has_ptr + rows, mask=rmask, other=0) != 0) & rmask
        m = has[:, None] & cmask[None, :]
        x = tl.load(slots_ptr + rows[:, None] * M + cols[None, :], mask=m, other=0.0)
        acc += tl.where(m, x, 0.0)
        cnt += has.to(tl.int64)
    total = tl.sum(acc, axis=0)
    n = tl.sum(cnt, axis=0)
    mean = total / tl.maximum(n, 1).to(tl.float32)
    tl.store(mean_ptr + cols, mean, mask=cmask)
    if pid == 0:
        tl.store(n_ptr, n)


def _block_m(M: int) -> int:
    return min(max(triton.next_power_of_2(max(M, 1)), 2), 64)


def _ema_update_triton(slots, has_data, episode, done, alpha, block_n: int | None = None):
    """Launcher (inputs validated; slots/has_data contiguous, updated in place)."""
    N, M = slots.shape
    episode, done = episode.contiguous(), done.contiguous()
    if N == 0 or M == 0:
        has_data.logical_or_(done)
        return slots, has_data
    if block_n is None:
        block_n = 1024 if _backend.interpreting() else 128
        block_n = min(block_n, max(16, triton.next_power_of_2(N)))
    grid = (triton.cdiv(N, block_n),)
    _ema_update_kernel[grid](slots, has_data.view(torch.uint8), episode, done.view(torch.uint8), N, M,
                             float(alpha), BLOCK_N=block_n, BLOCK_M=_block_m(M))
    return slots, has_data


def _ema_report_triton(slots, has_data, block_n: int | None = None, out=None):
    """Launcher (inputs validated). ``out`` (tests): preallocated (mean [M] f32, n [1] int64)."""
    N, M = slots.shape
    slots, has_data = slots.contiguous(), has_data.contiguous()
    if out is None:
        mean = torch.empty(M, dtype=torch.float32, device=slots.device)
        n = torch.empty(1, dtype=torch.int64, device=slots.device)
    else:
        mean, n = out
    if M == 0 or N == 0:
        mean.zero_()
        n.zero_()
        return mean, n.view(())
    if block_n is None:
        block_n = 256 if _backend.interpreting() else 1024
        block_n = min(block_n, max(16, triton.next_power_of_2(N)))
    block_m = _block_m(M)
    grid = (triton.cdiv(M, block_m),)
    _ema_report_kernel[grid](slots, has_data.view(torch.uint8), mean, n, N, M, BLOCK_N=block_n, BLOCK_M=block_m)
    return mean, n.view(())


# ------------------------------------------------------------------------------------------------
# Public entries


def ema_update(
    slots: torch.Tensor, has_data: torch.Tensor, episode: torch.Tensor, done: torch.Tensor, alpha: float, *,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold the metrics of just-finished episodes into the per-agent EMA slots, in place.

    Args:
        slots: [N, M] float32 EMA of each slot's episode metrics (contiguous; updated in place).
        has_data: [N] bool, True once the slot has completed an episode (contiguous; in place).
        episode: [N, M] float32 metrics of the episode that finished at this step (rows without
            ``done`` are ignored, whatever they hold, NaN included).
        done: [N] bool, True where a slot's episode finished at this step.
        alpha: smoothing factor in [0, 1) (``EnvConfig.log_ema_alpha``, default 0.707); 0 keeps
            only the last episode.
        backend: :func:`gpusim.backend.op_backend` (default from ``slots``: ``"cupy"`` on CUDA
            tensors when CuPy is usable, else ``"triton"``; ``"torch"`` on the CPU): ``"cupy"`` runs
            the CUDA C kernel (``gpusim/kernels/cuda/ema.cu``), ``"triton"`` the Triton kernel
            (CUDA tensors, or the interpreter), ``"torch"`` / ``"c"`` :func:`ema_update_reference`.

    Returns:
        ``(slots, has_data)``: the same tensor objects, updated. For ``done`` rows: first
        completion -> ``slot = episode``; later -> ``alpha * slot + (1 - alpha) * episode``;
        ``has_data |= done``. Other rows are unchanged.

    Raises:
        TypeError: non-tensor or wrong dtype. ValueError: wrong shapes, mixed devices,
        non-contiguous ``slots``/``has_data``, alpha outside [0, 1); a backend the tensors cannot
        run (:func:`gpusim.backend.op_backend`). RuntimeError: ``"cupy"`` without a usable CuPy.
    """
    _check_update(slots, has_data, episode, done, alpha)
    name = _backend.op_backend(backend, slots, _backend.WITH_CUPY)
    if name == "cupy":
        from gpusim.kernels import cuda as _cuda

        return _cuda.ema_update_cupy(slots, has_data, episode, done, alpha)
    if name == "triton":
        return _ema_update_triton(slots, has_data, episode, done, alpha)
    return ema_update_reference(slots, has_data, episode, done, alpha)


def ema_report(slots: torch.Tensor, has_data: torch.Tensor, *, backend: str | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Population mean of the EMA slots that have data.

    Args:
        slots: [N, M] float32 EMA slots (rows without data are ignored, whatever they hold).
        has_data: [N] bool.

    Returns:
        ``(mean [M] float32, n [] int64)``: mean over rows with ``has_data`` and their number;
        zeros and ``n = 0`` when no row has data. Nothing is reset. No host sync.

    Raises:
        TypeError: non-tensor or wrong dtype. ValueError: wrong shapes or mixed devices.

    ``backend`` and its errors as :func:`ema_update`. Backends sum in different orders (float32
    rounding differs).
    """
    _check_report(slots, has_data)
    name = _backend.op_backend(backend, slots, _backend.WITH_CUPY)
    if name == "cupy":
        from gpusim.kernels import cuda as _cuda

        return _cuda.ema_report_cupy(slots, has_data)
    if name == "triton":
        return _ema_report_triton(slots, has_data)
    return ema_report_reference(slots, has_data)


class EmaLog:
    """Device-resident per-agent EMA log of episode metrics (docs/design.md section 13).

    Args:
        num_slots: N, number of agent slots (e.g. worlds x controlled slots).
        names: the M metric names, in the column order of ``episode_metrics``.
        alpha: smoothing in [0, 1) (``EnvConfig.log_ema_alpha``).
        device: where the slots live.

    Attributes:
        slots: [N, M] float32; has_data: [N] bool; names: tuple of str; alpha: float.

    Raises:
        ValueError: empty or duplicate names, a metric named ``"n"`` (reserved), N < 0, bad alpha.

    Example::

        log = EmaLog(W * C, ["episode_return", "goal_reached"], alpha=cfg.log_ema_alpha, device=dev)
        log.update(metrics.view(W * C, 2), terminal.view(W * C))   # every step, no host sync
        log.report()   # {"episode_return": .., "goal_reached": .., "n": 37.0} or {} before any completion
    """

    def __init__(self, num_slots: int, names, alpha: float = 0.707, device: str | torch.device = "cpu"):
        names = tuple(str(n) for n in names)
        if not names:
            raise ValueError("EmaLog: need at least one metric name")
        if len(set(names)) != len(names):
            raise ValueError(f"EmaLog: duplicate metric names in {names}")
        if "n" in names:
            raise ValueError("EmaLog: the metric name 'n' is reserved for the number of slots with data")
        if num_slots < 0:
            raise ValueError(f"EmaLog: num_slots must be >= 0, got {num_slots}")
        if not 0.0 <= float(alpha) < 1.0:
            raise ValueError(f"EmaLog: alpha must be in [0, 1), got {alpha}")
        self.names = names
        self.alpha = float(alpha)
        self.slots = torch.zeros(num_slots, len(names), dtype=torch.float32, device=device)
        self.has_data = torch.zeros(num_slots, dtype=torch.bool, device=device)

    def update(self, episode_metrics: torch.Tensor, done: torch.Tensor, *, backend: str | None = None) -> None:
        """Fold finished episodes in (device only, no host sync).

        Args:
            episode_metrics: [N, M] metrics of episodes finishing now (any float dtype; cast to float32).
            done: [N] bool (other dtypes are compared with 0).
            backend: as :func:`ema_update`.

        Raises:
            ValueError / TypeError: as :func:`ema_update` for wrong shapes or devices.
        """
        if episode_metrics.dtype != torch.float32:
            episode_metrics = episode_metrics.to(torch.float32)
        if done.dtype != torch.bool:
            done = done != 0
        ema_update(self.slots, self.has_data, episode_metrics, done, self.alpha, backend=backend)

    def report(self) -> dict[str, float]:
        """``{name: population mean, ..., "n": slots with data}``, or ``{}`` while no slot has data.

        Reads the device once (one transfer of M + 1 numbers). Never resets the slots.
        """
        mean, n = ema_report(self.slots, self.has_data)
        host = torch.cat([mean.to(torch.float64), n.to(torch.float64).view(1)]).tolist()
        if host[-1] == 0:
            return {}
        out = dict(zip(self.names, host[:-1]))
        out["n"] = host[-1]
        return out
