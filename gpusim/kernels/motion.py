"""The motion of the policy slots in one step (stage ``motion``): who is in play, the decoded
actions and the dynamics model on the in-play slots, written into full ``[W, A]`` tensors.

* In play (``gpusim.state.in_play``): ``controlled & present & ~stopped & ~removed & ~world_done``;
  the loss mask is its first ``C`` columns.
* The controls: :func:`gpusim.kernels.dynamics.decode_actions` of the actions.
* The model's ``forward`` (``gpusim.sim.motion.DYNAMICS``; the kinematic bicycle
  :func:`gpusim.kernels.dynamics.bicycle_step` by default) moves the first ``C`` agent slots where
  they are in play; columns ``>= C`` (log-replayed agents) are copied unchanged.

Backends (``backend=`` of :func:`move_slots`): ``"torch"`` / ``"triton"`` run the in-play flags as
torch ops and the model's own dispatcher; ``"c"`` runs the C kernels of ``motion.c`` for the
kinematic bicycle (any other model: the C in-play flags, then the model's dispatcher):

* continuous actions: one C pass for the flags (:func:`in_play_cpu`), then the bicycle with the
  transcendental functions as the reference's torch ops (tan, atan, cos, sin on [W, C] tensors)
  and the rest in one C pass (:func:`bicycle_slots_cpu`);
* discrete actions: two C passes around torch's cos/sin of the new heading angle, with the
  steering's tan/atan/cos from per-action tables (:func:`motion_discrete_cpu`), only where those
  tables are exact on the machine (:func:`discrete_motion_tables`).

Same float32 operations in the same order (``-ffp-contract=off``): every output equals the
reference's bit for bit (tests/test_stages_c.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from gpusim.backend import WITH_C, op_backend
from gpusim.kernels import dynamics
from gpusim.kernels.cbuild import STEP_LABEL, CLibrary, CStruct, c_tensor, declare_struct_entry
from gpusim.kernels.trimath import PI, TWO_PI


def in_play_reference(controlled, present, stopped, removed, world_done, num_slots: int):
    """``(in_play [W, A] bool, loss_mask [W, C] bool)``: ``controlled & present & ~stopped &
    ~removed & ~world_done[:, None]`` and its first ``num_slots`` columns (contiguous)."""
    play = controlled & present & ~stopped & ~removed & ~world_done[:, None]
    return play, play[:, :num_slots].contiguous()


def move_slots(controlled, present, stopped, removed, world_done, pos, heading, speed, length, actions,
               action_space: int, dt: float, forward: Callable | None = None, *, backend: str | None = None,
               check: bool = True):
    """Stage ``motion``'s computation (module docstring).

    Args:
        controlled, present, stopped, removed: [W, A] bool. world_done: [W] bool.
        pos: [W, A, 2] float32 (m). heading, speed, length: [W, A] float32 (rad, m/s, m).
        actions: discrete [W, C] int64 joint indices; continuous [W, C, 2] float32 in [-1, 1].
        action_space: ``gpusim.config.ActionSpace`` value. dt: step (s).
        forward: the dynamics model's one-step dispatcher (keywords ``pos, heading, speed, length,
            accel, steer, moving, dt`` on [W, C] tensors and ``backend``, this call's ``backend``
            handed down); default the kinematic bicycle.
        backend: ``"torch"`` | ``"triton"`` | ``"c"`` | ``"cupy"`` (the Triton kernel), default
            :func:`gpusim.backend.op_backend`.
        check: False skips the C kernels' argument checks (``StepVars.checked``).

    Returns:
        ``(in_play [W, A] bool, loss_mask [W, C] bool, pos [W, A, 2], heading [W, A], speed [W, A])``,
        new tensors.

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device; an action tensor that does not
            match ``action_space``.
    """
    name = op_backend(backend, pos, WITH_C)
    forward = dynamics.bicycle_step if forward is None else forward
    C = actions.shape[1]
    bicycle_c = name == "c" and forward is dynamics.bicycle_step
    if bicycle_c and int(action_space) == 0 and discrete_motion_tables() is not None and LIBRARY.load(4) is not None:
        return motion_discrete_cpu(controlled, present, stopped, removed, world_done, pos, heading, speed, length,
                                   actions, dt, check=check)
    if name == "c":
        play, mask = in_play_cpu(controlled, present, stopped, removed, world_done, C, check=check)
    else:
        play, mask = in_play_reference(controlled, present, stopped, removed, world_done, C)
    accel, steer = dynamics.decode_actions(actions, int(action_space))
    if bicycle_c:
        pos, heading, speed = bicycle_slots_cpu(pos, heading, speed, length, accel.contiguous(), steer.contiguous(),
                                                mask, dt, check=check)
        return play, mask, pos, heading, speed
    p, h, v = forward(pos=pos[:, :C].contiguous(), heading=heading[:, :C].contiguous(),
                      speed=speed[:, :C].contiguous(), length=length[:, :C].contiguous(), accel=accel.contiguous(),
                      steer=steer.contiguous(), moving=mask, dt=dt, backend=backend)
    return (play, mask, torch.cat([p, pos[:, C:]], dim=1), torch.cat([h, heading[:, C:]], dim=1),
            torch.cat([v, speed[:, C:]], dim=1))


def bind_move_slots(backend: str | None, check: bool, action_space: int, dt: float, forward: Callable | None = None):
    """:func:`move_slots` with ``action_space``, ``dt``, the model's ``forward`` (and ``backend``,
    ``check``) bound: returns ``fn(controlled, present, stopped, removed, world_done, pos, heading,
    speed, length, actions)``. On the C backend without checks, for the kinematic bicycle with
    discrete actions and exact tables, it runs the two C passes directly."""
    direct_c = backend == "c" and not check and int(action_space) == 0
    # the tables (and their one-time host check) only where the direct C passes may use them: binding
    # happens at a first step, which on the Triton path must make no host sync (tests/test_syncs.py)
    tables = discrete_motion_tables() if direct_c else None
    classic = forward is None or forward is dynamics.bicycle_step
    lib = LIBRARY.load(stacklevel=4) if direct_c and classic and tables is not None else None
    if lib is None:
        return lambda *tensors: move_slots(*tensors, action_space, dt, forward, backend=backend, check=check)
    prepare, discrete, e, b = lib.gpusim_motion_prepare, lib.gpusim_motion_discrete, torch.empty, torch.bool
    beta_of = tables["beta_of"].data_ptr()
    per_action = dict(accel_of=tables["accel_of"].data_ptr(), tan_of=tables["tan_of"].data_ptr(),
                      cos_b_of=tables["cos_b_of"].data_ptr())
    n_act = dynamics.NUM_ACTIONS
    prepare_args = MOTION_PREPARE_ARGS.bind(beta_of=beta_of, num_actions=n_act)
    discrete_args = MOTION_DISCRETE_ARGS.bind(**per_action, num_actions=n_act, **_motion_constants(dt))

    def run(controlled, present, stopped, removed, world_done, pos, heading, speed, length, actions):
        W, A = present.shape
        C = actions.shape[1]
        threads = torch.get_num_threads()
        play, mask, theta = e(W, A, dtype=b), e(W, C, dtype=b), e(W, C)
        prepare(prepare_args(
            controlled=controlled, present=present, stopped=stopped, removed=removed, world_done=world_done,
            heading=heading, action=actions, in_play=play, loss_mask=mask, theta=theta, W=W, A=A, C=C,
            num_threads=threads))
        cos_t, sin_t = torch.cos(theta), torch.sin(theta)  # the reference's ops on the same [W, C] values
        out = (e(W, A, 2), e(W, A), e(W, A))
        discrete(discrete_args(
            pos=pos, heading=heading, speed=speed, length=length, action=actions, cos_t=cos_t, sin_t=sin_t,
            moving=mask, pos_out=out[0], heading_out=out[1], speed_out=out[2], W=W, A=A, C=C, num_threads=threads))
        return play, mask, out[0], out[1], out[2]
    run.keep = tables  # the bound pointers point into these
    return run


# ---------------------------------------------------------------------------- C kernels (motion.c)
#: The argument structs of motion.c's entry points (their C twins are generated from these tables).
IN_PLAY_ARGS = CStruct("InPlayArgs", """
    const uint8_t *controlled, const uint8_t *present, const uint8_t *stopped, const uint8_t *removed,
    const uint8_t *world_done, uint8_t *in_play, uint8_t *loss_mask, int64_t W, int64_t A, int64_t C,
    int num_threads""")
MOTION_ARGS = CStruct("MotionArgs", """
    const float *pos, const float *heading, const float *speed, const float *length, const float *accel,
    const float *tan_d, const float *cos_b, const float *cos_t, const float *sin_t, const uint8_t *moving,
    float *pos_out, float *heading_out, float *speed_out, int64_t W, int64_t A, int64_t C, float dt,
    float max_accel, float min_speed, float max_speed, float min_length, float pi, float two_pi, int num_threads""")
MOTION_PREPARE_ARGS = CStruct("MotionPrepareArgs", """
    const uint8_t *controlled, const uint8_t *present, const uint8_t *stopped, const uint8_t *removed,
    const uint8_t *world_done, const float *heading, const int64_t *action, const float *beta_of, uint8_t *in_play,
    uint8_t *loss_mask, float *theta, int64_t W, int64_t A, int64_t C, int64_t num_actions, int num_threads""")
MOTION_DISCRETE_ARGS = CStruct("MotionDiscreteArgs", """
    const float *pos, const float *heading, const float *speed, const float *length, const int64_t *action,
    const float *accel_of, const float *tan_of, const float *cos_b_of, const float *cos_t, const float *sin_t,
    const uint8_t *moving, float *pos_out, float *heading_out, float *speed_out, int64_t W, int64_t A, int64_t C,
    int64_t num_actions, float dt, float max_accel, float min_speed, float max_speed, float min_length, float pi,
    float two_pi, int num_threads""")


def _declare(lib) -> None:
    """ctypes signatures of motion.c: one struct each."""
    for symbol in ("gpusim_in_play", "gpusim_motion", "gpusim_motion_prepare", "gpusim_motion_discrete"):
        declare_struct_entry(lib, symbol)


def _motion_constants(dt: float) -> dict:
    """The step and the bicycle model's limits, the struct fields both motion passes share."""
    return dict(dt=dt, max_accel=dynamics.MAX_ACCEL, min_speed=dynamics.MIN_SPEED, max_speed=dynamics.MAX_SPEED,
                min_length=dynamics.MIN_LENGTH, pi=PI, two_pi=TWO_PI)


#: motion.c, built at first use (:class:`gpusim.kernels.cbuild.CLibrary`).
LIBRARY = CLibrary(name="motion", source=Path(__file__).with_suffix(".c"), prefix="gpusim_motion", abi=2,
                   declare=_declare, label=STEP_LABEL,
                   structs=(IN_PLAY_ARGS, MOTION_ARGS, MOTION_PREPARE_ARGS, MOTION_DISCRETE_ARGS))


def in_play_cpu(controlled, present, stopped, removed, world_done, num_slots: int, check: bool = True):
    """The C kernel of :func:`in_play_reference` (one pass; new contiguous tensors, equal).

    Args:
        controlled, present, stopped, removed: [W, A] bool. world_done: [W] bool. num_slots: C <= A.
        check: False skips the argument checks (``StepVars.checked``).

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device; C outside [0, A].
    """
    W, A = present.shape
    C = int(num_slots)
    if not 0 <= C <= A:
        raise ValueError(f"in_play: num_slots must lie in [0, {A}], got {num_slots}")
    b = torch.bool
    ins = [controlled, present, stopped, removed, world_done] if not check else [
        c_tensor(t, "in_play", n, b, sh) for t, n, sh in (
            (controlled, "controlled", (W, A)), (present, "present", (W, A)), (stopped, "stopped", (W, A)),
            (removed, "removed", (W, A)), (world_done, "world_done", (W,)))]
    lib = LIBRARY.load(stacklevel=4)
    if lib is None:
        return in_play_reference(*ins, C)
    play, mask = torch.empty(W, A, dtype=b), torch.empty(W, C, dtype=b)
    controlled, present, stopped, removed, world_done = ins
    lib.gpusim_in_play(IN_PLAY_ARGS(controlled=controlled, present=present, stopped=stopped, removed=removed,
                                    world_done=world_done, in_play=play, loss_mask=mask, W=W, A=A, C=C,
                                    num_threads=torch.get_num_threads()))
    return play, mask


def bicycle_slots_cpu(pos, heading, speed, length, accel, steer, moving, dt: float, check: bool = True):
    """:func:`gpusim.kernels.dynamics.bicycle_step` of the first ``C`` agent slots, returned as full
    tensors: equal to the reference on ``t[:, :C]`` with columns >= C copied, bit for bit. The
    transcendental functions run as the reference's torch ops on the same [W, C] values; the rest
    (clamps, speed, yaw rate, position, wrapped heading, the ``moving`` select) is one C pass.

    Args:
        pos: [W, A, 2] float32 (m). heading, speed, length: [W, A] float32 (rad, m/s, m).
        accel, steer: [W, C] float32 controls (m/s^2, rad), C <= A. moving: [W, C] bool.
        dt: step (s). check: False skips the argument checks (``StepVars.checked``).

    Returns:
        ``(pos [W, A, 2], heading [W, A], speed [W, A])`` float32, new tensors.

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device.
    """
    W, A = heading.shape
    C = accel.shape[1] if accel.dim() == 2 else -1
    if not 0 <= C <= A:
        raise ValueError(f"bicycle_slots: accel must be [W, C] with C <= {A}, got {tuple(accel.shape)}")
    f32 = torch.float32
    if check:
        pos, heading, speed, length = (c_tensor(t, "bicycle_slots", n, f32, sh) for t, n, sh in (
            (pos, "pos", (W, A, 2)), (heading, "heading", (W, A)), (speed, "speed", (W, A)),
            (length, "length", (W, A))))
        accel = c_tensor(accel, "bicycle_slots", "accel", f32, (W, C))
        steer = c_tensor(steer, "bicycle_slots", "steer", f32, (W, C))
        moving = c_tensor(moving, "bicycle_slots", "moving", torch.bool, (W, C))
    lib = LIBRARY.load(stacklevel=4)
    if lib is None:
        p2, h2, v2 = dynamics.bicycle_step_reference(pos[:, :C], heading[:, :C], speed[:, :C], length[:, :C],
                                                     accel, steer, moving, dt)
        return (torch.cat([p2, pos[:, C:]], 1), torch.cat([h2, heading[:, C:]], 1),
                torch.cat([v2, speed[:, C:]], 1))
    # the reference's transcendental ops, on the same [W, C] values
    tan_d = torch.tan(steer.clamp(-dynamics.MAX_STEER, dynamics.MAX_STEER))
    beta = torch.atan(0.5 * tan_d)
    cos_b = torch.cos(beta)
    theta = heading[:, :C] + beta
    cos_t, sin_t = torch.cos(theta), torch.sin(theta)
    out = (torch.empty(W, A, 2), torch.empty(W, A), torch.empty(W, A))
    lib.gpusim_motion(MOTION_ARGS(
        pos=pos, heading=heading, speed=speed, length=length, accel=accel, tan_d=tan_d, cos_b=cos_b, cos_t=cos_t,
        sin_t=sin_t, moving=moving, pos_out=out[0], heading_out=out[1], speed_out=out[2], W=W, A=A, C=C,
        **_motion_constants(dt), num_threads=torch.get_num_threads()))
    return out


_MOTION_TABLES: list = []  # [tables or None], built once per process


def discrete_motion_tables() -> dict | None:
    """Per-action float32 tables [91] of the discrete motion: ``accel_of`` (m/s^2), ``tan_of``
    (tan of the clamped steering angle), ``beta_of`` (slip angle ``atan(0.5 tan)``, rad),
    ``cos_b_of`` (its cosine), computed with the reference's torch ops
    (:func:`gpusim.kernels.dynamics.bicycle_step_reference`) on the decoded table values.

    A table value equals the reference's per-agent value only if torch returns the same float for
    an element wherever it sits in a tensor (its CPU kernels run a vectorised body and a scalar
    tail, which may differ in the last bit on some machines). That is checked here once: each op on
    the table alone, element by element, and shifted by every offset 0..39. Returns None when any
    value depends on its position (the caller then runs the per-agent ops)."""
    if _MOTION_TABLES:
        return _MOTION_TABLES[0]
    tables = dynamics.action_tables(torch.device("cpu"))
    ops = (lambda x: torch.tan(x.clamp(-dynamics.MAX_STEER, dynamics.MAX_STEER)),
           lambda x: torch.atan(0.5 * x), torch.cos)
    values, x = [], tables["steer_of"]
    for op in ops:
        y = op(x)
        same = all(torch.equal(op(torch.cat([torch.zeros(k), x]))[k:], y) for k in range(40))
        same = same and all(torch.equal(op(x[i:i + 1]), y[i:i + 1]) for i in range(x.numel()))
        if not same:
            _MOTION_TABLES.append(None)
            return None
        values.append(y)
        x = y
    tan_of, beta_of, cos_b_of = values
    out = {"accel_of": tables["accel_of"].contiguous(), "tan_of": tan_of.contiguous(),
           "beta_of": beta_of.contiguous(), "cos_b_of": cos_b_of.contiguous()}
    _MOTION_TABLES.append(out)
    return out


def motion_discrete_cpu(controlled, present, stopped, removed, world_done, pos, heading, speed, length, actions,
                        dt: float, check: bool = True):
    """:func:`move_slots` of the kinematic bicycle with discrete actions in two C passes around
    torch's cos/sin: equals :func:`in_play_cpu` followed by :func:`bicycle_slots_cpu` on
    ``dynamics.decode_actions(actions, 0)`` moving the in-play slots, bit for bit (the tan/atan/cos
    of the steering from :func:`discrete_motion_tables`).

    Args:
        as :func:`move_slots` (``actions`` [W, C] int64, clamped to [0, 91) as ``decode_actions``
        does); check: False skips the argument checks (``StepVars.checked``).

    Returns:
        ``(in_play [W, A] bool, loss_mask [W, C] bool, pos [W, A, 2], heading [W, A], speed [W, A])``,
        new tensors.

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device; no library or no exact tables on
            this machine (:func:`move_slots` then takes the per-agent path).
    """
    tables = discrete_motion_tables()
    lib = LIBRARY.load(stacklevel=4)
    if tables is None or lib is None:
        raise ValueError("motion_discrete: needs the C library and position-independent tables "
                         "(motion.LIBRARY, discrete_motion_tables())")
    W, A = present.shape
    C = actions.shape[1] if actions.dim() == 2 else -1
    if not 0 <= C <= A:
        raise ValueError(f"motion_discrete: actions must be [W, C] with C <= {A}, got {tuple(actions.shape)}")
    if check:
        b, f32 = torch.bool, torch.float32
        controlled, present, stopped, removed = (c_tensor(t, "motion_discrete", n, b, (W, A)) for t, n in (
            (controlled, "controlled"), (present, "present"), (stopped, "stopped"), (removed, "removed")))
        world_done = c_tensor(world_done, "motion_discrete", "world_done", b, (W,))
        pos = c_tensor(pos, "motion_discrete", "pos", f32, (W, A, 2))
        heading, speed, length = (c_tensor(t, "motion_discrete", n, f32, (W, A)) for t, n in (
            (heading, "heading"), (speed, "speed"), (length, "length")))
        actions = c_tensor(actions, "motion_discrete", "actions", torch.int64, (W, C))
    return bind_move_slots("c", False, 0, dt)(controlled, present, stopped, removed, world_done, pos, heading, speed,
                                              length, actions)
