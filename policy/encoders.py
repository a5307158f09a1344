"""Observation encoder: one token per agent-step from the flat ego-centric observation.

The observation vector (docs/contracts.md, ``obs_layout``) is
``[ego (ego_dim) | partners (P x partner_dim, row-major) | roads (K x road_dim, row-major)]`` and the
last feature of every partner and road slot is its valid flag (1 valid, 0 padding). The encoder
(docs/design.md section 11) is

* ego MLP over the ego block and every other per-agent block of the layout (the style and
  candidate blocks when present: every block no set encoder reads, :func:`ego_mlp_blocks`),
* partner encoder: a linear layer + ReLU applied to each slot, a max-pool over the *valid* slots,
  then a second linear layer on the pooled vector,
* road encoder: the same over the road slots (the type one-hot is part of the slot features),
* signal encoder: the same over the traffic-signal slots, when the observation has them
  (``EnvConfig.num_signals`` > 0; docs/signals.md),
* concatenation of the three (or four), then a linear projection to the model width ``d_model`` and a
  LayerNorm (so the token has the scale of the sinusoidal position code added to it).

The slot encoders pool *between* their two layers (PointNet-style: per-slot features, symmetric
pool, then a layer on the pooled set; Qi et al. 2017, "PointNet"): the second layer then runs once
per token instead of once per slot. With 31 partner and 32 road slots this is what made the PPO
update 2-3x cheaper (CHANGELOG.md, 2026-11-22); the slot inputs have 10-11 features,
so the per-slot work is now a narrow 11 -> ``hidden`` layer. Checkpoints written before this
change (slot MLPs named ``partner``/``road``) are refused by ``load_state_dict`` (missing keys)
rather than silently computing another function.

A max-pool over zero valid slots gives zeros (never ``-inf``/NaN). ``max_roads`` optionally keeps
only the first (= nearest, the observation sorts them nearest-first) road slots, a cheap way to
save compute on CPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from gpusim.kernels.obs_layout import layout_from_sizes

#: The blocks read by a set encoder (:class:`SlotEncoder`, one per block: ``partner_set``,
#: ``road_set``, ``signal_set``). Every other block of the layout is a per-agent vector that the
#: ego MLP reads (:func:`ego_mlp_blocks`).
SET_BLOCKS = ("partners", "roads", "signals")


def ego_mlp_blocks(layout) -> tuple[str, ...]:
    """The blocks the ego MLP reads, concatenated in layout order: every block of ``layout`` (an
    :class:`~gpusim.kernels.obs_layout.ObsLayout`, the one table
    ``gpusim.kernels.obs_layout.BLOCKS``) not read by a set encoder (:data:`SET_BLOCKS`). For
    today's table: ``("ego", "style", "candidates")``; a new block of the table is read here with
    no edit of this module."""
    return tuple(n for n, _ in layout.blocks if n not in SET_BLOCKS)


@dataclass(frozen=True)
class ObsDims:
    """The integers of the observation layout the policy needs.

    Attributes:
        ego_dim: ego features. num_partners, partner_dim: partner slots and features per slot.
        num_roads, road_dim: road-segment slots and features per slot. num_signals, signal_dim:
        traffic-signal slots (0: no signal block) and features per slot. The last feature of every
        partner, road and signal slot is its valid flag. style_dim: the driving-style block (the
        agent's own normalised reward weights, the last columns; 0 without reward conditioning),
        read by the ego MLP together with the ego block (docs/styles.md). candidate_dim: the
        memory task's candidate block (after the style block, the very last columns; 0 when off;
        docs/trial.md), also read by the ego MLP. extra: ``((key, value), ...)``, sorted, the
        other sizes the block table read to build the layout (a block whose size is an
        ``EnvConfig`` setting read by name, ``gpusim.kernels.obs_layout.BLOCKS``); ``()`` for
        today's blocks.
    """

    ego_dim: int
    num_partners: int
    partner_dim: int
    num_roads: int
    road_dim: int
    num_signals: int = 0
    signal_dim: int = 0
    style_dim: int = 0
    candidate_dim: int = 0
    extra: tuple = ()

    def __post_init__(self):
        # a description read back from a file may hold lists: the same pairs, as a sorted tuple
        object.__setattr__(self, "extra", tuple(sorted((str(k), int(v)) for k, v in self.extra)))

    def describe(self) -> dict:
        """The sizes as plain data (a checkpoint's ``"dims"``); ``extra`` only when not empty, so a
        policy of today's blocks is described as before."""
        desc = dataclasses.asdict(self)
        if not desc["extra"]:
            del desc["extra"]
        return desc

    def layout(self, num_roads: int | None = None):
        """The :class:`~gpusim.kernels.obs_layout.ObsLayout` of these sizes (the one block table,
        ``gpusim.kernels.obs_layout.BLOCKS``); ``num_roads``: with only that many road slots (the
        encoder's compact input)."""
        sizes = {**dataclasses.asdict(self), **dict(self.extra)}
        del sizes["extra"]
        if num_roads is not None:
            sizes["num_roads"] = int(num_roads)
        return layout_from_sizes(**sizes)

    @property
    def tail_dim(self) -> int:
        """Columns of the blocks the ego MLP reads with the ego block (:func:`ego_mlp_blocks` after
        ``ego``; today ``style_dim + candidate_dim``)."""
        lay = self.layout()
        return sum(lay.block(n).stop - lay.block(n).start for n in ego_mlp_blocks(lay)) - self.ego_dim

    @property
    def obs_dim(self) -> int:
        """D, the width of :meth:`layout` (the sum of its blocks)."""
        return self.layout().obs_dim

    @classmethod
    def from_layout(cls, layout) -> "ObsDims":
        """Read the integers from any object that has them (e.g. ``env.obs_layout``; a layout
        without ``num_signals`` has no signal block); ``extra``: the layout's other ``sizes``."""
        n_sig = int(getattr(layout, "num_signals", 0))
        named = {f.name for f in dataclasses.fields(cls)}
        return cls(
            int(layout.ego_dim), int(layout.num_partners), int(layout.partner_dim),
            int(layout.num_roads), int(layout.road_dim), n_sig, int(layout.signal_dim) if n_sig else 0,
            int(getattr(layout, "style_dim", 0)), int(getattr(layout, "candidate_dim", 0)),
            tuple((k, v) for k, v in getattr(layout, "sizes", ()) if k not in named),
        )


def _mlp(n_in: int, hidden: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_out))


def masked_max_pool(features: torch.Tensor, valid: torch.Tensor, nonnegative: bool = False) -> torch.Tensor:
    """Max over the slot axis of the valid slots; zeros where no slot is valid.

    Args:
        features: [..., S, F] float per-slot features.
        valid: [..., S] bool.
        nonnegative: the caller guarantees ``features >= 0`` (e.g. after a ReLU): invalid slots
            are then replaced by 0 instead of the most negative float, which gives the same result
            (the max over valid slots, or 0 when none is valid) in one pass instead of two.

    Returns:
        [..., F]; gradients reach only the selected (valid) entries.
    """
    if nonnegative:
        return torch.where(valid[..., None], features, 0.0).amax(dim=-2)
    neg = torch.finfo(features.dtype).min
    pooled = torch.where(valid[..., None], features, neg).amax(dim=-2)
    return torch.where(valid.any(dim=-1, keepdim=True), pooled, 0.0)


#: Below this many slot rows (tokens x slots) :func:`slot_max` uses the dense form (one GEMM over
#: every slot, a masked max): the compacted form's per-slot Python loop costs more than it saves on
#: the few hundred tokens of a rollout step (profiling/bench_train.py).
COMPACT_MIN_ROWS = 4096


def slot_max(x: torch.Tensor, valid: torch.Tensor, weight: torch.Tensor, with_index: bool = False):
    """``max over valid s of x[n, s] @ weight^T`` per token, computed on the valid slots only.

    Args:
        x: [N, S, I] float32 slots (invalid slots may hold anything, NaN included).
        valid: [N, S] bool.
        weight: [H, I] float32.
        with_index: also return the arg-max slot of every entry.

    Returns:
        ``(best, idx)``: best [N, H] float32, ``-inf`` for a token without a valid slot; idx [N, H]
        int64 slot index of the maximum (the first one on a tie; 0 for a token without a valid
        slot) or ``None`` without ``with_index``.

    How: tokens are sorted by their *extent* (1 + the last valid slot) and the slots laid out
    slot-major, so that for every slot ``s`` the tokens that reach it are a prefix of the sorted
    order; only those rows go through the GEMM (one GEMM over the concatenated blocks), and the max
    is a running ``torch.maximum`` over per-slot prefixes of contiguous [k_s, H] rows. The
    observation pads partners and roads at the end (valid slots first), so the work drops to the
    valid slots: 28% of the partner, 53% of the road and 0% of the signal slots of a default
    training batch on the bundled sample (docs/performance.md, "Training on the CPU"). Invalid slots
    inside an extent are set to ``-inf`` after the GEMM, so the result never depends on them.
    Small inputs (fewer than :data:`COMPACT_MIN_ROWS` slot rows) and non-CPU tensors take the dense
    path: the compaction reads the slot counts to the host, which would stall a GPU stream and
    cannot be captured in a CUDA graph.
    """
    N, S, I = x.shape
    H = weight.shape[0]
    if N * S < COMPACT_MIN_ROWS or x.device.type != "cpu" or torch.compiler.is_compiling():
        pre = torch.mm(x.reshape(N * S, I), weight.t()).view(N, S, H)
        pre.masked_fill_(~valid[..., None], float("-inf"))
        if with_index:
            best, idx = pre.max(dim=1)
            return best, idx
        return pre.amax(dim=1), None
    slot_no = torch.arange(1, S + 1, device=x.device)
    extent = torch.where(valid, slot_no, 0).amax(dim=1)  # [N] 1 + last valid slot (0: none)
    order = torch.argsort(extent, descending=True)
    reach = (extent[None, :] >= slot_no[:, None]).sum(dim=1)  # [S] tokens reaching slot s (a prefix)
    holes = (valid.sum(dim=1) != extent).any()  # an invalid slot inside some extent
    *ks, holes = torch.cat([reach, holes[None].to(reach.dtype)]).tolist()  # the one host read
    ks = [k for k in ks if k > 0]
    best = torch.full((N, H), float("-inf"), dtype=x.dtype, device=x.device)
    idx = torch.zeros((N, H), dtype=torch.int64, device=x.device) if with_index else None
    if ks:
        xs = x.index_select(0, order[: ks[0]])[:, : len(ks)].transpose(0, 1)  # [S', k_0, I] view
        pre = torch.mm(torch.cat([xs[s, :k] for s, k in enumerate(ks)]), weight.t())  # [M, H]
        if holes:
            vs = valid.index_select(0, order[: ks[0]])[:, : len(ks)].t()
            pre.masked_fill_(~torch.cat([vs[s, :k] for s, k in enumerate(ks)])[:, None], float("-inf"))
        run = pre[: ks[0]].clone()  # running max over the sorted tokens
        run_idx = torch.zeros((ks[0], H), dtype=torch.int64, device=x.device) if with_index else None
        off = ks[0]
        for s, k in enumerate(ks[1:], start=1):
            blk, cur = pre[off: off + k], run[:k]
            off += k
            if with_index:
                run_idx[:k].masked_fill_(blk > cur, s)
            torch.maximum(cur, blk, out=cur)
        rows = order[: ks[0]]
        best.index_copy_(0, rows, run.to(best.dtype))  # bfloat16 under autocast (the PPO update's option)
        if with_index:
            idx.index_copy_(0, rows, run_idx)
    return best, idx


class _SlotMaxPool(torch.autograd.Function):
    """``max over valid slots of relu(x @ W^T + b)`` with a sparse backward.

    Forward: [N, S, I] slots -> [N, H] (invalid slots count as 0, which is also the result when
    no slot is valid). Backward: the gradient of a pooled entry ``(n, f)`` reaches only its arg-max
    slot, and only when the pooled value is > 0 (a valid slot with a positive pre-activation; ReLU's
    gradient at 0 is 0, as in torch). So the weight gradient is a sum over tokens of
    ``g[n, f] * x[n, argmax[n, f], :]`` — a gather of [N, H, I] instead of the dense [N, S, H]
    tensors (and the slow tall-skinny ``[H, N*S] @ [N*S, I]`` product) autograd would build. It is
    the same function and the same (sub)gradient as :meth:`SlotEncoder.reference` with
    ``torch.max`` (which also sends a tied maximum's gradient to one slot).
    """

    @staticmethod
    def forward(ctx, x, valid, weight, bias):
        best, idx = slot_max(x, valid, weight, with_index=True)
        pooled = (best + bias).clamp_min_(0.0)
        ctx.save_for_backward(x, weight, pooled, idx)
        return pooled

    @staticmethod
    def backward(ctx, grad):
        x, weight, pooled, idx = ctx.saved_tensors
        N, S, I = x.shape
        H = weight.shape[0]
        g = torch.where(pooled > 0, grad, 0.0)  # [N, H]
        # row n * S + argmax[n, f] of the flattened [N * S, I] slots, head-major ([H, N]) so that the
        # weight gradient is a batch of contiguous products (index_select of whole rows is much
        # cheaper than a gather with an expanded [N, H, I] index); a token without a valid slot
        # (pooled 0, g 0, its arg-max slot may hold NaN/inf, and 0 * NaN would leak) reads an
        # appended zero row instead
        rows = idx.t() + torch.arange(N, device=x.device) * S  # [H, N]
        rows = torch.where(pooled.t() > 0, rows, N * S)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[2]:
            table = torch.cat([x.reshape(N * S, I), x.new_zeros(1, I)])
            picked = table.index_select(0, rows.reshape(-1)).view(H, N, I)  # x[n, argmax[n, f], :]
            grad_w = torch.bmm(g.t()[:, None, :], picked)[:, 0, :]  # [H, I]
        if ctx.needs_input_grad[3]:
            grad_b = g.sum(0)
        if ctx.needs_input_grad[0]:
            grad_x = torch.zeros(N * S + 1, I, dtype=x.dtype, device=x.device).index_add_(
                0, rows.reshape(-1), (g.t()[..., None] * weight[:, None, :]).reshape(H * N, I))[:-1].view(N, S, I)
        return grad_x, None, grad_w, grad_b


class SlotEncoder(nn.Module):
    """Set encoder for a group of slots: ``Linear(slot_dim, hidden)`` + ReLU per slot, max-pool over
    the valid slots, then ``Linear(hidden, hidden)`` on the pooled vector.

    Args:
        slot_dim: features per slot (the last is the valid flag). hidden: width.
    """

    def __init__(self, slot_dim: int, hidden: int):
        super().__init__()
        self.slot = nn.Linear(slot_dim, hidden)
        self.post = nn.Linear(hidden, hidden)

    def forward(self, slots: torch.Tensor) -> torch.Tensor:
        """slots [..., S, slot_dim] float32 -> [..., hidden] float32 (fused, sparse-backward pool,
        :class:`_SlotMaxPool`; same values and gradients as :meth:`reference`)."""
        lead = slots.shape[:-2]
        flat = slots.reshape(-1, *slots.shape[-2:])
        valid = flat[..., -1] > 0.5
        if torch.is_grad_enabled() and (flat.requires_grad or self.slot.weight.requires_grad):
            pooled = _SlotMaxPool.apply(flat, valid, self.slot.weight, self.slot.bias)
        else:  # rollout / evaluation: no arg-max indices needed
            pooled = (slot_max(flat, valid, self.slot.weight)[0] + self.slot.bias).clamp_min_(0.0)
        return self.post(pooled.reshape(*lead, pooled.shape[-1]))

    def reference(self, slots: torch.Tensor) -> torch.Tensor:
        """Plain-autograd definition of :meth:`forward` (for tests): per-slot layer + ReLU, max
        over the valid slots (0 if none), second layer."""
        h = torch.relu(self.slot(slots))
        h = torch.where((slots[..., -1] > 0.5)[..., None], h, 0.0)
        return self.post(h.max(dim=-2).values)


class ObsEncoder(nn.Module):
    """Flat observation [..., D] -> token [..., d_model].

    Args:
        dims: :class:`ObsDims`.
        d_model: token width.
        hidden: width of the ego / partner / road MLPs.
        max_roads: use only the first ``max_roads`` road slots (nearest first); ``None`` = all.

    Raises:
        ValueError: for non-positive sizes or ``max_roads`` out of range.
    """

    def __init__(self, dims: ObsDims, d_model: int, hidden: int, max_roads: int | None = None):
        super().__init__()
        if d_model < 1 or hidden < 1:
            raise ValueError(f"ObsEncoder: d_model and hidden must be >= 1, got {d_model}, {hidden}")
        if max_roads is not None and not 1 <= max_roads <= dims.num_roads:
            raise ValueError(f"ObsEncoder: max_roads must be in [1, {dims.num_roads}], got {max_roads}")
        self.dims = dims
        self.num_roads_used = dims.num_roads if max_roads is None else int(max_roads)
        # the observation's blocks by their slices: the full layout and the compact one (road
        # slots beyond max_roads dropped, :meth:`compact`)
        self.layouts = {False: dims.layout(), True: dims.layout(num_roads=self.num_roads_used)}
        # the ego MLP reads every block no set encoder reads, in layout order (ego, style, candidates)
        self.ego_blocks = ego_mlp_blocks(self.layouts[False])
        self.ego = _mlp(dims.ego_dim + dims.tail_dim, hidden, hidden)
        self.partner_set = SlotEncoder(dims.partner_dim, hidden)
        self.road_set = SlotEncoder(dims.road_dim, hidden)
        # traffic signals (docs/signals.md): the same set encoder over the signal slots, only when
        # the observation has a signal block (so policies without one keep their parameters)
        self.signal_set = SlotEncoder(dims.signal_dim, hidden) if dims.num_signals > 0 else None
        n_sets = 4 if self.signal_set is not None else 3
        # LayerNorm on the token: keeps it on the scale of the sinusoidal position code (entries in
        # [-1, 1]) that the transformer adds, so the observation is not drowned by the position
        self.out = nn.Sequential(nn.ReLU(), nn.Linear(n_sets * hidden, d_model), nn.LayerNorm(d_model))

    def ego_columns(self) -> dict[str, slice]:
        """Where each block the ego MLP reads sits in its input (the columns of ``self.ego[0]``'s
        weight): ``{block name: slice}`` in layout order, empty blocks left out (e.g.
        ``{"ego": slice(0, 11), "candidates": slice(11, 18)}`` for the memory task)."""
        lay, cols, at = self.layouts[False], {}, 0
        for name in self.ego_blocks:
            width = lay.block(name).stop - lay.block(name).start
            if width > 0:
                cols[name] = slice(at, at + width)
                at += width
        return cols

    @property
    def compact_dim(self) -> int:
        """D' = width of :meth:`compact`'s output (the columns :meth:`forward` reads): D without
        the road slots beyond ``max_roads``."""
        return self.layouts[True].obs_dim

    def compact(self, obs: torch.Tensor) -> torch.Tensor:
        """The columns the encoder reads: [..., D] -> [..., D'] (:attr:`compact_dim`; a copy without
        the unused road slots, or ``obs`` itself when every slot is used).

        Raises:
            ValueError: if the last dimension is not D.
        """
        d = self.dims
        D = self.layouts[False].obs_dim
        if obs.shape[-1] != D:
            raise ValueError(f"ObsEncoder.compact: expected obs with last dim {D}, got {tuple(obs.shape)}")
        if self.compact_dim == D:
            return obs
        full, used = self.layouts[False].roads, self.layouts[True].roads
        return torch.cat([obs[..., :used.stop], obs[..., full.stop:]], dim=-1)

    def forward(self, obs: torch.Tensor, compact: bool = False) -> torch.Tensor:
        """Encode observations.

        Args:
            obs: [..., D] float32 with D = ``dims.obs_dim``, or, with ``compact=True``, [..., D']
                from :meth:`compact` (same tokens; what the PPO update feeds, so that the unused
                road columns are dropped once per update instead of copied in every minibatch).

        Returns:
            [..., d_model] float32 tokens.

        Raises:
            ValueError: if the last dimension is not D (D').
        """
        d = self.dims
        width = self.compact_dim if compact else self.layouts[False].obs_dim
        if obs.shape[-1] != width:
            raise ValueError(f"ObsEncoder: expected obs with last dim {width}{' (compact)' if compact else ''}, "
                             f"got {tuple(obs.shape)}")
        lead = obs.shape[:-1]
        lay = self.layouts[bool(compact) and self.compact_dim != self.layouts[False].obs_dim]
        blocks = [obs[..., lay.block(n)] for n in self.ego_blocks if lay.block(n).stop > lay.block(n).start]
        ego = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=-1)
        partners = obs[..., lay.partners].reshape(*lead, d.num_partners, d.partner_dim)
        # slice the used road slots before the reshape (which copies the non-contiguous slice)
        roads = obs[..., lay.roads.start: lay.roads.start + self.num_roads_used * d.road_dim].reshape(
            *lead, self.num_roads_used, d.road_dim)
        h_ego = self.ego(ego)
        h_p = self.partner_set(partners)
        h_r = self.road_set(roads)
        parts = [h_ego, h_p, h_r]
        if self.signal_set is not None:
            parts.append(self.signal_set(obs[..., lay.signals].reshape(*lead, d.num_signals, d.signal_dim)))
        return self.out(torch.cat(parts, dim=-1))
