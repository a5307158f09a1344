"""Advantage estimation: GAE with optional V-trace-style importance clipping, cut by ``bootstrap_stop``.

Rows are independent ``[T]`` sequences (one rollout row = one agent slot's episode, docs/design.md
section 12); the recursion runs backward over time inside each row.

Plain GAE (Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
Estimation"), with ``s_t = bootstrap_stop[t]`` and ``V_T = last_value``::

    delta_t = r_t + gamma * V_{t+1} * (1 - s_t) - V_t
    A_t     = delta_t + gamma * lambda * (1 - s_t) * A_{t+1}        (A_T = 0)
    returns = A + V

With ``log_rho`` (log of the importance ratio pi/mu of the action taken at step t) the clipped form
of IMPALA's V-trace (Espeholt et al. 2018, eq. 1 and its recursive form, with the "lambda" trace
factor of their section 4.2 remark) as generalised by PufferLib's ``puff_advantage`` (PufferLib 3,
``compute_puff_advantage``)::

    rho_t   = min(rho_clip, exp(log_rho_t))
    c_t     = min(c_clip,  exp(log_rho_t))
    delta_t = rho_t * (r_t + gamma * V_{t+1} * (1 - s_t) - V_t)
    A_t     = delta_t + gamma * lambda * c_t * (1 - s_t) * A_{t+1}
    returns = A + V            (= the V-trace target v_t when lambda = 1)

Facts checked against those sources: PufferLib scales the whole TD error by ``rho_t`` and the trace
by ``lambda * c_t``, and uses ``A_t = v_t - V_t`` as the advantage; with ``log_rho = 0`` and clips
``>= 1`` this is exactly plain GAE, with ``lambda = 1`` it is V-trace. Unlike PufferLib (which stores
the reward and done of a transition at column ``t + 1``), here ``rewards[t]`` and
``bootstrap_stop[t]`` belong to the action taken at column ``t`` (docs/contracts.md, "Time alignment
of a step"), and the last column bootstraps from ``last_value`` unless its stop flag is set.

Backends: the torch reference (CPU), a Triton kernel (one program per block of rows, backward loop
over T) and a CUDA C kernel launched through CuPy (one thread per row; the math is
``gpusim_advantage_row`` in ``cuda/advantage.cuh``). Dispatch: CUDA tensors with CuPy usable → CuPy;
other CUDA tensors (or ``GPUSIM_BACKEND=triton``) → Triton; CPU tensors → torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpusim import backend as _backend


def _check_inputs(rewards, values, bootstrap_stop, last_value, gamma, gae_lambda, log_rho, rho_clip, c_clip):
    """Validate shapes, dtypes and devices (metadata only: no device sync)."""
    for name, x in (("rewards", rewards), ("values", values), ("bootstrap_stop", bootstrap_stop),
                    ("last_value", last_value)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"advantage: {name} must be a torch.Tensor, got {type(x).__name__}")
    if rewards.dim() != 2:
        raise ValueError(f"advantage: rewards must be [B, T], got shape {tuple(rewards.shape)}")
    shape = rewards.shape
    B = shape[0]
    tensors = [("rewards", rewards, torch.float32, shape), ("values", values, torch.float32, shape),
               ("bootstrap_stop", bootstrap_stop, torch.bool, shape),
               ("last_value", last_value, torch.float32, (B,))]
    if log_rho is not None:
        if not isinstance(log_rho, torch.Tensor):
            raise TypeError(f"advantage: log_rho must be a torch.Tensor or None, got {type(log_rho).__name__}")
        tensors.append(("log_rho", log_rho, torch.float32, shape))
    for name, x, dtype, want in tensors:
        if tuple(x.shape) != tuple(want):
            raise ValueError(f"advantage: {name} must have shape {tuple(want)}, got {tuple(x.shape)}")
        if x.dtype != dtype:
            raise TypeError(f"advantage: {name} must be {dtype}, got {x.dtype}")
        if x.device != rewards.device:
            raise ValueError(f"advantage: {name} is on {x.device} but rewards is on {rewards.device}")
    for name, v in (("gamma", gamma), ("gae_lambda", gae_lambda)):
        if not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"advantage: {name} must be in [0, 1], got {v}")
    for name, v in (("rho_clip", rho_clip), ("c_clip", c_clip)):
        if not float(v) > 0.0:
            raise ValueError(f"advantage: {name} must be > 0, got {v}")


def advantage_reference(
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_stop: torch.Tensor,
    last_value: torch.Tensor,
    gamma: float,
    gae_lambda: float,
    log_rho: torch.Tensor | None = None,
    rho_clip: float = 1.0,
    c_clip: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and returns per row, optionally with V-trace importance clipping.

    See the module docstring for the recursion and its sources (GAE: Schulman et al. 2016; V-trace:
    Espeholt et al. 2018; the clipped-GAE form of PufferLib's ``puff_advantage``).

    Args:
        rewards: [B, T] float32 reward of the action taken at column t.
        values: [B, T] float32 value estimate V_t of the state at column t.
        bootstrap_stop: [B, T] bool; True = do not bootstrap from column t+1 (terminal, trial
            truncation, removed/limbo or next step invalid; docs/contracts.md). It cuts both the TD
            target and the trace.
        last_value: [B] float32 value of the state after the last column (used unless
            ``bootstrap_stop[:, -1]``).
        gamma: discount factor in [0, 1].
        gae_lambda: GAE lambda in [0, 1].
        log_rho: optional [B, T] float32 log importance ratio log(pi(a_t|x_t) / mu(a_t|x_t)).
            None = on-policy (plain GAE).
        rho_clip: rho-bar (> 0), clip of the ratio scaling the TD error (used only with log_rho).
        c_clip: c-bar (> 0), clip of the ratio scaling the trace (used only with log_rho).

    Returns:
        (advantages, returns): two new [B, T] float32 tensors on the input device;
        ``returns = advantages + values``.

    Raises:
        TypeError: a non-tensor argument or wrong dtype.
        ValueError: wrong shapes, mixed devices, gamma/lambda outside [0, 1], clips <= 0.

    The torch reference precomputes every TD error and trace coefficient vectorised, then runs the
    exact backward recursion as a Python loop over T of one fused [B] multiply-add each (T <= a few
    hundred; about 2 us per step of the loop plus the vectorised part). It is exact in float32 (no
    log-space or cumulative-product reformulation). No host sync.

    Non-finite inputs: a stop at column t drops V_{t+1} (and ``last_value``) with a select, so a
    NaN bootstrap value behind a stop is harmless; non-finite rewards/values inside a row are not
    masked (they propagate like any arithmetic).
    """
    _check_inputs(rewards, values, bootstrap_stop, last_value, gamma, gae_lambda, log_rho, rho_clip, c_clip)
    B, T = rewards.shape
    next_values = torch.cat([values[:, 1:], last_value[:, None]], dim=1)
    # torch.where (not a multiply by 0/1) so a non-finite value behind a stop cannot leak in.
    bootstrap = torch.where(bootstrap_stop, 0.0, gamma * next_values)
    delta = (rewards + bootstrap) - values
    trace = (~bootstrap_stop).to(torch.float32) * (gamma * gae_lambda)
    if log_rho is not None:
        ratio = torch.exp(log_rho)
        delta = torch.clamp(ratio, max=rho_clip) * delta
        trace = trace * torch.clamp(ratio, max=c_clip)
    # Time-major, contiguous rows for the loop; A_t = delta_t + trace_t * A_{t+1}.
    delta_tm = delta.t().contiguous()
    trace_tm = trace.t().contiguous()
    adv_tm = torch.empty_like(delta_tm)
    if T > 0:
        adv_tm[T - 1] = delta_tm[T - 1]
        for t in range(T - 2, -1, -1):
            torch.addcmul(delta_tm[t], trace_tm[t], adv_tm[t + 1], out=adv_tm[t])
    advantages = adv_tm.t().contiguous()
    return advantages, advantages + values


@triton.jit
def _advantage_kernel(
    rewards_ptr, values_ptr, stop_ptr, last_value_ptr, log_rho_ptr, adv_ptr, ret_ptr,
    B, T, gamma, gae_lambda, rho_clip, c_clip,
    HAS_RHO: tl.constexpr, BLOCK_B: tl.constexpr,
):
    """One program per BLOCK_B rows; backward loop over the T columns."""
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B).to(tl.int64)
    rmask = rows < B
    base = rows * T
    next_v = tl.load(last_value_ptr + rows, mask=rmask, other=0.0)
    acc = tl.zeros([BLOCK_B], dtype=tl.float32)
    for i in range(0, T):
        t = T - 1 - i
        off = base + t
        r = tl.load(rewards_ptr + off, mask=rmask, other=0.0)
        v = tl.load(values_ptr + off, mask=rmask, other=0.0)
        s = tl.load(stop_ptr + off, mask=rmask, other=1)
        stop = s != 0
        delta = (r + tl.where(stop, 0.0, gamma * next_v)) - v
        trace = tl.where(stop, 0.0, gamma * gae_lambda)
        if HAS_RHO:
            ratio = tl.exp(tl.load(log_rho_ptr + off, mask=rmask, other=0.0))
            delta = tl.minimum(ratio, rho_clip) * delta
            trace = trace * tl.minimum(ratio, c_clip)
        acc = delta + trace * acc
        tl.store(adv_ptr + off, acc, mask=rmask)
        tl.store(ret_ptr + off, acc + v, mask=rmask)
        next_v = v


def _advantage_triton(rewards, values, bootstrap_stop, last_value, gamma, gae_lambda, log_rho, rho_clip, c_clip,
                      block_b: int | None = None, out: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Launcher: contiguity, outputs, grid. Inputs already validated.

    ``out`` (tests): preallocated contiguous (advantages, returns) [B, T] float32 tensors to write.
    """
    B, T = rewards.shape
    rewards, values, last_value = rewards.contiguous(), values.contiguous(), last_value.contiguous()
    stop = bootstrap_stop.contiguous().view(torch.uint8)
    rho = log_rho.contiguous() if log_rho is not None else rewards  # dummy pointer when unused
    if out is None:
        adv, ret = torch.empty_like(rewards), torch.empty_like(rewards)
    else:
        adv, ret = out
        for o in (adv, ret):
            if o.shape != rewards.shape or o.dtype != torch.float32 or not o.is_contiguous() \
                    or o.device != rewards.device:
                raise ValueError("advantage: out tensors must be contiguous [B, T] float32 on the input device")
    if B == 0 or T == 0:
        return adv, ret
    if block_b is None:
        # Interpreter: one program per 1024 rows (few program instances); GPU: 128 rows per program.
        block_b = 1024 if _backend.interpreting() else 128
        block_b = min(block_b, max(16, triton.next_power_of_2(B)))
    grid = (triton.cdiv(B, block_b),)
    _advantage_kernel[grid](
        rewards, values, stop, last_value, rho, adv, ret,
        B, T, float(gamma), float(gae_lambda), float(rho_clip), float(c_clip),
        HAS_RHO=log_rho is not None, BLOCK_B=block_b,
    )
    return adv, ret


def advantage(
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_stop: torch.Tensor,
    last_value: torch.Tensor,
    gamma: float,
    gae_lambda: float,
    log_rho: torch.Tensor | None = None,
    rho_clip: float = 1.0,
    c_clip: float = 1.0,
    *,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and returns per row, optionally with V-trace importance clipping.

    See the module docstring for the recursion and its sources (GAE: Schulman et al. 2016; V-trace:
    Espeholt et al. 2018; the clipped-GAE form of PufferLib's ``puff_advantage``).

    Args:
        rewards: [B, T] float32 reward of the action taken at column t.
        values: [B, T] float32 value estimate V_t of the state at column t.
        bootstrap_stop: [B, T] bool; True = do not bootstrap from column t+1 (terminal, trial
            truncation, removed/limbo or next step invalid; docs/contracts.md). It cuts both the TD
            target and the trace.
        last_value: [B] float32 value of the state after the last column (used unless
            ``bootstrap_stop[:, -1]``).
        gamma: discount factor in [0, 1].
        gae_lambda: GAE lambda in [0, 1].
        log_rho: optional [B, T] float32 log importance ratio log(pi(a_t|x_t) / mu(a_t|x_t)).
            None = on-policy (plain GAE).
        rho_clip: rho-bar (> 0), clip of the ratio scaling the TD error (used only with log_rho).
        c_clip: c-bar (> 0), clip of the ratio scaling the trace (used only with log_rho).
        backend: :func:`gpusim.backend.op_backend` (default from ``rewards``: ``"cupy"`` on CUDA
            tensors when CuPy is usable, else ``"triton"``; ``"torch"`` on the CPU): ``"cupy"`` runs
            the CUDA C kernel (``gpusim/kernels/cuda/advantage.cu``), ``"triton"`` the Triton kernel
            (CUDA tensors, or the interpreter), ``"torch"`` / ``"c"`` :func:`advantage_reference`.

    Returns:
        (advantages, returns): two new [B, T] float32 tensors on the input device;
        ``returns = advantages + values``.

    Raises:
        TypeError: a non-tensor argument or wrong dtype.
        ValueError: wrong shapes, mixed devices, gamma/lambda outside [0, 1], clips <= 0; a backend
            the tensors cannot run (:func:`gpusim.backend.op_backend`).
        RuntimeError: ``"cupy"`` without a usable CuPy.

    All backends agree to float32 rounding (fused multiply-adds may differ in the last bits).
    """
    _check_inputs(rewards, values, bootstrap_stop, last_value, gamma, gae_lambda, log_rho, rho_clip, c_clip)
    name = _backend.op_backend(backend, rewards, _backend.WITH_CUPY)
    if name == "cupy":
        from gpusim.kernels import cuda as _cuda

        return _cuda.advantage_cupy(rewards, values, bootstrap_stop, last_value, gamma, gae_lambda,
                                    log_rho, rho_clip, c_clip)
    if name == "triton":
        return _advantage_triton(rewards, values, bootstrap_stop, last_value, gamma, gae_lambda,
                                 log_rho, rho_clip, c_clip)
    return advantage_reference(rewards, values, bootstrap_stop, last_value, gamma, gae_lambda,
                               log_rho, rho_clip, c_clip)
