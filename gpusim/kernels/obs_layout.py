"""The observation layout: feature names, normalisation constants and :class:`ObsLayout`.

Shared by the observation kernel (:mod:`gpusim.kernels.observations`, which documents each block's
semantics) and by everything that reads observation vectors (policy dimensions, the renderer's ego
view). Pure Python: no tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpusim.enums import NUM_OBJECT_TYPES, NUM_ROAD_OBS_TYPES  # noqa: F401  (re-exported for the kernels)

#: Speeds (ego and partners) are divided by this (m/s): 20 m/s = 72 km/h, a fast urban speed.
SPEED_SCALE = 20.0
#: Agent lengths and widths are divided by this (m): a car is about (0.9, 0.4).
SIZE_SCALE = 5.0
#: Goal coordinates and goal distance are divided by this (m).
GOAL_SCALE = 100.0

#: Per-slot features computed by the env and copied into the ego block (already normalised).
EGO_EXTRA = ("collided", "offroad", "trial_index", "time_in_trial", "last_reward")

#: Ego block feature names; "/x" gives the divisor.
EGO_FEATURES = (
    "speed/20",
    "length/5",
    "width/5",
    "goal_x/100",
    "goal_y/100",
    "goal_dist/100",
) + EGO_EXTRA

#: Partner slot feature names; the last one is the valid flag.
PARTNER_FEATURES = (
    "rel_x/partner_radius",
    "rel_y/partner_radius",
    "rel_heading_cos",
    "rel_heading_sin",
    "speed/20",
    "length/5",
    "width/5",
    "is_vehicle",
    "is_pedestrian",
    "is_cyclist",
    "valid",
)

#: Road slot feature names; the last one is the valid flag.
ROAD_FEATURES = (
    "mid_x/road_radius",
    "mid_y/road_radius",
    "length/road_radius",
    "dir_cos",
    "dir_sin",
    "is_lane",
    "is_road_line",
    "is_road_edge",
    "is_other",
    "valid",
)

@dataclass(frozen=True)
class ObsLayout:
    """Layout of the flat observation vector ``[ego | partners | roads]``.

    Attributes:
        ego_dim: features of the ego block (``len(ego_features)``).
        num_partners: P partner slots.
        partner_dim: features per partner slot (last = valid flag).
        num_roads: K road slots.
        road_dim: features per road slot (last = valid flag).
        obs_dim: D = ego_dim + P * partner_dim + K * road_dim.
        ego, partners, roads: slices of the flat vector; ``obs[..., layout.partners]`` reshaped to
            ``[..., P, partner_dim]`` gives the partner slots (likewise roads).
        ego_features, partner_features, road_features: feature names, with their divisor after
            a ``/`` (see the module docstring).
    """

    ego_dim: int
    num_partners: int
    partner_dim: int
    num_roads: int
    road_dim: int
    obs_dim: int
    ego: slice
    partners: slice
    roads: slice
    ego_features: tuple = EGO_FEATURES
    partner_features: tuple = PARTNER_FEATURES
    road_features: tuple = ROAD_FEATURES


def obs_layout(num_partners: int, num_roads: int) -> ObsLayout:
    """The :class:`ObsLayout` for ``num_partners`` partner slots and ``num_roads`` road slots.

    Raises:
        ValueError: if either count is < 1.
    """
    if int(num_partners) < 1 or int(num_roads) < 1:
        raise ValueError(f"obs_layout: num_partners and num_roads must be >= 1, got {num_partners}, {num_roads}")
    P, K = int(num_partners), int(num_roads)
    e, p, r = len(EGO_FEATURES), len(PARTNER_FEATURES), len(ROAD_FEATURES)
    return ObsLayout(
        ego_dim=e,
        num_partners=P,
        partner_dim=p,
        num_roads=K,
        road_dim=r,
        obs_dim=e + P * p + K * r,
        ego=slice(0, e),
        partners=slice(e, e + P * p),
        roads=slice(e + P * p, e + P * p + K * r),
    )
