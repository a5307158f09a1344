"""The partner task (``EnvConfig.partner_task = "crossing"``, docs/trial.md): a scripted partner
whose type is hidden until it is too late to react, drawn per world per episode.

**The scene.** The task's ego is the one controlled agent of the world (slot 0; the config asks for
``max_controlled = 1``, which is also what ``train/evaluate.py --mode human_replay`` builds). Its
*conflict place* ``P`` is its logged position at the first log step ``t_c`` at least
:data:`DECIDE_STEPS` after ``init_steps`` where its logged speed is at least :data:`MIN_SPEED`,
with :data:`AFTER_STEPS` of the trial left after it. A scripted car (the *partner*, length
:data:`PARTNER_LENGTH`, width :data:`PARTNER_WIDTH`) drives a straight line through ``P`` at right
angles to the ego's logged heading there, from the ego's right to its left, at :data:`APPROACH_SPEED`.
It takes the last agent slot (``A - 1``) of every world whose scenario has such a place (an object
the log had there is left out of that world); a world without a place has no partner and plays its
log. The ego's goal, the log replay of every other agent and the rewards are those of the plain env.

**The types** (``EnvState.partner_type`` [W] int8, index into :data:`PARTNER_TYPES`), one per world,
drawn at every episode start (non-yielder with probability ``EnvConfig.partner_type_prob``, one
``[W]`` uniform from the env's generator), kept across the trials of the episode, never observed.
With ``tau`` = seconds since the ego's logged arrival at ``P`` (log step ``t_c``; the world's log
clock) and ``s`` the partner's signed distance along its
line (0 at ``P``):

* ``yielder`` (type 0): approaches like the other type until ``tau = -REVEAL_S``, then brakes at
  :data:`YIELD_DECEL` to a stop before the ego's path, waits until ``tau = GO_S`` (the logged ego
  has passed ``P``) and drives on at :data:`GO_ACCEL` up to the approach speed: it crosses ``P``
  about 1.7 s after the logged ego.
* ``non_yielder`` (type 1): keeps its speed, ``s = APPROACH_SPEED * tau``: it is at ``P`` exactly
  when the logged ego is.

Both types are the same car on the same line at the same speed until ``tau = -REVEAL_S`` (0.8 s
before the logged ego reaches ``P``); from then on a driver at the logged pace cannot brake enough
(``MAX_ACCEL`` 4 m/s^2) to let a non-yielder pass. **The best response**: against a yielder, drive
at the logged pace (arriving late meets the yielder crossing behind the logged ego); against a
non-yielder, arrive about 1 s late (it has crossed by then) and catch up afterwards. The scripted
references in ``train/baselines.py``: ``partner_ceiling`` (told the type, plays that) and
``partner_floor`` (log tracking, the best response to a yielder, whatever the type).

Off (``partner_task = "none"``, the default) nothing is drawn and no stage changes anything.
"""

from __future__ import annotations

import math

import torch

from gpusim.config import DT, ObjectType
from gpusim.sim.context import SimContext, StepVars
from gpusim.sim.random_start import log_origin
from gpusim.state import EnvState

#: Names of the partner types, by ``EnvState.partner_type`` value.
PARTNER_TYPES = ("yielder", "non_yielder")
#: The partner's box (m): a mid-size car.
PARTNER_LENGTH, PARTNER_WIDTH = 4.5, 1.9
#: The partner's speed on its approach and after crossing (m/s).
APPROACH_SPEED = 7.0
#: Both types look the same until this many seconds before the logged ego reaches P.
REVEAL_S = 0.8
#: The yielder's braking (m/s^2; a hard stop) and its pull-away acceleration after the wait (m/s^2).
YIELD_DECEL, GO_ACCEL = 9.0, 3.0
#: The yielder waits until this many seconds after the logged ego reached P.
GO_S = 0.3
#: The conflict place: at least this many log steps after ``init_steps`` (time to decide), the
#: logged speed there at least this (m/s), and at least ``AFTER_STEPS`` of the trial left after it.
DECIDE_STEPS, MIN_SPEED, AFTER_STEPS = 20, 3.0, 45


def partner_distance(tau: torch.Tensor, kind: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The partner's signed distance ``s`` (m, 0 at P, negative before it) and speed (m/s) along its
    line at ``tau`` seconds after the logged ego's arrival at P.

    Args:
        tau: [W] float32 seconds. kind: [W] int8 partner type (:data:`PARTNER_TYPES`).

    Returns:
        ``(s, speed)`` [W] float32 each. The yielder's profile: constant speed, then a stop from
        ``-REVEAL_S`` at ``YIELD_DECEL`` (stopping distance ``v^2 / (2 a)``), standing until ``GO_S``,
        then ``GO_ACCEL`` up to ``APPROACH_SPEED`` (elementary constant-acceleration kinematics).
    """
    v = APPROACH_SPEED
    ny_s = v * tau
    s_reveal = -v * REVEAL_S
    t_stop = v / YIELD_DECEL
    s_stop = s_reveal + v * v / (2.0 * YIELD_DECEL)
    dt_brake = (tau + REVEAL_S).clamp(0.0, t_stop)
    braking_s = s_reveal + v * dt_brake - 0.5 * YIELD_DECEL * dt_brake * dt_brake
    t_go = (tau - GO_S).clamp_min(0.0)
    t_acc = v / GO_ACCEL
    acc_t = t_go.clamp(max=t_acc)
    going_s = s_stop + 0.5 * GO_ACCEL * acc_t * acc_t + v * (t_go - acc_t)
    y_s = torch.where(tau < -REVEAL_S, ny_s, torch.where(tau < GO_S, braking_s, going_s))
    y_v = torch.where(tau < -REVEAL_S, torch.full_like(tau, v),
                      torch.where(tau < GO_S, v - YIELD_DECEL * dt_brake, GO_ACCEL * acc_t))
    yielder = kind == 0
    return torch.where(yielder, y_s, ny_s), torch.where(yielder, y_v, torch.full_like(tau, v))


def conflict_places(pack, cfg) -> dict:
    """Per scenario of ``pack``: the conflict place of its first controlled agent (module docstring).

    Returns:
        ``{"has": [S] bool, "place": [S, 2] float32 (m), "dir": [S, 2] float32 (the partner's unit
        direction of travel: the ego's logged heading there turned left by 90 degrees),
        "t_c": [S] int64 log step}`` on the pack's device (host computation, once per pack).
    """
    pos = pack.traj_pos[:, 0].detach().cpu()
    heading = pack.traj_heading[:, 0].detach().cpu()
    speed = torch.linalg.vector_norm(pack.traj_vel[:, 0].detach().cpu(), dim=-1)
    valid = pack.traj_valid[:, 0].detach().cpu() & (pack.num_controlled.detach().cpu() >= 1)[:, None]
    S, T = valid.shape
    k = torch.arange(T)
    last = min(T - 1, cfg.init_steps + cfg.scenario_length - AFTER_STEPS)
    ok = valid & (speed >= MIN_SPEED) & (k >= cfg.init_steps + DECIDE_STEPS) & (k <= last)
    has = ok.any(dim=1)
    t_c = torch.where(has, ok.to(torch.float32).argmax(dim=1), torch.zeros(S, dtype=torch.int64))
    s = torch.arange(S)
    h = heading[s, t_c] + math.pi / 2
    dev = pack.traj_pos.device
    return {"has": has.to(dev), "place": pos[s, t_c].to(dev),
            "dir": torch.stack([torch.cos(h), torch.sin(h)], dim=-1).to(dev), "t_c": t_c.to(dev)}


def _places(ctx: SimContext) -> dict:
    return ctx.pack_fact("partner_conflict_places", lambda pk: conflict_places(pk, ctx.config))


def _pose(ctx: SimContext, state: EnvState, log_step: torch.Tensor) -> dict:
    """The changes that put every world's partner (slot ``A - 1``) at world log step ``log_step`` [W]."""
    f = _places(ctx)
    sc = state.scenario
    has = f["has"][sc]
    tau = (log_step - f["t_c"][sc]).to(torch.float32) * DT
    s, v = partner_distance(tau, state.partner_type)
    d = f["dir"][sc]
    a = state.pos.shape[1] - 1
    pos, heading, speed, present = state.pos.clone(), state.heading.clone(), state.speed.clone(), state.present.clone()
    pos[:, a] = torch.where(has[:, None], f["place"][sc] + s[:, None] * d, pos[:, a])
    heading[:, a] = torch.where(has, torch.atan2(d[:, 1], d[:, 0]), heading[:, a])
    speed[:, a] = torch.where(has, v, speed[:, a])
    present[:, a] = torch.where(has, ~state.removed[:, a], present[:, a])
    return {"pos": pos, "heading": heading, "speed": speed, "present": present}


def begin_partner(ctx: SimContext, state: EnvState) -> EnvState:
    """``state`` (a new episode's start) with the partner types drawn and the partners placed at the
    start; unchanged (nothing drawn) when the task is off. One ``[W]`` uniform from ``ctx.generator``."""
    cfg = ctx.config
    if cfg.partner_task == "none":
        return state
    W = state.num_worlds
    kind = (torch.rand(W, generator=ctx.generator, device=ctx.device) < cfg.partner_type_prob).to(torch.int8)
    state = state.replace(partner_type=kind)
    has = _places(ctx)["has"][state.scenario]
    a = state.pos.shape[1] - 1
    length, width, agent_type = state.length.clone(), state.width.clone(), state.agent_type.clone()
    length[:, a] = torch.where(has, torch.full_like(length[:, a], PARTNER_LENGTH), length[:, a])
    width[:, a] = torch.where(has, torch.full_like(width[:, a], PARTNER_WIDTH), width[:, a])
    agent_type[:, a] = torch.where(has, torch.full_like(agent_type[:, a], int(ObjectType.VEHICLE)), agent_type[:, a])
    removed = state.removed.clone()
    removed[:, a] = torch.where(has, torch.zeros_like(removed[:, a]), removed[:, a])
    state = state.replace(length=length, width=width, agent_type=agent_type, removed=removed)
    start = (cfg.init_steps + state.start_offset).to(torch.int64)
    return state.replace(**_pose(ctx, state, start))


def partner(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """Stage ``partner`` (after ``replay``): moves each world's partner to the world's current log
    step (``init_steps + step - log origin``, the replay's clock). Changes ``pos``, ``heading``,
    ``speed``, ``present`` of slot ``A - 1`` in the worlds with a conflict place; ``{}`` when off."""
    if ctx.config.partner_task == "none":
        return {}
    log_step = (ctx.config.init_steps + state.step - log_origin(ctx, state)).to(torch.int64)
    return _pose(ctx, state, log_step)


def conflict_log_step(ctx: SimContext, state: EnvState) -> tuple[torch.Tensor, torch.Tensor]:
    """``(has [W] bool, t_c [W] int64)``: whether each world has a partner, and the log step at
    which its logged ego reaches the conflict place (for the scripted references)."""
    f = _places(ctx)
    return f["has"][state.scenario], f["t_c"][state.scenario]
