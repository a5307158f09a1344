"""The shared enums of gpusim: a leaf module (imports only the standard library).

Both the configuration (:mod:`gpusim.config`, which re-exports every name here) and the kernels
(:mod:`gpusim.kernels`, which may import nothing of the project but :mod:`gpusim.backend` and this
module) use these codes, so they live here, below both. Tensors store the integer values
(``int8`` object and road types, ``int32``/Python ints for behaviours).
"""

from __future__ import annotations

import enum

__all__ = [
    "NamedEnum",
    "ObjectType",
    "NUM_OBJECT_TYPES",
    "RoadType",
    "NUM_ROAD_OBS_TYPES",
    "GoalBehavior",
    "ContactBehavior",
    "ActionSpace",
    "Dynamics",
    "SignalState",
    "RED_SIGNAL_STATES",
]


class NamedEnum(enum.IntEnum):
    """Integer enum whose members can also be given by lower-case name."""

    @classmethod
    def parse(cls, value):
        """Return the member for ``value`` (member, int or case-insensitive name).

        Raises:
            ValueError: if ``value`` names no member; the message lists the valid names.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.strip().upper().replace("-", "_")
            if key in cls.__members__:
                return cls.__members__[key]
        elif isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        names = ", ".join(m.name.lower() for m in cls)
        raise ValueError(f"{cls.__name__}: {value!r} is not one of: {names}")

    def __str__(self) -> str:  # so CLIs and logs print "stop", not "GoalBehavior.STOP"
        return self.name.lower()


class ObjectType(NamedEnum):
    """Type of a scenario object; other WOMD types are ignored at conversion (counted)."""

    VEHICLE = 0
    PEDESTRIAN = 1
    CYCLIST = 2


class RoadType(NamedEnum):
    """Type of a road polyline, as named in the GPUDrive/PufferDrive JSON (``roads[i].type``)."""

    LANE = 0
    ROAD_LINE = 1
    ROAD_EDGE = 2
    STOP_SIGN = 3
    CROSSWALK = 4
    SPEED_BUMP = 5
    DRIVEWAY = 6
    OTHER = 7


#: Object types one-hot encoded in observations (vehicle, pedestrian, cyclist).
NUM_OBJECT_TYPES = len(ObjectType)

#: Road types are one-hot encoded in observations as four groups: lane, road_line, road_edge,
#: and everything else.
NUM_ROAD_OBS_TYPES = 4


class GoalBehavior(NamedEnum):
    """What happens when a controlled agent reaches its goal (numbering as in PufferDrive for the
    first four). ``CONTINUE``: nothing; the agent drives on with the same goal, the goal reward is
    paid at the first arrival of the episode only (the sim-agent setting, docs/training.md)."""

    RESPAWN = 0
    NEW_GOAL = 1
    STOP = 2
    TRIAL = 3
    CONTINUE = 4


class ContactBehavior(NamedEnum):
    """What a collision or an offroad event does to the agent."""

    IGNORE = 0
    STOP = 1
    REMOVE = 2


class ActionSpace(NamedEnum):
    """Discrete 7 x 13 (acceleration x steering) grid, or continuous [-1, 1]^2."""

    DISCRETE = 0
    CONTINUOUS = 1


class Dynamics(NamedEnum):
    """Vehicle dynamics model. ``CLASSIC`` is the kinematic bicycle of PufferDrive's classic env."""

    CLASSIC = 0


class SignalState(enum.IntEnum):
    """State of the traffic signal controlling a lane. Codes equal Waymo's
    ``TrafficSignalLaneState.State`` numbers (``map.proto``); names are the lower-case JSON names.
    Stored as ``int8`` in ``ScenarioPack.signal_state``."""

    UNKNOWN = 0
    ARROW_STOP = 1
    ARROW_CAUTION = 2
    ARROW_GO = 3
    STOP = 4
    CAUTION = 5
    GO = 6
    FLASHING_STOP = 7
    FLASHING_CAUTION = 8

    @classmethod
    def from_name(cls, name: str) -> "SignalState | None":
        """``"arrow_stop"``, ``"ARROW_STOP"`` or ``"LANE_STATE_ARROW_STOP"`` -> member; None if unknown."""
        key = name.upper()
        key = key[len("LANE_STATE_"):] if key.startswith("LANE_STATE_") else key
        return cls.__members__.get(key)


#: Signal states that count as red for the ``red_light_violation`` metric: a solid red (STOP) and
#: a red arrow (ARROW_STOP), as in WOSAC's traffic-light-violation metric. A flashing red is left
#: out: it acts as a stop sign (stop, then go when clear), so crossing it is legal after a stop.
RED_SIGNAL_STATES = (SignalState.ARROW_STOP, SignalState.STOP)


#: The entries of a driving style (reward conditioning, ``gpusim.styles``: units, signs, ranges),
#: in the order of ``EnvState.style``'s last axis and of the observation's style block. Declared in
#: this leaf module so that the observation layout (``gpusim.kernels.obs_layout``) can name them.
STYLE_TERMS = ("goal", "collision", "offroad", "red_light", "overspeed", "accel", "yaw_rate", "time",
               "target_speed")
