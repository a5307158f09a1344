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
    """What happens when a controlled agent reaches its goal (numbering as in PufferDrive)."""

    RESPAWN = 0
    NEW_GOAL = 1
    STOP = 2
    TRIAL = 3


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
