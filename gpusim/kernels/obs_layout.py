"""The observation layout: feature names, normalisation constants and :class:`ObsLayout`.

Shared by the observation kernel (:mod:`gpusim.kernels.observations`, which documents each block's
semantics) and by everything that reads observation vectors (policy dimensions, the renderer's ego
view). Pure Python: no tensors.
"""

from __future__ import annotations

import dataclasses
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


#: The blocks of the flat observation vector, in order: name -> ``(slots, features per slot)`` as a
#: function of the sizes dict of :func:`layout_from_sizes` (``ego_dim``, ``num_partners``,
#: ``partner_dim``, ``num_roads``, ``road_dim``, ``num_signals``, ``signal_dim``, ``style_dim``,
#: ``candidate_dim``; any other key is read from the env's settings by name, e.g. an ``EnvConfig``
#: field, so a block whose size is a setting reads it here and nothing else needs its size).
#: Every writer (the observation kernels, the observe stage) and every reader (the policy's
#: encoder, the renderer, the experience hooks) finds a block by its slice in the
#: :class:`ObsLayout` built from this table, so a new block is one entry here plus its writer. The
#: kernels write ``ego``, ``partners`` and ``roads`` in one pass: those three stay adjacent and in
#: this order (:func:`layout_from_sizes` checks it).
BLOCKS = {
    "ego": lambda s: (1, s["ego_dim"]),
    "partners": lambda s: (s["num_partners"], s["partner_dim"]),
    "roads": lambda s: (s["num_roads"], s["road_dim"]),
    "signals": lambda s: (s["num_signals"], s["signal_dim"]),
    "style": lambda s: (1, s["style_dim"]),
    "candidates": lambda s: (1, s["candidate_dim"]),
}

#: The blocks the observation kernels write in one pass, adjacent and in this order.
KERNEL_BLOCKS = ("ego", "partners", "roads")


@dataclass(frozen=True)
class ObsLayout:
    """Layout of the flat observation vector, the blocks of :data:`BLOCKS` in their order
    (by default ``[ego | partners | roads | signals | style | candidates]``; the signal block is
    absent, ``num_signals = 0``, unless asked for; the style block, the agent's own normalised
    reward weights, is there only with ``EnvConfig.reward_conditioning``; the candidate block only
    in the memory task).

    Attributes:
        ego_dim: features of the ego block (``len(ego_features)``).
        num_partners: P partner slots.
        partner_dim: features per partner slot (last = valid flag).
        num_roads: K road slots.
        road_dim: features per road slot (last = valid flag).
        obs_dim: D, the sum of the block widths.
        ego, partners, roads, signals: slices of the flat vector; ``obs[..., layout.partners]``
            reshaped to ``[..., P, partner_dim]`` gives the partner slots (likewise roads, signals).
        num_signals: N traffic-signal slots (0: no signal block). signal_dim: features per signal
            slot (last = valid flag).
        style_dim: entries of the style block (0 or ``gpusim.styles.NUM_STYLE_TERMS``); ``style``:
            its slice. Each entry is ``(v - low) / (high - low)`` of the agent's own style
            (:data:`STYLE_FEATURES`; docs/styles.md).
        num_candidates: G candidate goals of the memory task (0: no candidate block);
            candidate_dim: width of the candidate block, ``3 G + 1`` (per candidate x, y in the ego
            frame and distance, / 100 m, then ``at_decoy``); ``candidates``: its slice;
            ``candidate_features``: its names (``gpusim/sim/candidates.py``).
        ego_features, partner_features, road_features, signal_features: feature names, with their
            divisor after a ``/`` (see the module docstring).
        blocks: ``((name, slice), ...)`` of every block of :data:`BLOCKS`, in order (a block of
            width 0 has an empty slice).
        sizes: ``((key, value), ...)``, sorted: every size the entries of :data:`BLOCKS` read to
            build this layout (:func:`layout_from_sizes`), so that a reader can rebuild it
            (``policy.encoders.ObsDims``), settings read by name included.
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
    blocks: tuple = ()
    sizes: tuple = ()

    def block(self, name: str) -> slice:
        """The slice of block ``name`` (a key of :data:`BLOCKS`).

        Raises:
            KeyError: naming the unknown block and the known ones.
        """
        for n, sl in self.blocks:
            if n == name:
                return sl
        raise KeyError(f"ObsLayout: no block {name!r}; blocks: {[n for n, _ in self.blocks]}")

    @property
    def kernel(self) -> slice:
        """The columns the observation kernels write in one pass: ``ego``, ``partners``, ``roads``."""
        return slice(self.ego.start, self.roads.stop)

    def column(self, block: str, feature: str) -> int:
        """Column of feature ``feature`` (its full name, e.g. ``"goal_dist/100"``) of the one-slot
        block ``block`` (``"ego"``, ``"candidates"``) in the flat vector.

        Raises:
            ValueError: an unknown feature name (the message lists the block's names).
        """
        names = {"ego": self.ego_features, "candidates": self.candidate_features, "style": self.style_features}[block]
        if feature not in names:
            raise ValueError(f"ObsLayout: the {block} block has no feature {feature!r}; it has {list(names)}")
        return self.block(block).start + names.index(feature)


class _Sizes(dict):
    """The sizes dict the entries of :data:`BLOCKS` read: a key not given is the attribute of that
    name of ``settings`` (an ``EnvConfig``), else 0, as an int; every key read is recorded."""

    def __init__(self, given: dict, settings=None):
        super().__init__(given)
        self.settings, self.read = settings, {}

    def __missing__(self, key):
        return int(getattr(self.settings, key, 0) or 0)

    def __getitem__(self, key):
        value = int(super().__getitem__(key))
        if value < 0:
            raise ValueError(f"obs_layout: sizes must be >= 0, got {key} = {value}")
        self.read[key] = value
        return value


def layout_from_sizes(settings=None, **sizes) -> ObsLayout:
    """The :class:`ObsLayout` of the block sizes ``sizes`` (the keys :data:`BLOCKS` reads; a key not
    given is read from ``settings`` by name, an ``EnvConfig`` or any object, else 0), blocks in the
    order of :data:`BLOCKS`, with the default feature names (:func:`obs_layout` sets the real ones).
    The sizes read are kept in ``ObsLayout.sizes``.

    Raises:
        ValueError: a negative size, or the kernel blocks (:data:`KERNEL_BLOCKS`) not adjacent and
            in order.
    """
    s = _Sizes({k: int(v) for k, v in sizes.items()}, settings)
    if any(v < 0 for v in dict.values(s)):
        raise ValueError(f"obs_layout: sizes must be >= 0, got {dict(s)}")
    blocks, at = [], 0
    for name, width in BLOCKS.items():
        slots, feats = width(s)
        blocks.append((name, slice(at, at + slots * feats)))
        at += slots * feats
    by = dict(blocks)
    names = [n for n, _ in blocks]
    k0 = names.index(KERNEL_BLOCKS[0])
    if tuple(names[k0:k0 + len(KERNEL_BLOCKS)]) != KERNEL_BLOCKS:
        raise ValueError(f"obs_layout: the blocks {KERNEL_BLOCKS} must be adjacent and in this order, got {names}")
    return ObsLayout(
        ego_dim=s["ego_dim"], num_partners=s["num_partners"], partner_dim=s["partner_dim"],
        num_roads=s["num_roads"], road_dim=s["road_dim"], obs_dim=at,
        ego=by["ego"], partners=by["partners"], roads=by["roads"],
        num_signals=s["num_signals"], signal_dim=s["signal_dim"], signals=by["signals"],
        style_dim=s["style_dim"], style=by["style"], candidate_dim=s["candidate_dim"],
        candidates=by["candidates"], blocks=tuple(blocks), sizes=tuple(sorted(s.read.items())),
    )


def obs_layout(num_partners: int, num_roads: int, num_signals: int = 0, styles: bool = False,
               candidates: int = 0, settings=None) -> ObsLayout:
    """The :class:`ObsLayout` for ``num_partners`` partner slots, ``num_roads`` road slots and
    ``num_signals`` traffic-signal slots (0, the default: no signal block; the env passes
    ``EnvConfig.num_signals``). The blocks before the signal block do not depend on it. ``styles``
    (``EnvConfig.reward_conditioning``) appends the style block of :data:`STYLE_FEATURES`;
    ``candidates`` = G >= 2 (``EnvConfig.goal_candidates``) appends the candidate block after it.
    ``settings``: the env's ``EnvConfig`` (or None), where an entry of :data:`BLOCKS` finds any
    other size it reads, by field name (:func:`layout_from_sizes`).

    Raises:
        ValueError: if ``num_partners`` or ``num_roads`` is < 1 or ``num_signals`` < 0.
    """
    if int(num_partners) < 1 or int(num_roads) < 1:
        raise ValueError(f"obs_layout: num_partners and num_roads must be >= 1, got {num_partners}, {num_roads}")
    if int(num_signals) < 0:
        raise ValueError(f"obs_layout: num_signals must be >= 0, got {num_signals}")
    G = int(candidates) if int(candidates) >= 2 else 0
    cand_names = tuple(f"cand{k}_{n}" for k in range(G) for n in ("x/100", "y/100", "dist/100"))
    cand_names += ("at_decoy",) if G else ()
    style_names = STYLE_FEATURES if styles else ()
    lay = layout_from_sizes(
        settings, ego_dim=len(EGO_FEATURES), num_partners=num_partners, partner_dim=len(PARTNER_FEATURES),
        num_roads=num_roads, road_dim=len(ROAD_FEATURES), num_signals=num_signals,
        signal_dim=len(SIGNAL_FEATURES), style_dim=len(style_names), candidate_dim=len(cand_names))
    return dataclasses.replace(lay, style_features=style_names, num_candidates=G, candidate_features=cand_names)


def kernel_layout(num_partners: int, num_roads: int) -> ObsLayout:
    """The layout of what the observation kernels write (``gpusim.kernels.observations``): the
    :data:`KERNEL_BLOCKS` of :func:`obs_layout` alone, from column 0 (their D0 = ``obs_dim``);
    the env writes it at ``obs_layout(...).kernel``.

    Raises:
        ValueError: as :func:`obs_layout`.
    """
    full = obs_layout(num_partners, num_roads)
    k0 = full.kernel.start

    def shift(sl: slice) -> slice:
        return slice(sl.start - k0, sl.stop - k0)

    return dataclasses.replace(
        full, obs_dim=full.kernel.stop - k0, ego=shift(full.ego), partners=shift(full.partners),
        roads=shift(full.roads), signals=slice(0, 0), num_signals=0, style=slice(0, 0), style_dim=0,
        candidates=slice(0, 0), candidate_dim=0,
        blocks=tuple((n, shift(full.block(n))) for n in KERNEL_BLOCKS))
