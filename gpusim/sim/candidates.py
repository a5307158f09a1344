"""The memory task: K candidate goals per controlled agent, one of them true (``EnvConfig.goal_candidates``).

With ``goal_candidates = K >= 2`` every controlled agent sees K candidate goals, alike in its
observation (the candidate block, :func:`candidate_block`); one of them, drawn uniformly per agent
per episode from the env's generator, is the true goal (written into ``EnvState.goal``, so the
goal test of stage ``rewards`` counts only it). Reaching a *decoy* (another candidate, within
``goal_radius``) stops the agent for the rest of the trial (stage :func:`decoys`: ``stopped`` set,
``contact_stopped`` not, no reward; it stays in the scene and its later steps have
``loss_mask = 0``) and sets ``EnvState.at_decoy``, the ego feature "at a wrong candidate". The
candidates and the true goal are drawn at the episode start (:func:`draw_candidates`, called by
``gpusim.sim.episode.begin_episode``) and kept across the trials of the episode (the trial restore
takes them from the episode's start state); the next scenario redraws them.

**Where candidates come from** (:func:`candidate_pool`, once per pack, on the host). First choice,
places the agent can drive to (:func:`reachable_places`): the lane graph of the scenario is
recovered from the lane polylines (:func:`lane_successors`), and from the lanes the agent starts
on (log index ``init_steps``: its lane and the neighbouring lanes of its direction) every route is
followed to the driving distance ``r`` = the length of its logged path over the steps an episode
(a trial) covers, ``init_steps`` to ``init_steps + scenario_length``, clamped to [15 m, 60 m]
(reachable in a trial); one place per route, at least :data:`REACH_SEPARATION` m apart (left /
straight / right at a junction, or neighbouring lanes). Places at the same driving distance on
different routes never lie on each other's way. When fewer than K such places exist (a long
single-lane road), the fallback is geometric: midpoints of the lane segments at a similar
straight-line distance ``r = clamp(|goal - start|, 15 m, 60 m)`` of the logged goal from the start
(not limited to a trial: a short trial may not reach these few places); the first of
:data:`POOL_LEVELS` that yields at least K places is used (distance within ``band * r`` of ``r``,
bearing within ``half`` degrees of the start heading; places kept greedily in bearing order when
they differ by at least ``min_angle`` degrees of bearing and :data:`MIN_SEPARATION` m from every
place kept; at most :data:`POOL_MAX` places). On the shared WOMD splits at ``max_controlled = 8``,
223 of the 270 train agents and 90 of the 109 held-out agents have >= 2 lane-graph places (3.05
and 2.87 on average); every agent has >= 2 places. An agent with fewer than K places is left out of
the task (:func:`task_pool`: every candidate is its logged goal, the evaluator does not count it). ``steer_to_goal`` told the true candidate
reaches it in 0.526 [0.472, 0.580] of the held-out trials (0.318 with the geometric places alone,
many of which lie across a median or on a lane of the other direction). The log's endpoint is no
hint: the true candidate is drawn uniformly, so the route the logged driver took (which may be a
candidate) is true with probability 1/K. The episode's draw (device, no host read): a random subset of K
of the agent's places in random order (one ``[W, C, M]`` uniform draw) and the true index (one
``[W, C]`` uniform draw); with ``EnvConfig.candidate_practice = p > 0`` one more ``[W, C]`` uniform
picks the practice agents (probability p each), whose K candidates all become the true goal (a
training randomisation: the agent practises driving to a shown place; docs/trial.md). Nothing is
drawn when the task is off (K = 0 or 1), so the env's random stream is unchanged.
"""

from __future__ import annotations

import heapq
import math
import warnings

import numpy as np
import torch

from gpusim.config import RoadType
from gpusim.kernels.obs_layout import GOAL_SCALE
from gpusim.sim.context import SimContext, StepVars
from gpusim.state import EnvState

#: Bounds of the candidates' distance from the start (m): the logged goal distance clamped.
MIN_RADIUS, MAX_RADIUS = 15.0, 60.0
#: ``(band, half, min_angle)`` levels of the pool, loosest last (module docstring).
POOL_LEVELS = ((0.3, 90.0, 20.0), (0.6, 90.0, 20.0), (0.6, 135.0, 20.0), (1.0, 180.0, 20.0), (1.0, 180.0, 8.0))
#: Minimum distance between two candidates of an agent (m; > 2 * the default goal radius).
MIN_SEPARATION = 6.0
#: At most this many places per agent in the pool.
POOL_MAX = 16
#: Lane-graph joints: a segment continues another when it starts within this many m of its end ...
JOIN = 1.0
#: ... and turns by less than this many degrees.
MAX_TURN = 60.0
#: Lanes within this many m of the agent's start (and within 45 degrees of its heading) are its start lanes.
START_LATERAL = 6.0
#: Minimum distance between two lane-graph places of an agent (m): distinct lanes, e.g. neighbours.
REACH_SEPARATION = 3.0
#: Features per candidate in the observation block (ego frame x, y and distance, / GOAL_SCALE).
CANDIDATE_FEATURES = ("cand_x/100", "cand_y/100", "cand_dist/100")


def lane_successors(seg: np.ndarray) -> list[list[int]]:
    """The lane graph of one scenario, inferred from geometry: ``succ[i]`` lists the lane segments
    that continue segment ``i`` (their start within :data:`JOIN` m of its end, heading change below
    :data:`MAX_TURN` degrees). ``seg`` [P, 4] float (x0, y0, x1, y1) in m, in the lane's driving
    direction (WOMD lane polylines run in the direction of travel, and a lane's exit lanes start where
    it ends, which is how the graph is recovered without WOMD's entry/exit lane lists)."""
    start, end = seg[:, :2], seg[:, 2:]
    d = end - start
    h = np.arctan2(d[:, 1], d[:, 0])
    cells: dict = {}
    for j, key in enumerate(map(tuple, np.floor(start / JOIN).astype(np.int64))):
        cells.setdefault(key, []).append(j)
    succ = []
    for i, (x, y) in enumerate(np.floor(end / JOIN).astype(np.int64)):
        near = [j for dx in (-1, 0, 1) for dy in (-1, 0, 1) for j in cells.get((x + dx, y + dy), ())]
        succ.append([j for j in near if j != i and np.hypot(*(start[j] - end[i])) <= JOIN
                     and abs((h[j] - h[i] + np.pi) % (2 * np.pi) - np.pi) < math.radians(MAX_TURN)])
    return succ


def reachable_places(seg: np.ndarray, succ: list, start: np.ndarray, heading: float, r: float) -> np.ndarray:
    """[n, 2] places at driving distance ``r`` (m) from ``start`` along the lane graph: one per
    route of :func:`lane_successors` that leaves a lane the agent starts on (within
    :data:`START_LATERAL` m of ``start``, heading within 45 degrees: its own lane and the
    neighbouring lanes of its direction), kept when at least :data:`REACH_SEPARATION` m from every
    place kept and at least ``r / 2`` m from the start in a straight line (no route that turns back). Places at the same driving distance on different routes never lie on each other's
    way, so they are the task's candidates of choice."""
    a, b = seg[:, :2], seg[:, 2:]
    d = b - a
    length = np.linalg.norm(d, axis=1) + 1e-9
    u = d / length[:, None]
    along = ((start - a) * u).sum(1)  # the start projects inside a start lane's segment
    off = np.linalg.norm(a + u * along[:, None] - start, axis=1)
    turn = np.abs((np.arctan2(d[:, 1], d[:, 0]) - heading + np.pi) % (2 * np.pi) - np.pi)
    first = (along >= 0) & (along <= length) & (off <= START_LATERAL) & (turn < math.radians(45))
    heap = [(-float(along[i]), int(i)) for i in np.nonzero(first)[0]]
    heapq.heapify(heap)  # (driving distance at the segment's start, segment): Dijkstra over the graph
    seen, out = set(), []
    while heap:
        d0, i = heapq.heappop(heap)
        if i in seen:
            continue
        seen.add(i)
        if d0 + length[i] >= r:
            place = a[i] + (r - d0) / length[i] * d[i]
            if np.linalg.norm(place - start) >= 0.5 * r and all(
                    np.linalg.norm(p - place) >= REACH_SEPARATION for p in out):
                out.append(place)
            continue
        for j in succ[i]:
            if j not in seen:
                heapq.heappush(heap, (d0 + float(length[i]), j))
    return np.asarray(out[:POOL_MAX], dtype=np.float32).reshape(-1, 2)


def _agent_places(mid: np.ndarray, start: np.ndarray, heading: float, goal: np.ndarray, need: int,
                  reach: np.ndarray | None = None) -> np.ndarray:
    """[n, 2] candidate places of one agent (module docstring): the lane-graph places ``reach``
    when there are at least ``need``, else the first geometric level of :data:`POOL_LEVELS` over
    the lane midpoints ``mid`` [P, 2] that yields ``need``, around the straight-line distance of
    the logged goal."""
    if reach is not None and len(reach) >= need:
        return reach
    r = float(np.clip(np.linalg.norm(goal - start), MIN_RADIUS, MAX_RADIUS))
    d = mid - start
    dist = np.linalg.norm(d, axis=1)
    bear = (np.arctan2(d[:, 1], d[:, 0]) - heading + np.pi) % (2 * np.pi) - np.pi
    kept: list[int] = []
    for band, half, min_angle in POOL_LEVELS:
        idx = np.nonzero((np.abs(dist - r) <= band * r) & (np.abs(bear) <= math.radians(half)))[0]
        kept = []
        for i in idx[np.argsort(bear[idx], kind="stable")]:
            if all(abs(bear[i] - bear[j]) >= math.radians(min_angle)
                   and np.linalg.norm(mid[i] - mid[j]) >= MIN_SEPARATION for j in kept):
                kept.append(int(i))
                if len(kept) == POOL_MAX:
                    break
        if len(kept) >= need:
            break
    return mid[kept]


def _driving_distance(path: np.ndarray, valid: np.ndarray) -> float:
    """Length (m) of the logged path ``path`` [T, 2] over its valid steps ``valid`` [T] bool,
    clamped to [MIN_RADIUS, MAX_RADIUS]."""
    p = path[valid]
    return float(np.clip(np.linalg.norm(np.diff(p, axis=0), axis=1).sum() if len(p) > 1 else 0.0,
                         MIN_RADIUS, MAX_RADIUS))


def candidate_pool(pack, config, strict: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The candidate places of every controlled agent of ``pack`` (module docstring).

    Args:
        pack: :class:`~gpusim.data.ScenarioPack`. config: :class:`~gpusim.config.EnvConfig`
            (``goal_candidates``, ``max_controlled``, ``init_steps``).
        strict: raise when an agent has fewer than ``goal_candidates`` places (the memory task
            needs them all); False: such an agent gets count 0 (goal resampling keeps its logged
            goal).

    Returns:
        ``(places [S, C, M, 2] float32 (m, scenario frame), count [S, C] int64)`` on the pack's
        device; slots without a controlled agent have count 0.

    Raises:
        ValueError: with ``strict``, an agent has fewer than ``goal_candidates`` places (names the
            scenario, the slot and how many were found).
    """
    need, C, t0 = int(config.goal_candidates), int(config.max_controlled), int(config.init_steps)
    t1 = t0 + 1 + int(config.scenario_length)  # the log steps an episode (a trial) covers
    seg, rt = pack.road_seg.cpu().numpy(), pack.road_type.cpu().numpy()
    tp, th = pack.traj_pos.cpu().numpy(), pack.traj_heading.cpu().numpy()
    tv = pack.traj_valid.cpu().numpy()
    goal, nc = pack.agent_goal.cpu().numpy(), pack.num_controlled.cpu().numpy()
    S = len(pack.scenario_ids)
    found = [[None] * C for _ in range(S)]
    for s in range(S):
        lanes = seg[s, rt[s] == int(RoadType.LANE)]  # [P, 4], one copy per scenario
        mid = 0.5 * (lanes[:, :2] + lanes[:, 2:])
        succ = lane_successors(lanes) if int(nc[s]) else []
        for c in range(min(int(nc[s]), C)):
            r = _driving_distance(tp[s, c, t0:t1], tv[s, c, t0:t1])
            reach = reachable_places(lanes, succ, tp[s, c, t0], float(th[s, c, t0]), r)
            places = _agent_places(mid, tp[s, c, t0], float(th[s, c, t0]), goal[s, c], need, reach)
            if len(places) < need and not strict:
                continue
            if len(places) < need:
                raise ValueError(
                    f"goal_candidates={need}: scenario {pack.scenario_ids[s]} has only {len(places)} candidate "
                    f"place(s) for its controlled agent in slot {c} (lane points at a similar distance from its "
                    f"start); lower --env.goal-candidates or leave the scenario out")
            found[s][c] = places
    M = max([len(p) for row in found for p in row if p is not None] + [need])
    places = np.zeros((S, C, M, 2), np.float32)
    count = np.zeros((S, C), np.int64)
    for s in range(S):
        for c, p in enumerate(found[s]):
            if p is not None:
                places[s, c, : len(p)] = p
                count[s, c] = len(p)
    dev = pack.road_seg.device
    return torch.from_numpy(places).to(dev), torch.from_numpy(count).to(dev)


#: At most this many scenarios are named in the warning of :func:`task_pool`.
WARN_SCENARIOS = 5
#: Words of that warning (:func:`left_out_message`; the evaluator says it as a note instead).
LEFT_OUT = "are left out of the memory task"


def task_pool(pack, config) -> tuple[torch.Tensor, torch.Tensor]:
    """The memory task's pool: :func:`candidate_pool` without ``strict``, so that a controlled
    agent with fewer than ``goal_candidates`` places (e.g. one that starts in a parking lot, tens of
    metres from every lane) gets count 0 and is left out of the task instead of its scenario being
    refused. Such an agent still drives (the policy controls it), but every one of its candidates is
    its logged goal (:func:`draw_candidates`), so it cannot reach a decoy, and the evaluator does not
    count it (:func:`task_slots`). A ``UserWarning`` says how many agents and names their scenarios
    (at most :data:`WARN_SCENARIOS`; the rest as a count), once per message.

    Args:
        pack: :class:`~gpusim.data.ScenarioPack`. config: :class:`~gpusim.config.EnvConfig` with
            ``goal_candidates`` >= 2.

    Returns:
        ``(places [S, C, M, 2] float32 (m, scenario frame), count [S, C] int64)`` as
        :func:`candidate_pool`; ``count`` is 0 for the agents left out.

    Raises:
        ValueError: no controlled agent of the pack has ``goal_candidates`` places (the task
            cannot be played at all: names the setting and what to do).
    """
    places, count = candidate_pool(pack, config, strict=False)
    need, S = int(config.goal_candidates), count.shape[0]
    out = _left_out(pack, count)
    agents = int(_controlled(pack, count).sum())
    if agents and int(out.sum()) == agents:
        raise ValueError(f"goal_candidates={need}: none of the {agents} controlled agents of the {S} "
                         f"scenario(s) has {need} candidate places (lane points at a similar distance from its "
                         "start); lower --env.goal-candidates or use other scenarios")
    said = left_out_message(pack, count, need)
    if said is not None:
        warnings.warn(said, stacklevel=2)
    return places, count


def left_out_message(pack, count: torch.Tensor, need: int) -> str | None:
    """The line that says which agents :func:`task_pool` leaves out (how many, and their scenarios
    with the count of each, at most :data:`WARN_SCENARIOS` named); None when none is.
    ``count`` [S, C] int64 of :func:`candidate_pool` for ``pack``; ``need`` = ``goal_candidates``."""
    per = _left_out(pack, count).sum(1).tolist()
    named = [f"{pack.scenario_ids[s]} ({n})" for s, n in enumerate(per) if n]
    if not named:
        return None
    agents = int(_controlled(pack, count).sum())
    more = f" and {len(named) - WARN_SCENARIOS} more scenario(s)" if len(named) > WARN_SCENARIOS else ""
    return (f"goal_candidates={need}: {sum(per)} of {agents} controlled agents have fewer than {need} candidate "
            f"places and {LEFT_OUT} (every candidate shows their logged goal; the evaluator "
            f"does not count them); scenario (agents): {', '.join(named[:WARN_SCENARIOS])}{more}")


def env_task_pool(ctx: SimContext) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`task_pool` of the env's current pack (``ctx.pack``), computed once per pack:
    ``(places [S, C, M, 2] float32, count [S, C] int64; 0 = left out of the task)``. Needs
    ``goal_candidates`` >= 2."""
    return ctx.pack_fact(("candidate_pool", int(ctx.config.goal_candidates)), lambda pk: task_pool(pk, ctx.config))


def _controlled(pack, count: torch.Tensor) -> torch.Tensor:
    """[S, C] bool: the controlled slots of ``pack`` (``count`` [S, C] of :func:`candidate_pool`)."""
    C = count.shape[1]
    return torch.arange(C, device=count.device)[None, :] < pack.num_controlled.to(count.device)[:, None]


def _left_out(pack, count: torch.Tensor) -> torch.Tensor:
    """[S, C] bool: controlled slots of ``pack`` whose ``count`` (of :func:`candidate_pool`) is 0."""
    return _controlled(pack, count) & (count == 0)


def task_slots(ctx: SimContext, state: EnvState) -> torch.Tensor:
    """[W, C] bool: the active slots (``state.slot_active``) whose agent plays the memory task (at
    least ``goal_candidates`` places, :func:`task_pool`; the pool of the env's current pack,
    computed once per pack); every active slot when the task is off. The evaluator records only
    these (``train/eval/sweep.py``)."""
    G = int(ctx.config.goal_candidates)
    if G < 2:
        return state.slot_active.clone()
    return state.slot_active & (env_task_pool(ctx)[1][state.scenario] >= G)


def draw_candidates(ctx: SimContext, state: EnvState) -> EnvState:
    """``state`` (a new episode's start) with ``goal_cand``, ``cand_true`` and the true goal in
    ``goal`` for the controlled slots; unchanged (and nothing drawn) when the task is off.

    Draws one ``[W, C, M]`` and one ``[W, C]`` uniform from ``ctx.generator`` (module docstring).
    """
    cfg = ctx.config
    G = int(cfg.goal_candidates)
    if G < 2:
        return state
    places, count = env_task_pool(ctx)
    W, C = state.num_worlds, state.num_slots
    M = places.shape[2]
    s = state.scenario
    key = torch.rand((W, C, M), generator=ctx.generator, device=ctx.device)
    n = count[s]  # [W, C]
    key = torch.where(torch.arange(M, device=ctx.device) < n[..., None], key, torch.full_like(key, 2.0))
    order = key.argsort(dim=-1)[..., :G]  # a random subset of the places, in random order
    cand = places[s].gather(2, order[..., None].expand(W, C, G, 2))
    active = state.slot_active
    cand = torch.where(active[..., None, None], cand, torch.zeros_like(cand))
    u = torch.rand((W, C), generator=ctx.generator, device=ctx.device)
    true = (u * G).to(torch.int64).clamp(max=G - 1)
    true = torch.where(active, true, torch.zeros_like(true))
    true_goal = cand.gather(2, true[..., None, None].expand(W, C, 1, 2))[:, :, 0]
    if ctx.pack_fact(("left_out", G), lambda pk: bool(_left_out(pk, count).any())):
        # agents left out of the task (task_pool): every candidate is the logged goal
        out = active & (n < G)
        logged = state.goal[:, :C]
        true_goal = torch.where(out[..., None], logged, true_goal)
        cand = torch.where(out[..., None, None], logged[:, :, None, :].expand(W, C, G, 2), cand)
    if cfg.candidate_practice > 0:  # practice agents: every candidate shows the true goal
        practice = torch.rand((W, C), generator=ctx.generator, device=ctx.device) < cfg.candidate_practice
        cand = torch.where(practice[..., None, None], true_goal[:, :, None, :].expand(W, C, G, 2), cand)
    goal = state.goal.clone()
    goal[:, :C] = torch.where(active[..., None], true_goal, state.goal[:, :C])
    return state.replace(goal_cand=cand, cand_true=true, goal=goal)


def decoy_hit(ctx: SimContext, state: EnvState, in_play: torch.Tensor) -> torch.Tensor:
    """[W, C] bool: the slot was in play (``in_play`` [W, A]) and its centre is within
    ``goal_radius`` of a candidate that is not its true goal."""
    C, G = state.num_slots, state.goal_cand.shape[2]
    d = (state.pos[:, :C, None, :] - state.goal_cand).norm(dim=-1)  # [W, C, G]
    decoy = torch.arange(G, device=d.device) != state.cand_true[..., None]
    return in_play[:, :C] & ((d <= ctx.config.goal_radius) & decoy).any(dim=-1)


def decoys(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """Stage ``decoys`` (after ``rewards``): agents that reached a decoy in this step are stopped
    (speed 0, ``stopped``; not ``contact_stopped``, so no early truncation; no reward) and marked
    ``at_decoy`` until the trial ends. A slot that reached its true goal in the same step is left
    to the goal rules. ``StepResult.info["decoy_reached"]`` [W, C] bool marks the slots that reached
    a decoy in this step (the evaluator's per-trial decoy columns). Nothing when the task is off."""
    if ctx.config.goal_candidates < 2:
        return {}
    C = ctx.num_slots
    hit = decoy_hit(ctx, state, step.in_play) & ~step.goal_now[:, :C] & ~state.removed[:, :C]
    step.info["decoy_reached"] = hit
    pad = torch.zeros_like(state.stopped[:, C:])
    hit_a = torch.cat([hit, pad], dim=1)
    return {"stopped": state.stopped | hit_a, "speed": torch.where(hit_a, torch.zeros_like(state.speed), state.speed),
            "at_decoy": state.at_decoy | hit}


def candidate_block(state: EnvState) -> torch.Tensor:
    """[W, C, 3 G + 1] float32 observation block of the memory task: per candidate (in the
    episode's random order) its position in the ego frame and its distance, each / GOAL_SCALE,
    then ``at_decoy`` (1: stopped at a wrong candidate in this trial)."""
    C = state.num_slots
    rel = state.goal_cand - state.pos[:, :C, None, :]  # [W, C, G, 2]
    h = state.heading[:, :C, None]
    cos_h, sin_h = torch.cos(h), torch.sin(h)
    x = cos_h * rel[..., 0] + sin_h * rel[..., 1]
    y = -sin_h * rel[..., 0] + cos_h * rel[..., 1]
    dist = rel.norm(dim=-1)
    feats = torch.stack([x, y, dist], dim=-1).reshape(*rel.shape[:2], -1) / GOAL_SCALE
    return torch.cat([feats, state.at_decoy.to(torch.float32)[..., None]], dim=-1)
