"""Rollouts in and out of the challenge format: match submitted trajectories to a scene.

:func:`rollouts_for` checks a submission's rollouts of one scenario against its
:class:`~gpusim.wosac.scene.WosacScene` (the same objects as the sim agents, 80 steps, finite
values) and puts them in the scene's object order; :func:`proto_payloads` gives the ``Scenario``
protos of sources for the scenarios that were scored.
"""

from __future__ import annotations

import numpy as np
import torch

from gpusim.data.errors import ScenarioError
from gpusim.data.proto_export import scenario_payloads
from gpusim.wosac import config as C
from gpusim.wosac.scene import WosacScene


def rollouts_for(scene: WosacScene, ids, states, *, file="rollouts") -> torch.Tensor:
    """Submitted rollouts of ``scene`` in the scene's object order.

    Args:
        ids: [N] object ids of the submitted trajectories.
        states: [R, N, T, 4] float (x, y, z, heading).

    Returns:
        [R, N, 80, 4] float32 tensor (CPU).

    Raises:
        ScenarioError: (field ``scenario <id>``) when the objects are not exactly the scene's sim
            agents (missing, extra or repeated ids), the steps are not 80, or values are not finite.
    """
    fld = f"scenario {scene.scenario_id}"
    ids = np.asarray(ids, np.int64)
    states = np.asarray(states, np.float32)
    want = set(scene.object_id.tolist())
    got = ids.tolist()
    if len(set(got)) != len(got):
        raise ScenarioError(file, fld, "an object id appears twice in a joint scene")
    if set(got) != want:
        miss, extra = sorted(want - set(got)), sorted(set(got) - want)
        raise ScenarioError(file, fld, f"objects do not match the scenario's sim agents (valid at step "
                            f"{C.CURRENT_TIME_INDEX}): missing {miss[:5]}{'...' if len(miss) > 5 else ''}, "
                            f"not sim agents {extra[:5]}{'...' if len(extra) > 5 else ''}")
    if states.ndim != 4 or states.shape[2] != C.SIM_STEPS or states.shape[3] != 4:
        raise ScenarioError(file, fld, f"trajectories must have {C.SIM_STEPS} steps of (x, y, z, heading), "
                            f"got shape {list(states.shape)}")
    if not np.isfinite(states).all():
        raise ScenarioError(file, fld, "non-finite simulated states")
    order = {v: i for i, v in enumerate(got)}
    return torch.as_tensor(states[:, [order[v] for v in scene.object_id.tolist()]])


def proto_payloads(sources, scenario_ids: set) -> list[bytes]:
    """Serialized ``Scenario`` protos of ``sources`` whose ``scenario_id`` is in ``scenario_ids``."""
    from gpusim.data.convert import expand_sources
    from gpusim.data.womd_proto import messages

    out = []
    files, _ = expand_sources(sources)
    for f in files:
        for _, item in scenario_payloads(f):
            if isinstance(item, ScenarioError):
                continue
            msg = messages()["Scenario"]()
            msg.ParseFromString(item)
            if msg.scenario_id in scenario_ids:
                out.append(item)
    return out
