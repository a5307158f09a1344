"""The Waymo Open Sim Agents Challenge (WOSAC) 2025 settings, as data: one table.

Every value below was read from the public ``waymo-open-dataset`` Python package, version 1.6.7
(``pip install waymo-open-dataset-tf-2-12-0==1.6.7``), module and file named per value:

* ``SIM_AGENTS_2025`` (histogram ranges, bins, smoothing, per-step treatment, weights):
  ``wdl_limited/sim_agents_metrics/challenge_2025_sim_agents_config.textproto``, the config
  ``metrics.load_metrics_config`` loads for the sim-agents challenge. The Bernoulli features set
  no pseudocount there, so the proto default of ``BernoulliEstimate.additive_smoothing_pseudocount``
  applies (0.001, ``protos/sim_agents_metrics.proto``). Values are stored as the float32 numbers
  the proto holds (e.g. 0.1 -> 0.10000000149), which is what the official scorer computes with.
* Protocol (``CURRENT_TIME_INDEX`` .. ``STEP_SECONDS``): ``utils/sim_agents/submission_specs.py``
  (``_SIM_AGENTS_SUBMISSION_CONFIG``).
* Geometry constants: ``interaction_features.py`` (collision threshold, corner rounding, TTC
  limits and following criteria), ``map_metric_features.py`` (offroad threshold, z stretch, the
  cyclic-polyline tolerance), ``metric_features.py`` / ``traffic_light_features.py`` (which lanes
  and signal states count).

The components group into three buckets (``metrics._METRIC_FIELD_NAMES_BY_BUCKET``); the
meta-metric is the weighted sum of the ten component likelihoods (weights sum to 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Index of the last logged step given to the simulator (0-based; 1.1 s of history at 10 Hz).
CURRENT_TIME_INDEX = 10
#: Steps each rollout simulates after ``CURRENT_TIME_INDEX`` (8 s at 10 Hz).
SIM_STEPS = 80
#: Rollouts per scenario.
N_ROLLOUTS = 32
#: Seconds per step.
STEP_SECONDS = 0.1
#: Steps of a full WOMD scenario (history, current and future).
TOTAL_STEPS = CURRENT_TIME_INDEX + 1 + SIM_STEPS

#: Distance (m) below which two boxes are in collision (``interaction_features``).
COLLISION_DISTANCE_THRESHOLD = 0.0
#: Boxes get rounded corners of radius ``min(length, width) * factor / 2`` (``interaction_features``).
CORNER_ROUNDING_FACTOR = 0.7
#: Stand-in for "no object" distances (m) (``interaction_features``, ``map_metric_features``).
EXTREMELY_LARGE_DISTANCE = 1e10
#: Time-to-collision cap (s) and the "following" criteria (``interaction_features``).
MAXIMUM_TIME_TO_COLLISION = 5.0
MAX_HEADING_DIFF = math.radians(75.0)
MAX_HEADING_DIFF_FOR_SMALL_OVERLAP = math.radians(10.0)
SMALL_OVERLAP_THRESHOLD = 0.5
#: Signed road-edge distance (m) above which a box corner is off-road (``map_metric_features``).
OFFROAD_DISTANCE_THRESHOLD = 0.0
#: z distances are stretched by this factor when choosing the nearest road-edge segment, so
#: edges of another level (overpasses) are not chosen (``map_metric_features``).
Z_STRETCH = 3.0
#: A polyline whose first and last points are closer than this (squared metres) is cyclic.
CYCLIC_TOLERANCE_M2 = 1.0
#: ``LaneCenter.type`` of the lanes the traffic-light feature uses (TYPE_SURFACE_STREET).
SURFACE_STREET_LANE_TYPE = 2
#: ``TrafficSignalLaneState.state`` codes that mean "stop" (LANE_STATE_ARROW_STOP, LANE_STATE_STOP).
STOP_SIGNAL_STATES = (1, 4)
#: ``Track.object_type`` of vehicles (TYPE_VEHICLE): time to collision and traffic-light
#: violations are scored for vehicles only.
VEHICLE_TYPE = 1


def _f32(v: float) -> float:
    """The float32 value a proto ``float`` field holds for ``v``."""
    return float(np.float32(v))


@dataclass(frozen=True)
class FeatureConfig:
    """How one component is scored.

    Attributes:
        name: component name (the official field name, without ``_likelihood``).
        bucket: ``kinematic``, ``interactive`` or ``map_based``.
        estimator: ``histogram`` or ``bernoulli``.
        min_val, max_val, num_bins: histogram range and bins (bernoulli: -0.5, 1.5, 2 bins).
        pseudocount: additive smoothing added to every bin count.
        independent_timesteps: pool all steps of all rollouts into one histogram per object
            (the 2025 config sets it for every histogram feature).
        weight: weight in the meta-metric.
    """

    name: str
    bucket: str
    estimator: str
    min_val: float
    max_val: float
    num_bins: int
    pseudocount: float
    independent_timesteps: bool
    weight: float


def _hist(name, bucket, lo, hi, bins, weight):
    return FeatureConfig(name, bucket, "histogram", _f32(lo), _f32(hi), bins, _f32(0.1), True, _f32(weight))


def _bern(name, bucket, weight):
    return FeatureConfig(name, bucket, "bernoulli", -0.5, 1.5, 2, _f32(0.001), False, _f32(weight))


#: The 2025 sim-agents config (challenge_2025_sim_agents_config.textproto), in the official order.
SIM_AGENTS_2025: tuple[FeatureConfig, ...] = (
    _hist("linear_speed", "kinematic", 0.0, 25.0, 10, 0.05),            # m/s
    _hist("linear_acceleration", "kinematic", -12.0, 12.0, 11, 0.05),   # m/s^2
    _hist("angular_speed", "kinematic", -0.628, 0.628, 11, 0.05),       # rad/s
    _hist("angular_acceleration", "kinematic", -3.14, 3.14, 11, 0.05),  # rad/s^2
    _hist("distance_to_nearest_object", "interactive", -5.0, 40.0, 10, 0.1),  # m
    _bern("collision_indication", "interactive", 0.25),
    _hist("time_to_collision", "interactive", 0.0, 5.0, 10, 0.1),       # s
    _hist("distance_to_road_edge", "map_based", -20.0, 40.0, 10, 0.05),  # m
    _bern("offroad_indication", "map_based", 0.25),
    _bern("traffic_light_violation", "map_based", 0.05),
)

#: Component names in the official order.
COMPONENTS: tuple[str, ...] = tuple(f.name for f in SIM_AGENTS_2025)
#: Bucket names in the official order.
BUCKETS: tuple[str, ...] = ("kinematic", "interactive", "map_based")


def feature(name: str) -> FeatureConfig:
    """The :class:`FeatureConfig` of component ``name``.

    Raises:
        KeyError: for an unknown component name.
    """
    for f in SIM_AGENTS_2025:
        if f.name == name:
            return f
    raise KeyError(f"unknown WOSAC component {name!r}; known: {', '.join(COMPONENTS)}")
