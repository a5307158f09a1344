"""Observation encoder: one token per agent-step from the flat ego-centric observation.

The observation vector (docs/contracts.md, ``obs_layout``) is
``[ego (ego_dim) | partners (P x partner_dim, row-major) | roads (K x road_dim, row-major)]`` and the
last feature of every partner and road slot is its valid flag (1 valid, 0 padding). The encoder
(DESIGN.md section 6) is

* ego MLP,
* partner MLP applied to each slot, then a max-pool over the *valid* slots,
* road MLP applied to each slot (the type one-hot is part of the slot features), then a max-pool
  over the valid slots,
* concatenation of the three, then a linear projection to the model width ``d_model`` and a
  LayerNorm (so the token has the scale of the sinusoidal position code added to it).

A max-pool over zero valid slots gives zeros (never ``-inf``/NaN). ``max_roads`` optionally keeps
only the first (= nearest, the observation sorts them nearest-first) road slots, a cheap way to
save compute on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ObsDims:
    """The five integers of the observation layout the policy needs.

    Attributes:
        ego_dim: ego features. num_partners, partner_dim: partner slots and features per slot.
        num_roads, road_dim: road-segment slots and features per slot. The last feature of every
        partner and road slot is its valid flag.
    """

    ego_dim: int
    num_partners: int
    partner_dim: int
    num_roads: int
    road_dim: int

    @property
    def obs_dim(self) -> int:
        """D = ego_dim + num_partners * partner_dim + num_roads * road_dim."""
        return self.ego_dim + self.num_partners * self.partner_dim + self.num_roads * self.road_dim

    @classmethod
    def from_layout(cls, layout) -> "ObsDims":
        """Read the five integers from any object that has them (e.g. ``env.obs_layout``)."""
        return cls(
            int(layout.ego_dim), int(layout.num_partners), int(layout.partner_dim),
            int(layout.num_roads), int(layout.road_dim),
        )


def _mlp(n_in: int, hidden: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_out))


def masked_max_pool(features: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Max over the slot axis of the valid slots; zeros where no slot is valid.

    Args:
        features: [..., S, F] float per-slot features.
        valid: [..., S] bool.

    Returns:
        [..., F]; gradients reach only the selected (valid) entries.
    """
    neg = torch.finfo(features.dtype).min
    pooled = torch.where(valid[..., None], features, neg).amax(dim=-2)
    return torch.where(valid.any(dim=-1, keepdim=True), pooled, 0.0)


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
        self.ego = _mlp(dims.ego_dim, hidden, hidden)
        self.partner = _mlp(dims.partner_dim, hidden, hidden)
        self.road = _mlp(dims.road_dim, hidden, hidden)
        # LayerNorm on the token: keeps it on the scale of the sinusoidal position code (entries in
        # [-1, 1]) that the transformer adds, so the observation is not drowned by the position
        self.out = nn.Sequential(nn.ReLU(), nn.Linear(3 * hidden, d_model), nn.LayerNorm(d_model))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Encode observations.

        Args:
            obs: [..., D] float32 with D = ``dims.obs_dim``.

        Returns:
            [..., d_model] float32 tokens.

        Raises:
            ValueError: if the last dimension is not D.
        """
        d = self.dims
        if obs.shape[-1] != d.obs_dim:
            raise ValueError(f"ObsEncoder: expected obs with last dim {d.obs_dim}, got {tuple(obs.shape)}")
        lead = obs.shape[:-1]
        p0 = d.ego_dim
        r0 = p0 + d.num_partners * d.partner_dim
        ego = obs[..., :p0]
        partners = obs[..., p0:r0].reshape(*lead, d.num_partners, d.partner_dim)
        roads = obs[..., r0:].reshape(*lead, d.num_roads, d.road_dim)[..., : self.num_roads_used, :]
        h_ego = self.ego(ego)
        h_p = masked_max_pool(self.partner(partners), partners[..., -1] > 0.5)
        h_r = masked_max_pool(self.road(roads), roads[..., -1] > 0.5)
        return self.out(torch.cat([h_ego, h_p, h_r], dim=-1))
