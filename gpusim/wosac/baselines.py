"""Rollouts built directly from the log, no simulator: the references of the WOSAC figures.

Both return ``[S, R, N, 80, 4]`` float32 simulated (x, y, z, heading) for a
:class:`~gpusim.wosac.scene.WosacBatch`, the input of :func:`gpusim.wosac.metrics.score`.
"""

from __future__ import annotations

import torch

from gpusim.wosac import config as C
from gpusim.wosac.scene import WosacBatch

_FUT = slice(C.CURRENT_TIME_INDEX + 1, C.TOTAL_STEPS)


def log_replay(batch: WosacBatch, rollouts: int = C.N_ROLLOUTS) -> torch.Tensor:
    """Every rollout is the logged future, values copied as stored even at invalid steps (as
    Waymo's ``scenario_to_joint_scene`` does): the upper reference."""
    st = torch.stack([batch.x[..., _FUT], batch.y[..., _FUT], batch.z[..., _FUT], batch.heading[..., _FUT]], -1)
    return st[:, None].expand(-1, rollouts, -1, -1, -1).contiguous()


def constant_speed(batch: WosacBatch, rollouts: int = C.N_ROLLOUTS) -> torch.Tensor:
    """Every object keeps its logged velocity and heading of ``CURRENT_TIME_INDEX``; z stays."""
    t0 = C.CURRENT_TIME_INDEX
    k = torch.arange(1, C.SIM_STEPS + 1, dtype=torch.float32, device=batch.x.device) * C.STEP_SECONDS
    x = batch.x[..., t0:t0 + 1] + batch.vx[..., t0:t0 + 1] * k
    y = batch.y[..., t0:t0 + 1] + batch.vy[..., t0:t0 + 1] * k
    z = batch.z[..., t0:t0 + 1].expand_as(x)
    h = batch.heading[..., t0:t0 + 1].expand_as(x)
    return torch.stack([x, y, z, h], -1)[:, None].expand(-1, rollouts, -1, -1, -1).contiguous()


BASELINES = {"log_replay": log_replay, "constant_speed": constant_speed}
