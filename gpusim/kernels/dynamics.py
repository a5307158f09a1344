"""Vehicle dynamics: the action grid, the kinematic bicycle and its closed-loop inverse.

Actions (docs/design.md section 8; values as in PufferDrive's classic env):

* ``ACCEL_VALUES``: 7 accelerations, -4 ... 4 m/s^2 (-4, -2.667, -1.333, 0, 1.333, 2.667, 4).
* ``STEER_VALUES``: 13 steering angles evenly spaced over -1 ... 1 rad (step 1/6 rad). The
  steering angle ``delta`` enters the model through ``tan(delta)`` (front-wheel angle).
* Discrete joint index ``k = accel_idx * NUM_STEER + steer_idx`` in ``[0, 91)``, i.e.
  ``accel_idx = k // 13`` and ``steer_idx = k % 13`` (PufferDrive's order).
* Continuous actions ``[..., 2]`` in ``[-1, 1]``: ``accel = 4 * a[..., 0]`` m/s^2,
  ``steer = 1 * a[..., 1]`` rad.

Kinematic bicycle ("classic"), one step of ``dt`` seconds, for every agent with ``moving``:

    v'      = clip(v + a * dt, MIN_SPEED, MAX_SPEED)               (m/s)
    beta    = atan(0.5 * tan(delta))                               (slip angle at the box centre)
    omega   = v' * cos(beta) * tan(delta) / L                      (yaw rate, rad/s; L = box length)
    p'      = p + v' * dt * (cos(h + beta), sin(h + beta))
    h'      = wrap(h + omega * dt)                                 (wrapped to (-pi, pi])

This is PufferDrive's classic ``move_dynamics`` (position advanced with the *new* speed along
heading + slip, heading advanced with the new speed, the box length used as wheelbase, centre of
mass half-way) with three deliberate differences, all documented in ``docs/dynamics.md``:
PufferDrive's C code adds ``0.5 * a * dt`` to the speed (so its nominal +-4 m/s^2 act as
+-2 m/s^2) where we add ``a * dt`` so accelerations are in true units; PufferDrive approximates
the slip angle with ``tanh(0.5 tan delta)`` where we use the exact ``atan`` (they differ by at
most 0.011 rad at ``|delta| = 1``); and PufferDrive clips speed to +-100 m/s, letting the sign
flip back and forth around 0 (it recomputes speed as ``|velocity|``), where we clip to
``[0, 100]`` m/s: braking stops the car, it never reverses.

Inverse dynamics (:func:`inverse_bicycle`) is a closed-loop tracker: from the *simulated* state it
picks the controls that bring the agent closest to the next logged pose, with a braking-curve
speed plan so a lagging agent catches up without overshooting. See its docstring.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gpusim.backend import interpreting, normalize_device, op_backend
from gpusim.kernels import trimath
from gpusim.kernels.trimath import wrap_angle_torch

NUM_ACCEL = 7
NUM_STEER = 13
NUM_ACTIONS = NUM_ACCEL * NUM_STEER  # 91
MAX_ACCEL = 4.0  # m/s^2
MAX_STEER = 1.0  # rad
#: The 7 accelerations of the discrete grid (m/s^2), as in PufferDrive.
ACCEL_VALUES = (-4.0, -2.667, -1.333, 0.0, 1.333, 2.667, 4.0)
#: The 13 steering angles of the discrete grid (rad), evenly spaced over [-1, 1].
STEER_VALUES = tuple(round(-1.0 + i / 6.0, 6) for i in range(NUM_STEER))
#: Speed limits of the bicycle (m/s). 100 m/s as PufferDrive's MAX_SPEED; no reversing.
MIN_SPEED = 0.0
MAX_SPEED = 100.0
#: Lengths below this (m) are raised to it in the yaw-rate division (guards zero-size padding).
MIN_LENGTH = 0.1
#: Largest slip angle reachable with |delta| <= MAX_STEER: atan(0.5 tan 1) = 0.6616 rad.
MAX_BETA = math.atan(0.5 * math.tan(MAX_STEER))
#: Deceleration assumed by the tracker's catch-up speed plan (m/s^2), below MAX_ACCEL so the
#: discrete-time plan does not overshoot.
TRACK_DECEL = 0.5 * MAX_ACCEL
#: The tracker aims at least this far (m) ahead along the target heading (see inverse_bicycle).
TRACK_LOOKAHEAD = 0.2



def _block() -> int:
    """Elements per program: 256 on a GPU (2 per thread with 4 warps: no register spills; 1024 spilled
    on sm_90, tests/test_aot_compile.py), 1024 under the interpreter (~1 ms per program instance)."""
    return 1024 if interpreting() else 256


_TABLES: dict[torch.device, dict[str, torch.Tensor]] = {}


def action_tables(device: torch.device) -> dict[str, torch.Tensor]:
    """The action-grid constants as float32 tensors on ``device``, built once per device and cached
    (no host-to-device copy per step; docs/design.md section 3).

    Returns:
        ``{"accel": [7], "steer": [13]}`` (the grid values, m/s^2 and rad) and
        ``{"accel_of": [91], "steer_of": [91]}`` (the acceleration and steering of each joint index
        ``k = accel_idx * 13 + steer_idx``). Treat them as read-only.

    The cache key is the normalised device (:func:`gpusim.backend.normalize_device`:
    ``torch.device("cuda")`` and ``"cuda:0"`` share one entry when device 0 is current).
    """
    dev = normalize_device(device)
    tables = _TABLES.get(dev)
    if tables is None:
        accel = torch.tensor(ACCEL_VALUES, dtype=torch.float32)
        steer = torch.tensor(STEER_VALUES, dtype=torch.float32)
        k = torch.arange(NUM_ACTIONS)
        tables = {"accel": accel, "steer": steer, "accel_of": accel[k // NUM_STEER], "steer_of": steer[k % NUM_STEER]}
        tables = {name: t.to(dev) for name, t in tables.items()}
        _TABLES[dev] = tables
    return tables


# ----------------------------------------------------------------------------- action coding
def decode_actions(actions: torch.Tensor, action_space: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn policy actions into physical controls.

    Args:
        actions: discrete: [W, C] int32/int64 joint indices in ``[0, 91)``
            (``accel_idx * 13 + steer_idx``); continuous: [W, C, 2] float in [-1, 1]
            (acceleration, steering).
        action_space: ``gpusim.config.ActionSpace`` value (0 discrete, 1 continuous).

    Returns:
        ``(accel, steer)``: [W, C] float32, m/s^2 in [-4, 4] and rad in [-1, 1].

    Input is assumed validated (the env checks ranges and NaN); continuous values are still
    clipped to [-1, 1] and discrete indices clamped to the grid so that nothing can index out
    of bounds.

    Raises:
        ValueError: on a dtype/shape that does not match ``action_space``.
    """
    if int(action_space) == 0:
        if actions.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"decode_actions: discrete actions must be int32/int64, got {actions.dtype}")
        tables = action_tables(actions.device)
        k = actions.clamp(0, NUM_ACTIONS - 1)  # int32 or int64: both index directly
        return tables["accel_of"][k], tables["steer_of"][k]
    if int(action_space) == 1:
        if not actions.is_floating_point() or actions.shape[-1] != 2:
            raise ValueError(
                f"decode_actions: continuous actions must be float [..., 2], got {actions.dtype} {tuple(actions.shape)}"
            )
        a = actions.float().clamp(-1.0, 1.0)
        return a[..., 0] * MAX_ACCEL, a[..., 1] * MAX_STEER
    raise ValueError(f"decode_actions: unknown action_space {action_space!r}")


def encode_actions(accel: torch.Tensor, steer: torch.Tensor, action_space: int) -> torch.Tensor:
    """Inverse of :func:`decode_actions`: the action closest to the given controls.

    Args:
        accel: [W, C] float (m/s^2). steer: [W, C] float (rad).
        action_space: 0 discrete, 1 continuous.

    Returns:
        discrete: [W, C] int64 joint index of the nearest grid acceleration and the nearest grid
        steering (each axis rounded independently); continuous: [W, C, 2] float32
        ``(accel / 4, steer / 1)`` clipped to [-1, 1].

    Raises:
        ValueError: for an unknown ``action_space`` or mismatched shapes.
    """
    if accel.shape != steer.shape:
        raise ValueError(f"encode_actions: accel {tuple(accel.shape)} and steer {tuple(steer.shape)} differ")
    if int(action_space) == 0:
        tables = action_tables(accel.device)
        av, sv = tables["accel"], tables["steer"]
        ai = (accel.float()[..., None] - av).abs().argmin(-1)
        si = (steer.float()[..., None] - sv).abs().argmin(-1)
        return ai * NUM_STEER + si
    if int(action_space) == 1:
        return torch.stack(
            ((accel.float() / MAX_ACCEL).clamp(-1.0, 1.0), (steer.float() / MAX_STEER).clamp(-1.0, 1.0)), dim=-1
        )
    raise ValueError(f"encode_actions: unknown action_space {action_space!r}")


# ----------------------------------------------------------------------------- bicycle step
def bicycle_step_reference(pos, heading, speed, length, accel, steer, moving, dt: float):
    """One step of the kinematic bicycle (module docstring has the equations).

    Args:
        pos: [W, A, 2] float32 box-centre position (m).
        heading: [W, A] float32 heading (rad, CCW from +x).
        speed: [W, A] float32 speed (m/s, >= 0).
        length: [W, A] float32 box length (m), used as wheelbase (raised to ``MIN_LENGTH``).
        accel: [W, A] float32 acceleration (m/s^2), clipped to [-4, 4].
        steer: [W, A] float32 steering angle (rad), clipped to [-1, 1].
        moving: [W, A] bool; where False the state is returned unchanged (bit for bit).
        dt: time step (s).

    Returns:
        ``(pos [W, A, 2], heading [W, A], speed [W, A])`` float32, new tensors.
    """
    a = accel.clamp(-MAX_ACCEL, MAX_ACCEL)
    d = steer.clamp(-MAX_STEER, MAX_STEER)
    v = (speed + a * dt).clamp(MIN_SPEED, MAX_SPEED)
    tan_d = torch.tan(d)
    beta = torch.atan(0.5 * tan_d)
    omega = v * torch.cos(beta) * tan_d / length.clamp_min(MIN_LENGTH)
    theta = heading + beta
    step = v * dt
    new_pos = pos + torch.stack((step * torch.cos(theta), step * torch.sin(theta)), dim=-1)
    new_heading = wrap_angle_torch(heading + omega * dt)
    return (
        torch.where(moving[..., None], new_pos, pos),
        torch.where(moving, new_heading, heading),
        torch.where(moving, v, speed),
    )


@triton.jit
def _bicycle_step_kernel(
    pos_ptr, heading_ptr, speed_ptr, length_ptr, accel_ptr, steer_ptr, moving_ptr,
    out_pos_ptr, out_heading_ptr, out_speed_ptr,
    n, dt,
    MAX_ACCEL_C: tl.constexpr, MAX_STEER_C: tl.constexpr, MIN_SPEED_C: tl.constexpr,
    MAX_SPEED_C: tl.constexpr, MIN_LENGTH_C: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    m = offs < n
    px = tl.load(pos_ptr + 2 * offs, mask=m, other=0.0)
    py = tl.load(pos_ptr + 2 * offs + 1, mask=m, other=0.0)
    h = tl.load(heading_ptr + offs, mask=m, other=0.0)
    v0 = tl.load(speed_ptr + offs, mask=m, other=0.0)
    ln = tl.load(length_ptr + offs, mask=m, other=1.0)
    a = tl.load(accel_ptr + offs, mask=m, other=0.0)
    d = tl.load(steer_ptr + offs, mask=m, other=0.0)
    mv = tl.load(moving_ptr + offs, mask=m, other=0) != 0
    a = tl.minimum(tl.maximum(a, -MAX_ACCEL_C), MAX_ACCEL_C)
    d = tl.minimum(tl.maximum(d, -MAX_STEER_C), MAX_STEER_C)
    v = tl.minimum(tl.maximum(v0 + a * dt, MIN_SPEED_C), MAX_SPEED_C)
    tan_d = trimath.tan(d)
    beta = trimath.atan(0.5 * tan_d)
    omega = v * tl.cos(beta) * tan_d / tl.maximum(ln, MIN_LENGTH_C)
    theta = h + beta
    step = v * dt
    nx = px + step * tl.cos(theta)
    ny = py + step * tl.sin(theta)
    nh = trimath.wrap_angle(h + omega * dt)
    tl.store(out_pos_ptr + 2 * offs, tl.where(mv, nx, px), mask=m)
    tl.store(out_pos_ptr + 2 * offs + 1, tl.where(mv, ny, py), mask=m)
    tl.store(out_heading_ptr + offs, tl.where(mv, nh, h), mask=m)
    tl.store(out_speed_ptr + offs, tl.where(mv, v, v0), mask=m)


def _check_agent_tensors(fn: str, shape, device, named: dict, float_names=(), bool_names=(), pair_names=()):
    device = normalize_device(device)
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {name} must be a tensor")
        want = tuple(shape) + ((2,) if name in pair_names else ())
        if tuple(t.shape) != want:
            raise ValueError(f"{fn}: {name} has shape {tuple(t.shape)}, expected {want}")
        if normalize_device(t.device) != device:
            raise ValueError(f"{fn}: {name} is on {t.device}, expected {device}")
        if name in float_names and t.dtype != torch.float32:
            raise ValueError(f"{fn}: {name} must be float32, got {t.dtype}")
        if name in bool_names and t.dtype != torch.bool:
            raise ValueError(f"{fn}: {name} must be bool, got {t.dtype}")


def _bicycle_step_triton(pos, heading, speed, length, accel, steer, moving, dt: float):
    shape = heading.shape
    _check_agent_tensors(
        "bicycle_step", shape, heading.device,
        dict(pos=pos, heading=heading, speed=speed, length=length, accel=accel, steer=steer, moving=moving),
        float_names=("pos", "heading", "speed", "length", "accel", "steer"), bool_names=("moving",),
        pair_names=("pos",),
    )
    pos_c, h_c, v_c, l_c, a_c, s_c = (t.contiguous() for t in (pos, heading, speed, length, accel, steer))
    mv = moving.contiguous().view(torch.uint8)
    out_pos = torch.empty_like(pos_c)
    out_h = torch.empty_like(h_c)
    out_v = torch.empty_like(v_c)
    n = h_c.numel()
    if n:
        block = _block()
        grid = (triton.cdiv(n, block),)
        _bicycle_step_kernel[grid](
            pos_c, h_c, v_c, l_c, a_c, s_c, mv, out_pos, out_h, out_v, n, float(dt),
            MAX_ACCEL_C=MAX_ACCEL, MAX_STEER_C=MAX_STEER, MIN_SPEED_C=MIN_SPEED, MAX_SPEED_C=MAX_SPEED,
            MIN_LENGTH_C=MIN_LENGTH, BLOCK=block,
        )
    return out_pos, out_h, out_v


def bicycle_step(pos, heading, speed, length, accel, steer, moving, dt: float, *, backend: str | None = None):
    """One step of the kinematic bicycle (module docstring has the equations).

    Args:
        pos: [W, A, 2] float32 box-centre position (m).
        heading: [W, A] float32 heading (rad, CCW from +x).
        speed: [W, A] float32 speed (m/s, >= 0).
        length: [W, A] float32 box length (m), used as wheelbase (raised to ``MIN_LENGTH``).
        accel: [W, A] float32 acceleration (m/s^2), clipped to [-4, 4].
        steer: [W, A] float32 steering angle (rad), clipped to [-1, 1].
        moving: [W, A] bool; where False the state is returned unchanged (bit for bit).
        dt: time step (s).
        backend: :func:`gpusim.backend.op_backend` (default from ``heading``): the Triton kernel
            under ``"triton"`` / ``"cupy"``, else the reference.

    Returns:
        ``(pos [W, A, 2], heading [W, A], speed [W, A])`` float32, new tensors.

    Raises (Triton backend): ValueError/TypeError on wrong shapes, dtypes or devices.
    """
    if op_backend(backend, heading) == "triton":
        return _bicycle_step_triton(pos, heading, speed, length, accel, steer, moving, dt)
    return bicycle_step_reference(pos, heading, speed, length, accel, steer, moving, dt)


# ----------------------------------------------------------------------------- inverse dynamics
def inverse_bicycle_reference(
    pos, heading, speed, length, target_pos, target_heading, target_speed, target_valid, dt: float
):
    """Closed-loop inverse dynamics: controls that drive the current state onto the next logged pose.

    For each agent, from its *simulated* state, the controls (|accel| <= 4 m/s^2,
    |steer| <= 1 rad) for one :func:`bicycle_step` towards the target pose:

    1. Aim point ``q = target_pos + u(target_heading) * max(0, TRACK_LOOKAHEAD - e)`` where
       ``e = (target_pos - pos) . u(target_heading)`` is how far the target lies ahead along its
       own heading: normally ``q`` is the target itself; when the agent is level with or ahead of
       the target it aims a little further along the logged path instead of turning around.
    2. Direction: exact inversion of the position update, which moves the centre along
       ``heading + beta``: ``beta = clip(wrap(angle(q - pos) - heading), +-MAX_BETA)`` and
       ``steer = atan(2 tan(beta))`` (the inverse of ``beta = atan(0.5 tan(steer))``).
    3. Speed: the distance to the target projected on the chosen direction, ``s``, needs
       ``v_hit = s / dt``. The gap beyond what the target's own speed covers,
       ``g = s - target_speed * dt``, is closed along a braking curve:
       ``v_des = target_speed + sign(g) * min(|g| / dt, sqrt(2 * TRACK_DECEL * |g|))``, so a
       lagging agent catches up at most as fast as it can later shed the extra speed (no
       overshoot/oscillation), and a small gap is closed in one step (exact inversion).
       ``accel = clip((v_des - speed) / dt, +-4)``.
    4. Invalid targets (``target_valid`` False, e.g. past the end of the log): accel 0, steer 0
       (the agent coasts straight at constant speed).

    Args:
        pos: [W, A, 2] float32 current position (m).
        heading: [W, A] float32 current heading (rad).
        speed: [W, A] float32 current speed (m/s).
        length: [W, A] float32 box length (m) (unused by this tracker: the slip-angle inversion
            does not depend on it; kept so a heading-aware tracker can use it).
        target_pos: [W, A, 2] float32 next logged position (m).
        target_heading: [W, A] float32 next logged heading (rad).
        target_speed: [W, A] float32 next logged speed (m/s).
        target_valid: [W, A] bool, the target is a valid logged step.
        dt: time step (s).

    Returns:
        ``(accel [W, A], steer [W, A])`` float32, within the action limits (continuous values;
        use :func:`encode_actions` to get policy actions).
    """
    ch = torch.cos(target_heading)
    sh = torch.sin(target_heading)
    dx = target_pos[..., 0] - pos[..., 0]
    dy = target_pos[..., 1] - pos[..., 1]
    ahead = dx * ch + dy * sh
    push = (TRACK_LOOKAHEAD - ahead).clamp_min(0.0)
    qx = dx + push * ch
    qy = dy + push * sh
    beta = wrap_angle_torch(torch.atan2(qy, qx) - heading).clamp(-MAX_BETA, MAX_BETA)
    steer = torch.atan(2.0 * torch.tan(beta))
    theta = heading + beta
    s = dx * torch.cos(theta) + dy * torch.sin(theta)
    g = s - target_speed * dt
    g_abs = g.abs()
    dv = torch.minimum(g_abs / dt, torch.sqrt(2.0 * TRACK_DECEL * g_abs))
    v_des = target_speed + torch.where(g < 0, -dv, dv)
    accel = ((v_des - speed) / dt).clamp(-MAX_ACCEL, MAX_ACCEL)
    zero = torch.zeros_like(accel)
    return torch.where(target_valid, accel, zero), torch.where(target_valid, steer.clamp(-MAX_STEER, MAX_STEER), zero)


@triton.jit
def _inverse_bicycle_kernel(
    pos_ptr, heading_ptr, speed_ptr, tpos_ptr, theading_ptr, tspeed_ptr, tvalid_ptr,
    out_accel_ptr, out_steer_ptr,
    n, dt,
    MAX_ACCEL_C: tl.constexpr, MAX_STEER_C: tl.constexpr, MAX_BETA_C: tl.constexpr,
    DECEL_C: tl.constexpr, LOOKAHEAD_C: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    m = offs < n
    px = tl.load(pos_ptr + 2 * offs, mask=m, other=0.0)
    py = tl.load(pos_ptr + 2 * offs + 1, mask=m, other=0.0)
    h = tl.load(heading_ptr + offs, mask=m, other=0.0)
    v = tl.load(speed_ptr + offs, mask=m, other=0.0)
    tx = tl.load(tpos_ptr + 2 * offs, mask=m, other=0.0)
    ty = tl.load(tpos_ptr + 2 * offs + 1, mask=m, other=0.0)
    th = tl.load(theading_ptr + offs, mask=m, other=0.0)
    tv = tl.load(tspeed_ptr + offs, mask=m, other=0.0)
    ok = tl.load(tvalid_ptr + offs, mask=m, other=0) != 0
    ch = tl.cos(th)
    sh = tl.sin(th)
    dx = tx - px
    dy = ty - py
    ahead = dx * ch + dy * sh
    push = tl.maximum(LOOKAHEAD_C - ahead, 0.0)
    qx = dx + push * ch
    qy = dy + push * sh
    beta = trimath.wrap_angle(trimath.atan2(qy, qx) - h)
    beta = tl.minimum(tl.maximum(beta, -MAX_BETA_C), MAX_BETA_C)
    steer = trimath.atan(2.0 * trimath.tan(beta))
    steer = tl.minimum(tl.maximum(steer, -MAX_STEER_C), MAX_STEER_C)
    theta = h + beta
    s = dx * tl.cos(theta) + dy * tl.sin(theta)
    g = s - tv * dt
    g_abs = tl.abs(g)
    dv = tl.minimum(g_abs / dt, tl.sqrt(2.0 * DECEL_C * g_abs))
    v_des = tv + tl.where(g < 0, -dv, dv)
    accel = tl.minimum(tl.maximum((v_des - v) / dt, -MAX_ACCEL_C), MAX_ACCEL_C)
    tl.store(out_accel_ptr + offs, tl.where(ok, accel, 0.0), mask=m)
    tl.store(out_steer_ptr + offs, tl.where(ok, steer, 0.0), mask=m)


def _inverse_bicycle_triton(pos, heading, speed, length, target_pos, target_heading, target_speed, target_valid, dt):
    shape = heading.shape
    _check_agent_tensors(
        "inverse_bicycle", shape, heading.device,
        dict(pos=pos, heading=heading, speed=speed, length=length, target_pos=target_pos,
             target_heading=target_heading, target_speed=target_speed, target_valid=target_valid),
        float_names=("pos", "heading", "speed", "length", "target_pos", "target_heading", "target_speed"),
        bool_names=("target_valid",), pair_names=("pos", "target_pos"),
    )
    ts = [t.contiguous() for t in (pos, heading, speed, target_pos, target_heading, target_speed)]
    ok = target_valid.contiguous().view(torch.uint8)
    accel = torch.empty_like(ts[1])
    steer = torch.empty_like(ts[1])
    n = accel.numel()
    if n:
        block = _block()
        grid = (triton.cdiv(n, block),)
        _inverse_bicycle_kernel[grid](
            *ts, ok, accel, steer, n, float(dt),
            MAX_ACCEL_C=MAX_ACCEL, MAX_STEER_C=MAX_STEER, MAX_BETA_C=MAX_BETA, DECEL_C=TRACK_DECEL,
            LOOKAHEAD_C=TRACK_LOOKAHEAD, BLOCK=block,
        )
    return accel, steer


def inverse_bicycle(pos, heading, speed, length, target_pos, target_heading, target_speed, target_valid, dt: float,
                    *, backend: str | None = None):
    """Closed-loop inverse dynamics: controls that drive the current state onto the next logged pose.

    For each agent, from its *simulated* state, the controls (|accel| <= 4 m/s^2,
    |steer| <= 1 rad) for one :func:`bicycle_step` towards the target pose:

    1. Aim point ``q = target_pos + u(target_heading) * max(0, TRACK_LOOKAHEAD - e)`` where
       ``e = (target_pos - pos) . u(target_heading)`` is how far the target lies ahead along its
       own heading: normally ``q`` is the target itself; when the agent is level with or ahead of
       the target it aims a little further along the logged path instead of turning around.
    2. Direction: exact inversion of the position update, which moves the centre along
       ``heading + beta``: ``beta = clip(wrap(angle(q - pos) - heading), +-MAX_BETA)`` and
       ``steer = atan(2 tan(beta))`` (the inverse of ``beta = atan(0.5 tan(steer))``).
    3. Speed: the distance to the target projected on the chosen direction, ``s``, needs
       ``v_hit = s / dt``. The gap beyond what the target's own speed covers,
       ``g = s - target_speed * dt``, is closed along a braking curve:
       ``v_des = target_speed + sign(g) * min(|g| / dt, sqrt(2 * TRACK_DECEL * |g|))``, so a
       lagging agent catches up at most as fast as it can later shed the extra speed (no
       overshoot/oscillation), and a small gap is closed in one step (exact inversion).
       ``accel = clip((v_des - speed) / dt, +-4)``.
    4. Invalid targets (``target_valid`` False, e.g. past the end of the log): accel 0, steer 0
       (the agent coasts straight at constant speed).

    Args:
        pos: [W, A, 2] float32 current position (m).
        heading: [W, A] float32 current heading (rad).
        speed: [W, A] float32 current speed (m/s).
        length: [W, A] float32 box length (m) (unused by this tracker: the slip-angle inversion
            does not depend on it; kept so a heading-aware tracker can use it).
        target_pos: [W, A, 2] float32 next logged position (m).
        target_heading: [W, A] float32 next logged heading (rad).
        target_speed: [W, A] float32 next logged speed (m/s).
        target_valid: [W, A] bool, the target is a valid logged step.
        dt: time step (s).
        backend: as :func:`bicycle_step`.

    Returns:
        ``(accel [W, A], steer [W, A])`` float32, within the action limits (continuous values;
        use :func:`encode_actions` to get policy actions).

    Raises (Triton backend): ValueError/TypeError on wrong shapes, dtypes or devices.
    """
    if op_backend(backend, heading) == "triton":
        return _inverse_bicycle_triton(
            pos, heading, speed, length, target_pos, target_heading, target_speed, target_valid, dt
        )
    return inverse_bicycle_reference(
        pos, heading, speed, length, target_pos, target_heading, target_speed, target_valid, dt
    )
