"""Causal transformer over the steps of the current episode, with a KV cache for rollouts.

Pre-norm blocks (``x + attn(LN(x))``, ``x + MLP(LN(x))``) with multi-head self-attention and a
final LayerNorm. Positions are added to the input tokens as the sinusoidal encoding of
"Attention Is All You Need" (Vaswani et al., 2017): ``PE[p, 2i] = sin(p / 10000^(2i/d))``,
``PE[p, 2i+1] = cos(p / 10000^(2i/d))``, with ``p`` the index of the step *within its episode*.

Two entry points compute the same function (to float32 rounding):

* :meth:`CausalTransformer.forward` — whole rows ``[B, T, d]`` with a boolean attention mask
  ``[B, T, T]`` (from :func:`gpusim.kernels.episode_mask.episode_mask`) and positions ``[B, T]``.
* :meth:`CausalTransformer.step` — one new token per sequence with a :class:`KVCache` of
  ``capacity`` slots per layer. The cache keeps, per sequence, the position counter (= number of
  tokens written since the last reset) and a per-slot ``hidden`` flag: a hidden token (a removed,
  out-of-play step) is attended to only by its own query, exactly like the limbo bias of the
  training mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def sinusoidal_encoding(position: torch.Tensor, d_model: int) -> torch.Tensor:
    """Sinusoidal positional encoding.

    Args:
        position: [...] integer positions (>= 0).
        d_model: even encoding width.

    Returns:
        [..., d_model] float32.
    """
    half = d_model // 2
    freq = torch.exp(
        torch.arange(half, device=position.device, dtype=torch.float32) * (-math.log(10000.0) * 2.0 / d_model)
    )
    ang = position.to(torch.float32)[..., None] * freq
    return torch.stack([torch.sin(ang), torch.cos(ang)], dim=-1).flatten(-2)


@dataclass
class KVCache:
    """Rollout memory of a :class:`CausalTransformer` for N sequences.

    Attributes:
        k, v: [L, N, H, S, dh] float32 keys / values per layer (S = capacity slots; heads before
            slots, so the one-query attention of a rollout step reads them without a copy).
        hidden: [N, S] bool, slot holds a removed (limbo) token visible only to itself.
        position: [N] int64 tokens written since the sequence's last reset (its next slot).
    """

    k: torch.Tensor
    v: torch.Tensor
    hidden: torch.Tensor
    position: torch.Tensor

    @property
    def capacity(self) -> int:
        """S."""
        return self.k.shape[3]

    def reset(self, done: torch.Tensor | None = None) -> "KVCache":
        """Clear the memory of the sequences where ``done`` [N] bool is set (all if ``None``).

        Only the position counter and the hidden flags need clearing: slots at or beyond a
        sequence's position are never attended to. Works in place (no host sync); returns self.
        """
        if done is None:
            self.position.zero_()
            self.hidden.zero_()
        else:
            done = done.to(torch.bool)
            self.position.masked_fill_(done, 0)
            self.hidden.masked_fill_(done[:, None], False)
        return self


class Block(nn.Module):
    """Pre-norm transformer block (multi-head self-attention + ReLU MLP of width 4d)."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.ReLU(), nn.Linear(4 * d_model, d_model))

    def _qkv(self, x: torch.Tensor):
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        shape = (*x.shape[:-1], self.n_heads, x.shape[-1] // self.n_heads)
        return q.reshape(shape), k.reshape(shape), v.reshape(shape)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """x [B, T, d]; allowed [B, T, T] bool (query, key)."""
        q, k, v = self._qkv(x)  # [B, T, H, dh]
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=allowed[:, None]
        )  # [B, H, T, dh]
        x = x + self.proj(att.transpose(1, 2).flatten(-2))
        return x + self.mlp(self.ln2(x))

    def forward_packed(self, x: torch.Tensor, index: torch.Tensor, shape: tuple[int, int],
                       allowed: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` on the kept tokens only: x [M, d] are the tokens at the flat positions
        ``index`` [M] int64 of a [B, T] = ``shape`` grid (the others are removed steps, visible
        only to themselves in ``allowed`` [B, T, T]). The per-token layers run on the M tokens;
        only the attention sees the [B, T] grid (zero queries/keys/values at the missing
        positions, which no kept query may attend to). Returns [M, d], the same as :meth:`forward`
        at those positions."""
        B, T = shape
        d = x.shape[-1]
        kept = self.qkv(self.ln1(x))  # bfloat16 under autocast (the PPO update's option)
        qkv = torch.zeros(B * T, 3 * d, dtype=kept.dtype, device=x.device).index_copy(0, index, kept)
        q, k, v = (t.reshape(B, T, self.n_heads, d // self.n_heads).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])  # [B, H, T, dh]
        x = x + self.proj(att.transpose(1, 2).reshape(B * T, d).index_select(0, index))
        return x + self.mlp(self.ln2(x))

    def step(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, allowed: torch.Tensor,
             slot: torch.Tensor, length: int | None = None) -> torch.Tensor:
        """x [N, d]; k_cache, v_cache [N, H, S, dh] (written at ``slot`` [N]); allowed [N, S];
        ``length``: attend to the first ``length`` cache slots only (all when ``None``; every
        allowed slot must lie below it).

        The one-query attention is written out (scores, masked softmax, weighted sum) as batched
        matmuls on the cache layout: ``scaled_dot_product_attention`` with a 1-long query and a
        mask was the single most expensive op of a CPU rollout step (its CPU kernel copied the
        strided cache every call)."""
        q, k, v = self._qkv(x)  # [N, H, dh]
        n = torch.arange(x.shape[0], device=x.device)
        k_cache[n, :, slot] = k
        v_cache[n, :, slot] = v
        if length is not None:  # views of the first slots (the batched products take the strides)
            k_cache, v_cache, allowed = k_cache[:, :, :length], v_cache[:, :, :length], allowed[:, :length]
        # [N, H, 1, dh] @ [N, H, dh, S] (a transposed operand is free for the GEMM; k_cache @ q as a
        # batch of matrix-vector products measured 4x slower)
        scores = torch.matmul(q[:, :, None, :], k_cache.transpose(-1, -2))[:, :, 0, :] * (q.shape[-1] ** -0.5)
        scores = scores.masked_fill(~allowed[:, None, :], float("-inf"))
        att = torch.matmul(torch.softmax(scores, dim=-1)[:, :, None, :], v_cache)[:, :, 0, :]  # [N, H, dh]
        x = x + self.proj(att.flatten(-2))
        return x + self.mlp(self.ln2(x))


class CausalTransformer(nn.Module):
    """Stack of pre-norm blocks over tokens of width ``d_model`` with sinusoidal positions.

    Args:
        d_model: token width (even, divisible by ``n_heads``).
        n_layers: number of blocks (>= 1).
        n_heads: attention heads.

    Raises:
        ValueError: for inconsistent sizes.
    """

    def __init__(self, d_model: int = 128, n_layers: int = 2, n_heads: int = 4):
        super().__init__()
        if d_model % 2 or d_model % n_heads or n_layers < 1:
            raise ValueError(
                f"CausalTransformer: d_model ({d_model}) must be even and divisible by n_heads ({n_heads}); "
                f"n_layers ({n_layers}) >= 1"
            )
        self.d_model, self.n_layers, self.n_heads = d_model, n_layers, n_heads
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)

    def forward(self, tokens: torch.Tensor, allowed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """Whole rows.

        Args:
            tokens: [B, T, d] float32. allowed: [B, T, T] bool attention mask (query, key).
            position: [B, T] int64 position within the episode.

        Returns:
            [B, T, d] float32.
        """
        x = tokens + sinusoidal_encoding(position, self.d_model)
        for blk in self.blocks:
            x = blk(x, allowed)
        return self.ln_f(x)

    def forward_packed(self, tokens: torch.Tensor, index: torch.Tensor, allowed: torch.Tensor,
                       position: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` computed for some positions of the rows only.

        Args:
            tokens: [M, d] float32, the tokens at the flat positions ``index`` of the [B, T] grid.
            index: [M] int64 flat positions (``b * T + t``); every position left out must be
                hidden from every other query by ``allowed`` (a removed step).
            allowed: [B, T, T] bool attention mask. position: [B, T] int64.

        Returns:
            [M, d] float32: what :meth:`forward` gives at those positions (to float32 rounding).
        """
        x = tokens + sinusoidal_encoding(position.reshape(-1).index_select(0, index), self.d_model)
        for blk in self.blocks:
            x = blk.forward_packed(x, index, tuple(position.shape), allowed)
        return self.ln_f(x)

    def init_cache(self, num_sequences: int, capacity: int, device=None) -> KVCache:
        """An empty :class:`KVCache` for ``num_sequences`` sequences of up to ``capacity`` tokens."""
        dh = self.d_model // self.n_heads
        shape = (self.n_layers, num_sequences, self.n_heads, capacity, dh)
        return KVCache(
            k=torch.zeros(shape, device=device),
            v=torch.zeros(shape, device=device),
            hidden=torch.zeros((num_sequences, capacity), dtype=torch.bool, device=device),
            position=torch.zeros(num_sequences, dtype=torch.int64, device=device),
        )

    def step(self, tokens: torch.Tensor, cache: KVCache, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """One new token per sequence.

        Args:
            tokens: [N, d] float32.
            cache: :class:`KVCache` for N sequences (updated in place: the token is written at
                slot ``position`` — clamped to the last slot if the capacity is exceeded — and
                ``position`` is incremented).
            hidden: [N] bool, the token is a removed step (hidden from later queries); ``None`` =
                all visible.

        Returns:
            [N, d] float32.
        """
        N = tokens.shape[0]
        S = cache.capacity
        slot = cache.position.clamp(max=S - 1)
        n = torch.arange(N, device=tokens.device)
        cache.hidden[n, slot] = False if hidden is None else hidden.to(torch.bool)
        s = torch.arange(S, device=tokens.device)
        allowed = ((s[None, :] < slot[:, None]) & ~cache.hidden) | (s[None, :] == slot[:, None])
        x = tokens + sinusoidal_encoding(slot, self.d_model)
        # on the CPU, attend to the slots written so far only (a rollout at step t reads t + 1 of the
        # horizon's slots instead of all of them: about half the attention work over an episode);
        # the host read this needs would stall a GPU stream and break CUDA-graph capture, so the
        # GPU attends to every slot (the mask hides the unwritten ones either way)
        length = (int(slot.max()) + 1 if tokens.device.type == "cpu" and N > 0 and not torch.compiler.is_compiling()
                  else None)
        for i, blk in enumerate(self.blocks):
            x = blk.step(x, cache.k[i], cache.v[i], allowed, slot, length)
        cache.position.add_(1)
        return self.ln_f(x)
