"""The observation layout: feature names, normalisation constants and :class:`ObsLayout`.

Shared by the observation kernel (:mod:`gpusim.kernels.observations`, which documents each block's
semantics) and by everything that reads observation vectors (policy dimensions, the renderer's ego
view). Pure Python: no tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpusim.enums import NUM_OBJECT_TYPES, NUM_ROAD_OBS_TYPES  # noqa: F401  (re-exported for the kernels)
from gpusim.enums import STYLE_TERMS

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

#: Traffic-signal slot feature names (``gpusim.kernels.signals``); the last one is the valid flag.
#: The state one-hot groups the nine ``SignalState`` codes: unknown; stop = red (stop, arrow_stop,
#: flashing_stop); caution = yellow (caution, arrow_caution, flashing_caution); go = green (go,
#: arrow_go); ``arrow`` marks the three arrow states and ``flashing`` the two flashing ones.
SIGNAL_FEATURES = (
    "stop_x/road_radius",
    "stop_y/road_radius",
    "dir_cos",
    "dir_sin",
    "is_unknown",
    "is_stop",
    "is_caution",
    "is_go",
    "is_arrow",
    "is_flashing",
    "valid",
)

#: Style block (reward conditioning): the agent's own style entries (``gpusim.styles.STYLE_TERMS``),
#: each normalised by its configured range, ``(v - low) / (high - low)``.
STYLE_FEATURES = tuple(f"{t}_norm" for t in STYLE_TERMS)


@dataclass(frozen=True)
class ObsLayout:
    """Layout of the flat observation vector ``[ego | partners | roads | signals | style]`` (the
    signal block is absent, ``num_signals = 0``, unless asked for; the style block, the agent's
    own normalised reward weights, is there only with ``EnvConfig.reward_conditioning``).

    Attributes:
        ego_dim: features of the ego block (``len(ego_features)``).
        num_partners: P partner slots.
        partner_dim: features per partner slot (last = valid flag).
        num_roads: K road slots.
        road_dim: features per road slot (last = valid flag).
        obs_dim: D = ego_dim + P * partner_dim + K * road_dim + N * signal_dim + style_dim.
        ego, partners, roads, signals: slices of the flat vector; ``obs[..., layout.partners]``
            reshaped to ``[..., P, partner_dim]`` gives the partner slots (likewise roads, signals).
        num_signals: N traffic-signal slots (0: no signal block). signal_dim: features per signal
            slot (last = valid flag).
        style_dim: entries of the style block (0 or ``gpusim.styles.NUM_STYLE_TERMS``), the last
            columns; ``style``: its slice. Each entry is ``(v - low) / (high - low)`` of the
            agent's own style (:data:`STYLE_FEATURES`; docs/styles.md).
        num_candidates: G candidate goals of the memory task (0: no candidate block);
            candidate_dim: width of the candidate block, ``3 G + 1`` (per candidate x, y in the ego
            frame and distance, / 100 m, then ``at_decoy``), the very last columns; ``candidates``:
            its slice; ``candidate_features``: its names (``gpusim/sim/candidates.py``).
        ego_features, partner_features, road_features, signal_features: feature names, with their
            divisor after a ``/`` (see the module docstring).
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
    num_signals: int = 0
    signal_dim: int = len(SIGNAL_FEATURES)
    signals: slice = field(default_factory=lambda: slice(0, 0))
    signal_features: tuple = SIGNAL_FEATURES
    style_dim: int = 0
    style: slice = field(default_factory=lambda: slice(0, 0))
    style_features: tuple = ()
    num_candidates: int = 0
    candidate_dim: int = 0
    candidates: slice = field(default_factory=lambda: slice(0, 0))
    candidate_features: tuple = ()


def obs_layout(num_partners: int, num_roads: int, num_signals: int = 0, styles: bool = False,
               candidates: int = 0) -> ObsLayout:
    """The :class:`ObsLayout` for ``num_partners`` partner slots, ``num_roads`` road slots and
    ``num_signals`` traffic-signal slots (0, the default: no signal block; the env passes
    ``EnvConfig.num_signals``). The blocks before the signal block do not depend on it. ``styles``
    (``EnvConfig.reward_conditioning``) appends the style block of :data:`STYLE_FEATURES`;
    ``candidates`` = G >= 2 (``EnvConfig.goal_candidates``) appends the candidate block after it.

    Raises:
        ValueError: if ``num_partners`` or ``num_roads`` is < 1 or ``num_signals`` < 0.
    """
    if int(num_partners) < 1 or int(num_roads) < 1:
        raise ValueError(f"obs_layout: num_partners and num_roads must be >= 1, got {num_partners}, {num_roads}")
    if int(num_signals) < 0:
        raise ValueError(f"obs_layout: num_signals must be >= 0, got {num_signals}")
    P, K, N = int(num_partners), int(num_roads), int(num_signals)
    e, p, r, g = len(EGO_FEATURES), len(PARTNER_FEATURES), len(ROAD_FEATURES), len(SIGNAL_FEATURES)
    end = e + P * p + K * r
    S = len(STYLE_FEATURES) if styles else 0
    G = int(candidates) if int(candidates) >= 2 else 0
    cand_names = tuple(f"cand{k}_{n}" for k in range(G) for n in ("x/100", "y/100", "dist/100"))
    cand_names += ("at_decoy",) if G else ()
    s1 = end + N * g + S
    return ObsLayout(
        ego_dim=e,
        num_partners=P,
        partner_dim=p,
        num_roads=K,
        road_dim=r,
        obs_dim=s1 + len(cand_names),
        ego=slice(0, e),
        partners=slice(e, e + P * p),
        roads=slice(e + P * p, end),
        num_signals=N,
        signals=slice(end, end + N * g),
        style_dim=S,
        style=slice(end + N * g, end + N * g + S),
        style_features=STYLE_FEATURES if styles else (),
        num_candidates=G,
        candidate_dim=len(cand_names),
        candidates=slice(s1, s1 + len(cand_names)),
        candidate_features=cand_names,
    )
