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


def assemble_rollouts(scene: WosacScene, track_index, states, *, offset=(0.0, 0.0), fill: str = "refuse"):
    """Simulator output -> the scene's rollouts: map simulated slots to sim agents by track index.

    Args:
        scene: the scenario.
        track_index: [A] int, for each simulated slot the index of its object in
            ``Scenario.tracks`` (a pack's ``source_index``); -1 for slots that are not objects.
        states: [R, A, 80, 3] float x, y (m, in the simulator's frame), heading (rad) per step.
        offset: (x, y) added to go from the simulator's frame back to the scenario's (m).
        fill: what to do with sim agents no slot simulates: ``"refuse"`` (raise) or ``"log"``
            (copy the logged future, as stored; the figures then flatter the policy).

    Returns:
        ([R, N, 80, 4] float32 tensor with z = each object's logged z at step 10, [N] bool which
        sim agents were filled from the log).

    Raises:
        ValueError: for a bad ``states`` shape or ``fill``; ``fill="refuse"`` and a sim agent
            without a slot (the message counts and names them).
    """
    states = torch.as_tensor(states, dtype=torch.float32)
    track_index = torch.as_tensor(track_index, dtype=torch.int64)
    if states.dim() != 4 or states.shape[1] != track_index.shape[0] or states.shape[2:] != (C.SIM_STEPS, 3):
        raise ValueError(f"states must be [R, {track_index.shape[0]}, {C.SIM_STEPS}, 3], got {list(states.shape)}")
    if fill not in ("refuse", "log"):
        raise ValueError(f"fill must be 'refuse' or 'log', got {fill!r}")
    R, N, t0 = states.shape[0], scene.num_objects, C.CURRENT_TIME_INDEX
    want = torch.as_tensor(scene.track_index)
    match = track_index[None, :] == want[:, None]  # [N, A]
    has = match.any(dim=1)
    if fill == "refuse" and not bool(has.all()):
        miss = scene.object_id[~has.numpy()].tolist()
        raise ValueError(f"scenario {scene.scenario_id}: {len(miss)} sim agent(s) valid at step {t0} are not "
                         f"simulated (object ids {miss[:8]}{'...' if len(miss) > 8 else ''})")
    slot = match.float().argmax(dim=1)
    sim = states[:, slot]  # [R, N, 80, 3]
    out = torch.empty(R, N, C.SIM_STEPS, 4)
    out[..., 0] = sim[..., 0] + float(offset[0])
    out[..., 1] = sim[..., 1] + float(offset[1])
    out[..., 2] = torch.as_tensor(scene.z[:, t0])[None, :, None]
    out[..., 3] = sim[..., 2]
    if not bool(has.all()):
        fut = slice(t0 + 1, C.TOTAL_STEPS)
        log = torch.stack([torch.as_tensor(getattr(scene, k)[:, fut]) for k in ("x", "y", "z", "heading")], -1)
        out[:, ~has] = log[~has][None]
    return out, ~has
