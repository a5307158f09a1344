"""Attention mask and position-within-episode for training the memory policy on whole rollout rows.

A rollout row ``b`` is a sequence of ``T`` agent-steps of one policy slot. ``terminal[b, t]`` marks
the last step of an episode (the policy's memory is cleared after it), so episode ``k + 1`` of a
row starts at the step after its ``k``-th terminal. ``removed[b, t]`` marks a step taken while the
agent was out of play ("limbo", e.g. a goal-reached agent in trial mode): its token must not
influence any other step.

The mask (``True`` = query ``q`` may attend to key ``k``) is

    allowed[b, q, k] = (k <= q) and episode[b, k] == episode[b, q] and (not removed[b, k] or k == q)

where ``episode[b, t]`` is the number of terminals strictly before ``t``. Every query sees at
least itself, so no attention row is empty (no NaN from a softmax over nothing). The position of
step ``t`` is its index within its episode: ``t - start`` with ``start`` the first step of the
episode (a cumulative maximum over the episode starts). Removed steps keep their place in the
count, exactly as the step-by-step KV cache counts them.

Layout per docs/design.md section 3: torch reference, Triton kernel, launcher, public dispatcher.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpusim.backend import op_backend


def episode_mask_reference(terminal: torch.Tensor, removed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention mask and positions within the episode for whole rollout rows.

    Args:
        terminal: [B, T] bool, ``True`` at the last step of an episode.
        removed: [B, T] bool, ``True`` where the agent was out of play when the step's
            observation was taken (hidden as a key from every other query).

    Returns:
        ``(allowed, position)``: ``allowed`` [B, T, T] bool (``allowed[b, q, k]``: query ``q``
        may attend to key ``k``; causal within an episode, removed keys visible only to
        themselves) and ``position`` [B, T] int64 (index of the step within its episode, from 0).

    Raises:
        ValueError: if the shapes differ, are not 2-D, or the dtypes are not bool.
    """
    _check_inputs(terminal, removed)
    B, T = terminal.shape
    term = terminal.to(torch.int64)
    episode = torch.cumsum(term, dim=1) - term  # terminals strictly before t
    idx = torch.arange(T, device=terminal.device)
    starts = torch.zeros_like(term)
    if T > 1:
        # step t starts an episode when step t-1 was terminal (t = 0 always starts one)
        starts[:, 1:] = torch.where(terminal[:, :-1], idx[1:].expand(B, -1), 0)
    start = torch.cummax(starts, dim=1).values
    position = idx[None, :] - start
    causal = idx[None, :] <= idx[:, None]  # [q, k]
    eye = idx[None, :] == idx[:, None]
    same = episode[:, :, None] == episode[:, None, :]
    allowed = same & causal[None] & ((~removed)[:, None, :] | eye[None])
    return allowed, position


@triton.jit
def _episode_mask_kernel(
    term_ptr,  # [B, T] int8
    rem_ptr,  # [B, T] int8
    allowed_ptr,  # [B, T, T] int8 out
    pos_ptr,  # [B, T] int64 out
    T,
    BLOCK_Q: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """One program per (row b, block of BLOCK_Q queries); keys span the whole row (BLOCK_T >= T)."""
    b = tl.program_id(0).to(tl.int64)
    qb = tl.program_id(1).to(tl.int64)
    row = b * T
    k = tl.arange(0, BLOCK_T)
    kmask = k < T
    term_k = tl.load(term_ptr + row + k, mask=kmask, other=0).to(tl.int32)
    rem_k = tl.load(rem_ptr + row + k, mask=kmask, other=0).to(tl.int32)
    ep_k = tl.cumsum(term_k, axis=0) - term_k  # terminals strictly before each key

    q = qb * BLOCK_Q + tl.arange(0, BLOCK_Q)
    qmask = q < T
    # episode of each query = number of terminals at keys < q
    kk = k[None, :].to(tl.int64)
    qq = q[:, None]
    before = (kk < qq) & kmask[None, :]
    ep_q = tl.sum(tl.where(before, term_k[None, :], 0), axis=1)
    same = ep_k[None, :] == ep_q[:, None]
    causal = kk <= qq
    visible = same & causal & ((rem_k[None, :] == 0) | (kk == qq)) & kmask[None, :]
    # position = number of earlier steps of the same episode
    pos = tl.sum(tl.where(same & before, 1, 0), axis=1).to(tl.int64)
    tl.store(pos_ptr + row + q, pos, mask=qmask)
    out = allowed_ptr + b * T * T + qq * T + kk
    tl.store(out, visible.to(tl.int8), mask=qmask[:, None] & kmask[None, :])


def _check_inputs(terminal: torch.Tensor, removed: torch.Tensor) -> None:
    if terminal.dim() != 2 or removed.shape != terminal.shape:
        raise ValueError(
            f"episode_mask: terminal and removed must both be [B, T]; got {tuple(terminal.shape)} "
            f"and {tuple(removed.shape)}"
        )
    if terminal.dtype != torch.bool or removed.dtype != torch.bool:
        raise ValueError(f"episode_mask: terminal and removed must be bool, got {terminal.dtype}, {removed.dtype}")
    if terminal.device != removed.device:
        raise ValueError("episode_mask: terminal and removed are on different devices")


def _episode_mask_triton(terminal: torch.Tensor, removed: torch.Tensor, allowed_out: torch.Tensor | None = None,
                         position_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Launcher: checks inputs, allocates (or takes) outputs, one program per (row, query block).

    ``allowed_out`` [B, T, T] int8 and ``position_out`` [B, T] int64 (contiguous, same device) may
    be given to write into (tests pre-fill them to catch unwritten elements).
    """
    _check_inputs(terminal, removed)
    B, T = terminal.shape
    dev = terminal.device
    term = terminal.contiguous().to(torch.int8)
    rem = removed.contiguous().to(torch.int8)
    if allowed_out is None:
        allowed_out = torch.empty((B, T, T), dtype=torch.int8, device=dev)
    if position_out is None:
        position_out = torch.empty((B, T), dtype=torch.int64, device=dev)
    if (allowed_out.shape != (B, T, T) or allowed_out.dtype != torch.int8 or not allowed_out.is_contiguous()
            or allowed_out.device != dev):
        raise ValueError("episode_mask: allowed_out must be a contiguous [B, T, T] int8 tensor on the input device")
    if (position_out.shape != (B, T) or position_out.dtype != torch.int64 or not position_out.is_contiguous()
            or position_out.device != dev):
        raise ValueError("episode_mask: position_out must be a contiguous [B, T] int64 tensor on the input device")
    if B > 0 and T > 0:
        BLOCK_T = max(16, triton.next_power_of_2(T))
        BLOCK_Q = min(BLOCK_T, 64)
        grid = (B, triton.cdiv(T, BLOCK_Q))
        _episode_mask_kernel[grid](term, rem, allowed_out, position_out, T, BLOCK_Q=BLOCK_Q, BLOCK_T=BLOCK_T)
    return allowed_out.view(torch.bool), position_out


def episode_mask(terminal: torch.Tensor, removed: torch.Tensor, *, backend: str | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention mask and positions within the episode for whole rollout rows.

    Args:
        terminal: [B, T] bool, ``True`` at the last step of an episode.
        removed: [B, T] bool, ``True`` where the agent was out of play when the step's
            observation was taken (hidden as a key from every other query).
        backend: :func:`gpusim.backend.op_backend` (default from ``terminal``): the Triton kernel
            under ``"triton"`` / ``"cupy"``, else :func:`episode_mask_reference`.

    Returns:
        ``(allowed, position)``: ``allowed`` [B, T, T] bool (``allowed[b, q, k]``: query ``q``
        may attend to key ``k``; causal within an episode, removed keys visible only to
        themselves) and ``position`` [B, T] int64 (index of the step within its episode, from 0).

    Raises:
        ValueError: if the shapes differ, are not 2-D, or the dtypes are not bool.
    """
    if op_backend(backend, terminal) == "triton":
        return _episode_mask_triton(terminal, removed)
    return episode_mask_reference(terminal, removed)
