"""Driving styles: the terms of the conditioned reward, their default ranges and the named styles.

With ``EnvConfig.reward_conditioning`` on, every agent carries its own reward weights (the state
field ``EnvState.style`` [W, A, R], drawn at the start of each episode; ``gpusim/sim/styles.py``),
the rewards stage pays the weighted sum of the terms below (``gpusim/sim/rewards.py``) and the
observation ends with the agent's own weights, normalised to [0, 1] by the configured ranges
(docs/styles.md, docs/observations.md). Pure Python: no tensors.

The R = 9 entries of a style, in this order (units; sign of a sensible weight):

====================  ======================================================  =========
entry                 paid per in-play step                                   sign
====================  ======================================================  =========
``goal``              per goal reached now (1 at the step of arrival)         >= 0
``collision``         per step in collision                                   <= 0
``offroad``           per step offroad                                        <= 0
``red_light``         per crossing of a red signal's stop line                <= 0
``overspeed``         per m/s above ``target_speed`` (max(0, v - v_target))   <= 0
``accel``             per m/s^2 of commanded |acceleration|                   <= 0
``yaw_rate``          per rad/s of |yaw rate| (kinematic bicycle)             <= 0
``time``              per step in play (a time cost)                          <= 0
``target_speed``      not a weight: the speed (m/s) above which overspeed     > 0
                      is paid
====================  ======================================================  =========

The ranges are this project's choice, sized so that over a 9 s episode (80 steps at 10 Hz) each
per-step term at the end of its range weighs about as much as a collision: 1 m/s over the target
for the whole episode costs 0.8 at ``overspeed = -0.01``, full braking (4 m/s^2) throughout 1.28
at ``accel = -0.004``.
"""

from __future__ import annotations

import math

#: Entries of a style vector, in order (module docstring: units and signs); declared in the leaf
#: module ``gpusim.enums`` so that the observation layout may name them.
from gpusim.enums import STYLE_TERMS
#: R, the length of a style vector.
NUM_STYLE_TERMS = len(STYLE_TERMS)

#: Default per-entry ranges (low, high) of the draw (uniform; low == high is a fixed value).
DEFAULT_RANGES = (
    (0.5, 1.5),      # goal
    (-1.0, -0.2),    # collision
    (-1.0, -0.2),    # offroad
    (-0.5, 0.0),     # red_light
    (-0.02, 0.0),    # overspeed, per m/s above target per step
    (-0.004, 0.0),   # accel, per m/s^2 per step
    (-0.02, 0.0),    # yaw_rate, per rad/s per step
    (-0.005, 0.0),   # time, per step
    (5.0, 20.0),     # target_speed, m/s
)

#: Named styles (values inside :data:`DEFAULT_RANGES`). ``default`` is the middle of every range;
#: ``cautious`` values safety and comfort (heavy contact penalties, a low target speed, no time
#: cost); ``aggressive`` values arriving (large goal reward, light penalties, a time cost, a
#: high target speed).
STYLES = {
    "cautious": (1.0, -1.0, -1.0, -0.5, -0.02, -0.004, -0.02, 0.0, 6.0),
    "default": (1.0, -0.6, -0.6, -0.25, -0.01, -0.002, -0.01, -0.0025, 12.5),
    "aggressive": (1.5, -0.2, -0.2, 0.0, 0.0, 0.0, 0.0, -0.005, 20.0),
}


def check_ranges(ranges) -> tuple:
    """``ranges`` as a tuple of R ``(low, high)`` float pairs.

    Raises:
        ValueError: not R pairs, a non-finite bound, low > high, or a target-speed range not > 0.
    """
    try:  # pairs, or "low,high" strings (command line)
        out = tuple((float(lo), float(hi)) for lo, hi in (r.split(",") if isinstance(r, str) else r
                                                          for r in ranges))
    except (TypeError, ValueError):
        raise ValueError(f"EnvConfig.reward_ranges must be {NUM_STYLE_TERMS} (low, high) pairs for "
                         f"{', '.join(STYLE_TERMS)}; got {ranges!r}") from None
    if len(out) != NUM_STYLE_TERMS:
        raise ValueError(f"EnvConfig.reward_ranges has {len(out)} pairs; {NUM_STYLE_TERMS} needed "
                         f"({', '.join(STYLE_TERMS)})")
    for name, (lo, hi) in zip(STYLE_TERMS, out):
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
            raise ValueError(f"EnvConfig.reward_ranges: {name} range ({lo}, {hi}) must be finite with low <= high")
    if out[-1][0] <= 0:
        raise ValueError(f"EnvConfig.reward_ranges: target_speed must be > 0 m/s, got low {out[-1][0]}")
    return out


def check_style(values, ranges, what: str = "style") -> tuple:
    """``values`` (R numbers) as a float tuple, checked against ``ranges`` (R (low, high) pairs).
    A style name or a comma-separated string (alone or as the only item) goes through
    :func:`style_values`.

    Raises:
        ValueError: one line naming the first bad entry, its value and the allowed range (NaN,
            out of range, wrong length).
    """
    if isinstance(values, str) or (len(values) == 1 and isinstance(values[0], str)):  # a name or "v1,v2,..."
        return style_values(values if isinstance(values, str) else values[0], ranges, what)
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: expected {NUM_STYLE_TERMS} numbers ({', '.join(STYLE_TERMS)}), "
                         f"got {values!r}") from None
    if len(out) != NUM_STYLE_TERMS:
        raise ValueError(f"{what}: expected {NUM_STYLE_TERMS} numbers ({', '.join(STYLE_TERMS)}), got {len(out)}")
    for name, v, (lo, hi) in zip(STYLE_TERMS, out, ranges):
        if not (lo - 1e-9 <= v <= hi + 1e-9):  # NaN fails too
            raise ValueError(f"{what}: {name} = {v} is outside the allowed range [{lo}, {hi}]")
    return out


def style_values(name_or_values, ranges=DEFAULT_RANGES, what: str = "--style") -> tuple:
    """The R values of a named style (:data:`STYLES`) or of explicit values (a sequence, or a
    comma-separated string ``"1,-0.5,..."``), checked against ``ranges``.

    Raises:
        ValueError: an unknown name (the message lists the names), or bad values (:func:`check_style`).
    """
    if isinstance(name_or_values, str):
        if name_or_values in STYLES:
            return check_style(STYLES[name_or_values], ranges, f"{what} {name_or_values}")
        if "," not in name_or_values:
            raise ValueError(f"{what}: unknown style {name_or_values!r}; named styles: {', '.join(STYLES)} "
                             f"(or {NUM_STYLE_TERMS} comma-separated weights)")
        name_or_values = name_or_values.split(",")
    return check_style(name_or_values, ranges, what)


def normalised(values, ranges) -> tuple:
    """Observation values of a style: ``(v - low) / (high - low)`` per entry, 0 for a fixed entry."""
    return tuple((v - lo) / (hi - lo) if hi > lo else 0.0 for v, (lo, hi) in zip(values, ranges))


def style_name(values) -> str:
    """The name of the named style whose values are ``values`` (R numbers), ``"custom"`` for other
    values, ``"drawn"`` for ``None`` (the training draw)."""
    if values is None:
        return "drawn"
    for name, v in STYLES.items():
        if all(abs(a - b) < 1e-9 for a, b in zip(v, values)):
            return name
    return "custom"
