"""WOSAC likelihoods and the meta-metric, batched over scenarios on any torch device.

Estimators (``wdl_limited/sim_agents_metrics/estimators.py`` and ``metrics.py`` of
``waymo-open-dataset`` 1.6.7, restated):

* **histogram** (``independent_timesteps``): per scenario and evaluated object, the values of all
  rollouts at all 80 steps form one histogram over ``num_bins`` equal bins of [min, max] (values
  clipped into the range; NaN values — the first/last-step kinematics — fall into the last bin, as
  ``tfp.stats.histogram`` puts them); each count gets ``pseudocount`` added and the histogram is
  normalised. Each logged value at a step scores the log probability of its bin. The component is
  ``exp(mean log-probability)`` over the valid (object, step) pairs: speed validity for speeds,
  acceleration validity for accelerations, logged validity for distances, logged validity of
  vehicles for time to collision.
* **bernoulli** (collision, offroad, traffic-light violation): per object, "any event at a step
  where the *log* is valid" over the 80 steps, in the log and in each rollout; the rollouts give a
  two-bin histogram (pseudocount 0.001) and the log's outcome scores its log probability; the
  component is ``exp(mean)`` over all evaluated objects (traffic-light events count for vehicles
  only).
* **meta-metric**: sum of ``weight x component`` (:data:`gpusim.wosac.config.SIM_AGENTS_2025`).

A component with no valid pair is NaN, as in the official scorer (``0 / 0``).
"""

from __future__ import annotations

import torch

from gpusim.wosac import config as C
from gpusim.wosac import features as F
from gpusim.wosac.scene import WosacBatch


def histogram_bins(values: torch.Tensor, cfg: C.FeatureConfig) -> torch.Tensor:
    """Bin index (int64, same shape) of ``values`` under ``cfg``'s histogram, official rules:
    clipped into range, bin ``i`` holds ``[edge_i, edge_i+1)``, the max in the last bin, NaN in
    the last bin. Edges are float32 ``min + i (max - min) / bins`` with the last edge = max."""
    n = cfg.num_bins
    f32 = torch.float32
    delta = torch.tensor((cfg.max_val - cfg.min_val) / n, dtype=f32)
    edges = torch.tensor(cfg.min_val, dtype=f32) + torch.arange(n + 1, dtype=f32) * delta
    edges[-1] = cfg.max_val
    edges = edges.to(values.device)
    v = values.to(f32).clamp(cfg.min_val, cfg.max_val)
    b = torch.searchsorted(edges, v.contiguous(), right=True) - 1
    b = b.clamp(0, n - 1)
    return torch.where(torch.isnan(v), torch.full_like(b, n - 1), b)


def histogram_log_likelihood(log_values, sim_values, cfg: C.FeatureConfig) -> torch.Tensor:
    """Log probability of each logged value under the rollouts' pooled histogram.

    Args:
        log_values: [S, E, T] (bool for Bernoulli features, else float).
        sim_values: [S, R, E, T] (``independent_timesteps``: all R x T values per object pool).

    Returns:
        [S, E, T] float32.
    """
    lb = histogram_bins(log_values.float(), cfg)
    sb = histogram_bins(sim_values.float(), cfg)  # [S,R,E,T]
    S, R, E, T = sb.shape
    counts = torch.zeros(S, E, cfg.num_bins, dtype=torch.float32, device=sb.device)
    counts.scatter_add_(2, sb.permute(0, 2, 1, 3).reshape(S, E, R * T), torch.ones(S, E, R * T, device=sb.device))
    counts += cfg.pseudocount
    logp = torch.log(counts) - torch.log(counts.sum(-1, keepdim=True))
    return torch.gather(logp, 2, lb)


def _masked_mean(t: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Mean of ``t`` over the trailing dims where ``m`` (per scenario: [S]); NaN when none."""
    dims = tuple(range(1, t.dim()))
    return torch.where(m, t, torch.zeros_like(t)).sum(dims) / m.float().sum(dims)


def compute_features(batch: WosacBatch, x, y, z, heading, valid, *, chunk: int = 1 << 22) -> dict:
    """All per-step features of the evaluated objects, ``[S, R, E, 80]`` each.

    Args:
        x, y, z, heading: [S, R, N, 91] float32 full trajectories (history included).
        valid: [S, R|1, N, 91] bool.

    Returns:
        dict with ``linear_speed``, ``linear_acceleration``, ``angular_speed``,
        ``angular_acceleration``, ``distance_to_nearest_object``, ``time_to_collision``,
        ``distance_to_road_edge`` (float32) and ``collision``, ``offroad``,
        ``traffic_light_violation`` (bool).
    """
    ev = [F.gather_evaluated(t, batch) for t in (x, y, z, heading)]
    speed, accel, dh, d2h = (t[..., F.SCORED_STEPS] for t in F.kinematics(*ev))
    dist = F.distance_to_nearest_object(batch, x, y, heading, valid, chunk=chunk)
    edge = F.distance_to_road_edge(batch, x, y, z, heading, valid, chunk=chunk)
    return {
        "linear_speed": speed, "linear_acceleration": accel, "angular_speed": dh, "angular_acceleration": d2h,
        "distance_to_nearest_object": dist,
        "time_to_collision": F.time_to_collision(batch, x, y, heading, valid, chunk=chunk),
        "distance_to_road_edge": edge,
        "collision": dist < C.COLLISION_DISTANCE_THRESHOLD,
        "offroad": edge > C.OFFROAD_DISTANCE_THRESHOLD,
        "traffic_light_violation": F.red_light_violation(batch, x, y, valid, chunk=chunk),
    }


_EVENT = {"collision_indication": "collision", "offroad_indication": "offroad",
          "traffic_light_violation": "traffic_light_violation"}


def likelihoods(batch: WosacBatch, log_feats: dict, sim_feats: dict) -> dict:
    """The ten component likelihoods and the meta-metric per scenario.

    Args:
        log_feats: :func:`compute_features` of the logged trajectories (R = 1).
        sim_feats: :func:`compute_features` of the rollouts (R rollouts).

    Returns:
        dict component name -> [S] float32, plus ``metametric`` [S] and the buckets
        ``kinematic``, ``interactive``, ``map_based`` (weighted means within each bucket).
    """
    S, E = batch.eval_index.shape
    log_valid = F.gather_evaluated(batch.valid[:, None], batch)[:, 0]  # [S,E,91]
    log_valid &= batch.eval_present[..., None]
    valid = log_valid[..., F.SCORED_STEPS]
    # as in the official scorer, the central-difference validity is taken on the 80 simulated
    # steps only, so the first / last one (speeds) or two (accelerations) steps never count
    speed_ok, accel_ok = F.kinematic_validity(valid)
    types = torch.gather(batch.object_type, 1, batch.eval_index)
    vehicle = (types == C.VEHICLE_TYPE) & batch.eval_present
    mask = {"linear_speed": speed_ok, "angular_speed": speed_ok, "linear_acceleration": accel_ok,
            "angular_acceleration": accel_ok, "distance_to_nearest_object": valid,
            "distance_to_road_edge": valid, "time_to_collision": valid & vehicle[..., None]}
    out = {}
    for cfg in C.SIM_AGENTS_2025:
        if cfg.estimator == "histogram":
            ll = histogram_log_likelihood(log_feats[cfg.name][:, 0], sim_feats[cfg.name], cfg)
            out[cfg.name] = torch.exp(_masked_mean(ll, mask[cfg.name]))
            continue
        ok = (valid & vehicle[..., None]) if cfg.name == "traffic_light_violation" else valid
        ev = _EVENT[cfg.name]
        log_any = (log_feats[ev][:, 0] & ok).any(-1)  # [S,E]
        sim_any = (sim_feats[ev] & ok[:, None]).any(-1)  # [S,R,E]
        ll = histogram_log_likelihood(log_any[..., None], sim_any[..., None], cfg)[..., 0]
        out[cfg.name] = torch.exp(_masked_mean(ll, batch.eval_present))
    out["metametric"] = sum(cfg.weight * out[cfg.name] for cfg in C.SIM_AGENTS_2025)
    for b in C.BUCKETS:
        cfgs = [c for c in C.SIM_AGENTS_2025 if c.bucket == b]
        out[b] = sum(c.weight * out[c.name] for c in cfgs) / sum(c.weight for c in cfgs)
    return out


def log_trajectories(batch: WosacBatch):
    """The logged trajectories as a one-rollout batch: (x, y, z, heading) [S, 1, N, 91] and the
    logged validity [S, 1, N, 91]."""
    return tuple(getattr(batch, k)[:, None] for k in ("x", "y", "z", "heading")), batch.valid[:, None]


def rollout_trajectories(batch: WosacBatch, sim: torch.Tensor):
    """Prepend the logged history to simulated states.

    Args:
        sim: [S, R, N, 80, 4] float32 simulated x, y, z (m), heading (rad) per step.

    Returns:
        ((x, y, z, heading) each [S, R, N, 91], valid [S, 1, N, 91]: logged validity for the
        history, every present object valid for the 80 simulated steps).

    Raises:
        ValueError: if ``sim`` does not have shape [S, R, N, 80, 4] for the batch.
    """
    S, N = batch.present.shape
    if sim.dim() != 5 or sim.shape[0] != S or sim.shape[2] != N or sim.shape[3:] != (C.SIM_STEPS, 4):
        raise ValueError(f"rollouts must have shape [{S}, R, {N}, {C.SIM_STEPS}, 4], got {list(sim.shape)}")
    R, h = sim.shape[1], C.CURRENT_TIME_INDEX + 1
    traj = []
    for i, k in enumerate(("x", "y", "z", "heading")):
        hist = getattr(batch, k)[:, None, :, :h].expand(S, R, N, h)
        traj.append(torch.cat([hist, sim[..., i].to(hist.dtype)], dim=-1))
    fut = batch.present[:, None, :, None].expand(S, 1, N, C.SIM_STEPS)
    return tuple(traj), torch.cat([batch.valid[:, None, :, :h], fut], dim=-1)


def score(batch: WosacBatch, sim: torch.Tensor, *, chunk: int = 1 << 22) -> dict:
    """Score rollouts ``sim`` [S, R, N, 80, 4] against the log: :func:`likelihoods` output.

    Raises:
        ValueError: on a shape mismatch (see :func:`rollout_trajectories`).
    """
    (lx, ly, lz, lh), lv = log_trajectories(batch)
    log_feats = compute_features(batch, lx, ly, lz, lh, lv, chunk=chunk)
    (sx, sy, sz, sh), sv = rollout_trajectories(batch, sim)
    sim_feats = compute_features(batch, sx, sy, sz, sh, sv, chunk=chunk)
    return likelihoods(batch, log_feats, sim_feats)
