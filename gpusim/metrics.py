"""Episode metrics of finished agent-episodes, accumulated on the device.

:class:`EpisodeMetrics` keeps device-side sums over agent-episodes finished since the last report;
:meth:`EpisodeMetrics.report` reads them to the host (the only host read) and clears them. It is a
plain mean over finished agent-episodes; the per-agent EMA slots of DESIGN.md section 8 come from
``gpusim/kernels/ema.py`` and can be fed from the same per-episode values (:data:`METRIC_NAMES`).

Metrics of one agent-episode (DESIGN.md section 4):

* ``episode_return``: sum of the agent's rewards in the episode;
* ``episode_length``: number of valid steps (``loss_mask = 1``) of the agent;
* ``goal_reached``: 1 if the agent reached a goal at least once;
* ``collided`` / ``offroad``: 1 if it was in collision / offroad at a valid step;
* ``score``: 1 if it reached its goal and never collided nor went offroad.
"""

from __future__ import annotations

import torch

METRIC_NAMES = ("episode_return", "episode_length", "goal_reached", "collided", "offroad", "score")


def episode_values(ep_return, ep_length, goal_reached, collided, offroad) -> torch.Tensor:
    """Per agent-episode metric values ``[..., 6]`` float32 in the order of :data:`METRIC_NAMES`.

    Args: tensors of the same shape (``[W, C]``): return (float), length (int), flags (bool).
    """
    g, c, o = goal_reached.float(), collided.float(), offroad.float()
    score = (goal_reached & ~collided & ~offroad).float()
    return torch.stack([ep_return.float(), ep_length.float(), g, c, o, score], dim=-1)


class EpisodeMetrics:
    """Device-side sums of finished agent-episodes.

    Args:
        device: where the accumulators live.
    """

    def __init__(self, device):
        self.sums = torch.zeros(len(METRIC_NAMES), dtype=torch.float64, device=device)
        self.count = torch.zeros((), dtype=torch.int64, device=device)

    def add(self, values: torch.Tensor, finished: torch.Tensor) -> None:
        """Accumulate the agent-episodes where ``finished`` is True (no host sync).

        Args:
            values: ``[W, C, 6]`` float32 from :func:`episode_values`.
            finished: ``[W, C]`` bool.
        """
        f = finished.to(values.dtype)[..., None]
        self.sums += (values * f).sum(dim=(0, 1)).double()
        self.count += finished.sum()

    def report(self) -> dict[str, float]:
        """Means over the agent-episodes finished since the last report, plus ``n`` (their
        number); ``{}`` when none finished. Clears the accumulators. Reads to the host."""
        n = int(self.count)
        if n == 0:
            return {}
        means = (self.sums / n).tolist()
        out = {name: float(v) for name, v in zip(METRIC_NAMES, means)}
        out["n"] = float(n)
        self.sums.zero_()
        self.count.zero_()
        return out
