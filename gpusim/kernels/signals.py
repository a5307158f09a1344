"""Traffic signals per step: the signal observation block and the red-light violation test.

Both computations read the pack's signal tensors (docs/data.md, "Traffic signals"): for world
``w`` running scenario ``s = scenario[w]``, signal ``l < num_signals[s]`` has its stop point
``signal_pos[s, l]`` (m), the unit lane direction ``signal_dir[s, l]`` there ((0, 0) when the lane
is not in the map) and, at log step ``i = log_index[w]``, the state code ``signal_state[s, i, l]``
(:class:`gpusim.enums.SignalState`) where ``signal_valid[s, i, l]``. A log index outside ``[0, T)``
(a step past the end of the log) or a step without a logged state reads as ``UNKNOWN``: the
simulator does not invent signal states (docs/signals.md).

* :func:`signal_observations` writes, for each policy slot, the ``N`` nearest signals whose stop
  point lies within ``radius`` of the agent's centre, nearest first (exact distance ties by signal
  index), as ``N x 11`` features (:data:`gpusim.kernels.obs_layout.SIGNAL_FEATURES`): stop point
  in the ego frame divided by ``radius``, lane direction in the ego frame (cos, sin), the state
  one-hot over four groups (unknown / stop = red / caution = yellow / go = green), an arrow flag,
  a flashing flag, and the valid flag (last). Padding slots and inactive slots are all zero.
* :func:`red_light_violation` flags the slots whose centre crossed the stop line of a signal in a
  red state (:data:`gpusim.enums.RED_SIGNAL_STATES`: stop, arrow_stop) during the step: moving
  from behind the line (``(p - stop) . dir < 0``) to on or beyond it (``>= 0``), where the line is
  the perpendicular to ``dir`` through the stop point, limited to ``half_width`` on each side of
  it (measured at the crossing point), with the agent's heading within ``acos(min_cos)`` of
  ``dir``. This is the geometry of the traffic-light-violation metric of the Waymo Open Sim
  Agents Challenge (WOSAC, 2025), in our own formulation: WOSAC flags an object whose position
  passes the stop point along the controlled lane between two steps, while the lane nearest to the
  object is that lane and its signal is a red (solid or arrow). The pack stores no lane polylines
  per signal, so the "nearest lane is the controlled lane" condition is replaced by the lateral
  window and the heading condition (docs/signals.md discusses the difference).

Each has the torch reference (``*_reference``), the Triton kernel, the launcher and the public
dispatcher (docs/design.md section 3); the red-light test also has the C kernel of ``signals.c``
(:func:`red_light_cpu`, stage ``signals`` on the CPU: identical booleans).
"""

from __future__ import annotations

import math
import weakref
from pathlib import Path

import torch
import triton
import triton.language as tl

from gpusim.backend import WITH_C, op_backend
from gpusim.kernels.cbuild import STEP_LABEL, CLibrary, CStruct, check_index_range, checker, declare_struct_entry
from gpusim.kernels.clocks import log_index
from gpusim.enums import RED_SIGNAL_STATES, SignalState
from gpusim.kernels.checks import check_tensors
from gpusim.kernels.obs_layout import SIGNAL_FEATURES

#: Features per signal slot (the last is the valid flag).
SIGNAL_DIM = len(SIGNAL_FEATURES)
#: Half-length of the stop line on each side of the stop point (m): half a 3.5 m lane, so the
#: windows of two side-by-side lanes touch but do not overlap.
STOP_LINE_HALF_WIDTH = 1.75
#: The agent's heading must be within this angle of the lane direction to cross "forward" (rad).
STOP_LINE_MAX_ANGLE = math.radians(60.0)

_SIGNAL_DIM_C: tl.constexpr = tl.constexpr(SIGNAL_DIM)
_ARROW_STOP: tl.constexpr = tl.constexpr(int(SignalState.ARROW_STOP))
_ARROW_CAUTION: tl.constexpr = tl.constexpr(int(SignalState.ARROW_CAUTION))
_ARROW_GO: tl.constexpr = tl.constexpr(int(SignalState.ARROW_GO))
_STOP: tl.constexpr = tl.constexpr(int(SignalState.STOP))
_CAUTION: tl.constexpr = tl.constexpr(int(SignalState.CAUTION))
_GO: tl.constexpr = tl.constexpr(int(SignalState.GO))
_FLASHING_STOP: tl.constexpr = tl.constexpr(int(SignalState.FLASHING_STOP))
_FLASHING_CAUTION: tl.constexpr = tl.constexpr(int(SignalState.FLASHING_CAUTION))


# ----------------------------------------------------------------------------- shared torch pieces
def signal_state_at(scenario, log_index, signal_state, signal_valid) -> torch.Tensor:
    """[W, L] int64 state code of every signal slot of each world at its log index (``UNKNOWN``
    where the index is outside ``[0, T)`` or the log has no state); for torch code (render, tests).

    Args:
        scenario: [W] int64. log_index: [W] int. signal_state: [S, T, L] int8.
        signal_valid: [S, T, L] bool.
    """
    T = signal_state.shape[1]
    li = log_index.to(torch.int64)
    in_range = (li >= 0) & (li < T)
    i = li.clamp(0, T - 1)
    code = signal_state[scenario, i].to(torch.int64)
    ok = signal_valid[scenario, i] & in_range[:, None]
    return torch.where(ok, code, 0)


def _state_features(code: torch.Tensor) -> list[torch.Tensor]:
    """The six state features (unknown, stop, caution, go, arrow, flashing) of codes, as floats."""
    S = SignalState
    isin = lambda *vals: sum((code == int(v)).float() for v in vals)  # noqa: E731
    return [
        (code == int(S.UNKNOWN)).float(),
        isin(S.STOP, S.ARROW_STOP, S.FLASHING_STOP),
        isin(S.CAUTION, S.ARROW_CAUTION, S.FLASHING_CAUTION),
        isin(S.GO, S.ARROW_GO),
        isin(S.ARROW_STOP, S.ARROW_CAUTION, S.ARROW_GO),
        isin(S.FLASHING_STOP, S.FLASHING_CAUTION),
    ]


def _check(fn, pos, scenario, log_index, signal_pos, signal_dir, signal_state, signal_valid, num_signals, extra):
    """Shape/dtype/device/contiguity checks shared by both computations; returns (W, C, S, T, L)."""
    if not isinstance(pos, torch.Tensor) or pos.dim() != 3 or pos.shape[-1] != 2:
        raise ValueError(f"{fn}: pos must be a [W, C, 2] float32 tensor")
    W, C = pos.shape[:2]
    if not isinstance(signal_state, torch.Tensor) or signal_state.dim() != 3:
        raise ValueError(f"{fn}: signal_state must be a [S, T, L] int8 tensor")
    S, T, L = signal_state.shape
    if not isinstance(log_index, torch.Tensor) or tuple(log_index.shape) != (W,) or \
            log_index.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{fn}: log_index must be a [W] int32/int64 tensor")
    check_tensors(fn, [
        (pos, (W, C, 2), torch.float32, "pos"), (scenario, (W,), torch.int64, "scenario"),
        (log_index, (W,), log_index.dtype, "log_index"),
        (signal_pos, (S, L, 2), torch.float32, "signal_pos"), (signal_dir, (S, L, 2), torch.float32, "signal_dir"),
        (signal_state, (S, T, L), torch.int8, "signal_state"), (signal_valid, (S, T, L), torch.bool, "signal_valid"),
        (num_signals, (S,), torch.int32, "num_signals"),
    ] + [(t, shape(W, C), dtype, name) for t, shape, dtype, name in extra], pos.device)
    return W, C, S, T, L


# ----------------------------------------------------------------------------- observations
def signal_observations_reference(pos, heading, active, scenario, log_index, signal_pos, signal_dir, signal_state,
                                  signal_valid, num_signals, num_obs, radius, out=None, offset=0):
    """The signal block of the observations: the ``num_obs`` nearest signals of each slot.

    Args:
        pos: [W, C, 2] float32 agent centres (m). heading: [W, C] float32 (rad).
        active: [W, C] bool; inactive slots get an all-zero block.
        scenario: [W] int64. log_index: [W] int32/int64 log step of each world (any value).
        signal_pos, signal_dir: [S, L, 2] float32 stop points (m) and unit lane directions.
        signal_state: [S, T, L] int8 :class:`~gpusim.enums.SignalState` codes.
        signal_valid: [S, T, L] bool. num_signals: [S] int32 signals in use (prefix).
        num_obs: N >= 1 signal slots. radius: observation range (m) > 0, also the position scale.
        out: optional [W, C, D] float32 contiguous buffer; columns ``[offset, offset + N * 11)``
            are written (every one of them), the others are left alone. None: a new
            ``[W, C, N * 11]`` tensor (``offset`` must then be 0).
        offset: first column of the block in ``out``.

    Returns:
        ``out`` (or the new tensor); slot ``k`` of a row holds the features of
        :data:`~gpusim.kernels.obs_layout.SIGNAL_FEATURES` of its k-th nearest signal.

    Raises:
        ValueError: bad shapes, dtypes, devices, non-contiguous inputs, ``num_obs < 1``,
            ``radius <= 0`` or a block that does not fit in ``out``.
    """
    W, C, S, T, L, D = _check_obs(pos, heading, active, scenario, log_index, signal_pos, signal_dir, signal_state,
                                  signal_valid, num_signals, num_obs, radius, out, offset)
    N, F = int(num_obs), SIGNAL_DIM
    sp = signal_pos[scenario]                                   # [W, L, 2]
    rx = sp[:, None, :, 0] - pos[:, :, None, 0]                 # [W, C, L]
    ry = sp[:, None, :, 1] - pos[:, :, None, 1]
    d2 = rx * rx + ry * ry
    exists = torch.arange(L, device=pos.device)[None, :] < num_signals[scenario][:, None]  # [W, L]
    ok = exists[:, None, :] & (d2 <= float(radius) ** 2) & active[..., None]
    key = torch.where(ok, d2, torch.full_like(d2, float("inf")))
    order = torch.sort(key, dim=-1, stable=True).indices[..., :N]  # ties by signal index
    n_sel = order.shape[-1]
    sel_ok = torch.gather(ok, 2, order)
    h_c, h_s = torch.cos(heading)[..., None], torch.sin(heading)[..., None]
    sx, sy = torch.gather(rx, 2, order), torch.gather(ry, 2, order)
    sd = signal_dir[scenario]                                   # [W, L, 2]
    idx = order.reshape(W, C * n_sel)
    dx = torch.gather(sd[..., 0], 1, idx).view(W, C, n_sel)
    dy = torch.gather(sd[..., 1], 1, idx).view(W, C, n_sel)
    code = torch.gather(signal_state_at(scenario, log_index, signal_state, signal_valid), 1, idx).view(W, C, n_sel)
    inv_r = 1.0 / float(radius)
    feats = [(sx * h_c + sy * h_s) * inv_r, (sy * h_c - sx * h_s) * inv_r,
             dx * h_c + dy * h_s, dy * h_c - dx * h_s] + _state_features(code) + [torch.ones_like(sx)]
    block = torch.stack(feats, dim=-1) * sel_ok[..., None]       # [W, C, n_sel, F]
    if n_sel < N:
        block = torch.cat([block, block.new_zeros(W, C, N - n_sel, F)], dim=2)
    block = block.view(W, C, N * F)
    if out is None:
        return block.contiguous()
    out[..., offset: offset + N * F] = block
    return out


def _check_obs(pos, heading, active, scenario, log_index, signal_pos, signal_dir, signal_state, signal_valid,
               num_signals, num_obs, radius, out, offset):
    fn = "signal_observations"
    W, C, S, T, L = _check(fn, pos, scenario, log_index, signal_pos, signal_dir, signal_state, signal_valid,
                           num_signals, [(heading, lambda W, C: (W, C), torch.float32, "heading"),
                                         (active, lambda W, C: (W, C), torch.bool, "active")])
    if int(num_obs) < 1:
        raise ValueError(f"{fn}: num_obs must be >= 1, got {num_obs}")
    if not radius > 0:
        raise ValueError(f"{fn}: radius must be > 0, got {radius}")
    width = int(num_obs) * SIGNAL_DIM
    if out is None:
        if offset != 0:
            raise ValueError(f"{fn}: offset needs out")
        return W, C, S, T, L, width
    if out.dim() != 3 or tuple(out.shape[:2]) != (W, C) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"{fn}: out must be a contiguous float32 [W, C, D] = [{W}, {C}, D] tensor")
    if not 0 <= int(offset) <= out.shape[2] - width:
        raise ValueError(f"{fn}: {num_obs} slots x {SIGNAL_DIM} features at column {offset} do not fit in "
                         f"out's {out.shape[2]} columns")
    check_tensors(fn, [(out, tuple(out.shape), torch.float32, "out")], pos.device)
    return W, C, S, T, L, out.shape[2]


@triton.jit
def _state_group(code, ARROW_STOP: tl.constexpr, STOP: tl.constexpr, FLASHING_STOP: tl.constexpr):
    """1.0 where ``code`` is one of the three given codes (the -1 code never matches)."""
    return ((code == ARROW_STOP) | (code == STOP) | (code == FLASHING_STOP)).to(tl.float32)


@triton.jit
def _signal_obs_kernel(
    pos_ptr, heading_ptr, active_ptr, scenario_ptr, log_index_ptr,
    spos_ptr, sdir_ptr, sstate_ptr, svalid_ptr, nsig_ptr, out_ptr,
    NROWS, C, T, L, D, OFFSET, N, r2, inv_r,
    BLOCK_R: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_NF: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)   # [R]
    rm = rows < NROWS
    w = rows // C
    lane = tl.arange(0, BLOCK_L)                                             # [Lb]
    s = tl.load(scenario_ptr + w, mask=rm, other=0)
    li = tl.load(log_index_ptr + w, mask=rm, other=-1).to(tl.int64)
    act = tl.load(active_ptr + rows, mask=rm, other=0) != 0
    nsig = tl.load(nsig_ptr + s, mask=rm, other=0)
    px = tl.load(pos_ptr + 2 * rows, mask=rm, other=0.0)
    py = tl.load(pos_ptr + 2 * rows + 1, mask=rm, other=0.0)
    h = tl.load(heading_ptr + rows, mask=rm, other=0.0)
    hc = tl.cos(h)
    hs = tl.sin(h)

    m2 = rm[:, None] & (lane[None, :] < L)
    soff = s[:, None] * L + lane[None, :]                                    # [R, Lb]
    sx = tl.load(spos_ptr + 2 * soff, mask=m2, other=0.0)
    sy = tl.load(spos_ptr + 2 * soff + 1, mask=m2, other=0.0)
    rx = sx - px[:, None]
    ry = sy - py[:, None]
    d2 = rx * rx + ry * ry
    ok = m2 & (lane[None, :] < nsig[:, None]) & (d2 <= r2) & act[:, None]

    # rank of each valid signal among the row's valid signals: (d2, index) lexicographic
    d2i = d2[:, :, None]
    d2j = d2[:, None, :]
    before = ok[:, None, :] & ((d2j < d2i) | ((d2j == d2i) & (lane[None, None, :] < lane[None, :, None])))
    rank = tl.sum(before.to(tl.int32), axis=2)                              # [R, Lb]
    count = tl.minimum(tl.sum(ok.to(tl.int32), axis=1), N)                  # [R]
    keep = ok & (rank < N)

    # padding slots (k >= count): zeros, under a mask disjoint from the feature stores
    cols = tl.arange(0, BLOCK_NF)
    base = rows[:, None] * D + OFFSET
    pad = rm[:, None] & (cols[None, :] < N * _SIGNAL_DIM_C) & (cols[None, :] // _SIGNAL_DIM_C >= count[:, None])
    tl.store(out_ptr + base + cols[None, :], tl.zeros([BLOCK_R, BLOCK_NF], dtype=tl.float32), mask=pad)

    in_range = (li >= 0) & (li < T)
    i = tl.minimum(tl.maximum(li, 0), T - 1)
    toff = (s[:, None] * T + i[:, None]) * L + lane[None, :]
    lm = keep & in_range[:, None]
    code = tl.load(sstate_ptr + toff, mask=lm, other=0).to(tl.int32)
    valid = tl.load(svalid_ptr + toff, mask=lm, other=0) != 0
    code = tl.where(valid & in_range[:, None], code, 0)
    dx = tl.load(sdir_ptr + 2 * soff, mask=keep, other=0.0)
    dy = tl.load(sdir_ptr + 2 * soff + 1, mask=keep, other=0.0)

    o = out_ptr + base + rank * _SIGNAL_DIM_C
    tl.store(o + 0, (rx * hc[:, None] + ry * hs[:, None]) * inv_r, mask=keep)
    tl.store(o + 1, (ry * hc[:, None] - rx * hs[:, None]) * inv_r, mask=keep)
    tl.store(o + 2, dx * hc[:, None] + dy * hs[:, None], mask=keep)
    tl.store(o + 3, dy * hc[:, None] - dx * hs[:, None], mask=keep)
    tl.store(o + 4, (code == 0).to(tl.float32), mask=keep)
    tl.store(o + 5, _state_group(code, _ARROW_STOP, _STOP, _FLASHING_STOP), mask=keep)
    tl.store(o + 6, _state_group(code, _ARROW_CAUTION, _CAUTION, _FLASHING_CAUTION), mask=keep)
    tl.store(o + 7, _state_group(code, _ARROW_GO, _GO, -1), mask=keep)
    tl.store(o + 8, _state_group(code, _ARROW_STOP, _ARROW_CAUTION, _ARROW_GO), mask=keep)
    tl.store(o + 9, _state_group(code, _FLASHING_STOP, _FLASHING_CAUTION, -1), mask=keep)
    tl.store(o + 10, tl.full([BLOCK_R, BLOCK_L], 1.0, tl.float32), mask=keep)


def _signal_obs_triton(pos, heading, active, scenario, log_index, signal_pos, signal_dir, signal_state, signal_valid,
                       num_signals, num_obs, radius, out=None, offset=0):
    W, C, S, T, L, D = _check_obs(pos, heading, active, scenario, log_index, signal_pos, signal_dir, signal_state,
                                  signal_valid, num_signals, num_obs, radius, out, offset)
    N = int(num_obs)
    if out is None:
        out = torch.empty(W, C, N * SIGNAL_DIM, device=pos.device, dtype=torch.float32)
    rows = W * C
    if rows == 0:
        return out
    block_l = triton.next_power_of_2(max(L, 1))
    block_r = max(1, min(16, 4096 // (block_l * block_l)))
    _signal_obs_kernel[(triton.cdiv(rows, block_r),)](
        pos_ptr=pos,
        heading_ptr=heading,
        active_ptr=active.view(torch.int8),
        scenario_ptr=scenario,
        log_index_ptr=log_index.contiguous(),
        spos_ptr=signal_pos,
        sdir_ptr=signal_dir,
        sstate_ptr=signal_state,
        svalid_ptr=signal_valid.view(torch.int8),
        nsig_ptr=num_signals,
        out_ptr=out,
        NROWS=rows,
        C=C,
        T=T,
        L=L,
        D=D,
        OFFSET=int(offset),
        N=N,
        r2=float(radius) ** 2,
        inv_r=1.0 / float(radius),
        BLOCK_R=block_r,
        BLOCK_L=block_l,
        BLOCK_NF=triton.next_power_of_2(N * SIGNAL_DIM),
    )
    return out


def signal_observations(pos, heading, active, scenario, log_index, signal_pos, signal_dir, signal_state,
                        signal_valid, num_signals, num_obs, radius, out=None, offset=0, *, backend: str | None = None):
    """The signal block of the observations (same signature, result and errors as
    :func:`signal_observations_reference`, whose docstring has the shapes and units); ``backend``
    (:func:`gpusim.backend.op_backend`): the Triton kernel under ``"triton"`` / ``"cupy"``, else the
    torch reference."""
    fn = _signal_obs_triton if op_backend(backend, pos) == "triton" else signal_observations_reference
    return fn(pos=pos, heading=heading, active=active, scenario=scenario, log_index=log_index,
              signal_pos=signal_pos, signal_dir=signal_dir, signal_state=signal_state, signal_valid=signal_valid,
              num_signals=num_signals, num_obs=num_obs, radius=radius, out=out, offset=offset)


# ----------------------------------------------------------------------------- red-light violations
def red_light_violation_reference(pos_before, pos, heading, moving, scenario, log_index, signal_pos, signal_dir,
                                  signal_state, signal_valid, num_signals, half_width=STOP_LINE_HALF_WIDTH,
                                  min_cos=math.cos(STOP_LINE_MAX_ANGLE)):
    """Which slots crossed the stop line of a red signal during the step (module docstring).

    Args:
        pos_before: [W, C, 2] float32 centres at the start of the step (m).
        pos: [W, C, 2] float32 centres at the end of the step (m).
        heading: [W, C] float32 headings at the end of the step (rad).
        moving: [W, C] bool slots that took part in the step (in play); others are never flagged.
        scenario: [W] int64. log_index: [W] int32/int64 log step of the end of the step (the signal
            state read there; outside ``[0, T)`` = unknown, never red).
        signal_pos, signal_dir, signal_state, signal_valid, num_signals: the pack's signal tensors
            (see :func:`signal_observations_reference`).
        half_width: half-length of the stop line (m), default :data:`STOP_LINE_HALF_WIDTH`.
        min_cos: smallest cosine between the heading and the lane direction, default
            ``cos(STOP_LINE_MAX_ANGLE)``.

    Returns:
        [W, C] bool.

    Raises:
        ValueError: bad shapes, dtypes, devices or non-contiguous inputs.
    """
    W, C, S, T, L = _check_red(pos_before, pos, heading, moving, scenario, log_index, signal_pos, signal_dir,
                               signal_state, signal_valid, num_signals)
    sp, sd = signal_pos[scenario][:, None], signal_dir[scenario][:, None]      # [W, 1, L, 2]
    dx, dy = sd[..., 0], sd[..., 1]
    ax = pos_before[..., 0, None] - sp[..., 0]
    ay = pos_before[..., 1, None] - sp[..., 1]
    bx = pos[..., 0, None] - sp[..., 0]
    by = pos[..., 1, None] - sp[..., 1]
    s0 = ax * dx + ay * dy
    s1 = bx * dx + by * dy
    crossed = (s0 < 0.0) & (s1 >= 0.0)
    f = -s0 / torch.where(crossed, s1 - s0, torch.ones_like(s0))
    qx = ax + f * (bx - ax)
    qy = ay + f * (by - ay)
    lat = qy * dx - qx * dy
    hx, hy = torch.cos(heading)[..., None], torch.sin(heading)[..., None]
    aligned = hx * dx + hy * dy >= min_cos
    code = signal_state_at(scenario, log_index, signal_state, signal_valid)[:, None]  # [W, 1, L]
    red = torch.zeros_like(code, dtype=torch.bool)
    for v in RED_SIGNAL_STATES:
        red |= code == int(v)
    exists = (torch.arange(L, device=pos.device)[None, :] < num_signals[scenario][:, None])[:, None]
    hit = crossed & (lat.abs() <= half_width) & aligned & red & exists
    return hit.any(dim=-1) & moving


def _check_red(pos_before, pos, heading, moving, scenario, log_index, signal_pos, signal_dir, signal_state,
               signal_valid, num_signals):
    return _check("red_light_violation", pos, scenario, log_index, signal_pos, signal_dir, signal_state, signal_valid,
                  num_signals, [(pos_before, lambda W, C: (W, C, 2), torch.float32, "pos_before"),
                                (heading, lambda W, C: (W, C), torch.float32, "heading"),
                                (moving, lambda W, C: (W, C), torch.bool, "moving")])


@triton.jit
def _red_light_kernel(
    before_ptr, pos_ptr, heading_ptr, moving_ptr, scenario_ptr, log_index_ptr,
    spos_ptr, sdir_ptr, sstate_ptr, svalid_ptr, nsig_ptr, out_ptr,
    NROWS, C, T, L, half_width, min_cos,
    BLOCK_R: tl.constexpr, BLOCK_L: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
    rm = rows < NROWS
    w = rows // C
    lane = tl.arange(0, BLOCK_L)
    s = tl.load(scenario_ptr + w, mask=rm, other=0)
    li = tl.load(log_index_ptr + w, mask=rm, other=-1).to(tl.int64)
    mov = tl.load(moving_ptr + rows, mask=rm, other=0) != 0
    nsig = tl.load(nsig_ptr + s, mask=rm, other=0)
    x0 = tl.load(before_ptr + 2 * rows, mask=rm, other=0.0)
    y0 = tl.load(before_ptr + 2 * rows + 1, mask=rm, other=0.0)
    x1 = tl.load(pos_ptr + 2 * rows, mask=rm, other=0.0)
    y1 = tl.load(pos_ptr + 2 * rows + 1, mask=rm, other=0.0)
    h = tl.load(heading_ptr + rows, mask=rm, other=0.0)

    m2 = (rm & mov)[:, None] & (lane[None, :] < L) & (lane[None, :] < nsig[:, None])
    soff = s[:, None] * L + lane[None, :]
    sx = tl.load(spos_ptr + 2 * soff, mask=m2, other=0.0)
    sy = tl.load(spos_ptr + 2 * soff + 1, mask=m2, other=0.0)
    dx = tl.load(sdir_ptr + 2 * soff, mask=m2, other=0.0)
    dy = tl.load(sdir_ptr + 2 * soff + 1, mask=m2, other=0.0)
    ax = x0[:, None] - sx
    ay = y0[:, None] - sy
    bx = x1[:, None] - sx
    by = y1[:, None] - sy
    s0 = ax * dx + ay * dy
    s1 = bx * dx + by * dy
    crossed = (s0 < 0.0) & (s1 >= 0.0)
    f = -s0 / tl.where(crossed, s1 - s0, 1.0)
    qx = ax + f * (bx - ax)
    qy = ay + f * (by - ay)
    lat = qy * dx - qx * dy
    aligned = tl.cos(h)[:, None] * dx + tl.sin(h)[:, None] * dy >= min_cos

    in_range = (li >= 0) & (li < T)
    i = tl.minimum(tl.maximum(li, 0), T - 1)
    toff = (s[:, None] * T + i[:, None]) * L + lane[None, :]
    lm = m2 & in_range[:, None]
    code = tl.load(sstate_ptr + toff, mask=lm, other=0).to(tl.int32)
    valid = tl.load(svalid_ptr + toff, mask=lm, other=0) != 0
    red = valid & ((code == _STOP) | (code == _ARROW_STOP))
    hit = m2 & crossed & (tl.abs(lat) <= half_width) & aligned & red
    tl.store(out_ptr + rows, (tl.sum(hit.to(tl.int32), axis=1) > 0).to(tl.int8), mask=rm)


def _red_light_triton(pos_before, pos, heading, moving, scenario, log_index, signal_pos, signal_dir, signal_state,
                      signal_valid, num_signals, half_width=STOP_LINE_HALF_WIDTH,
                      min_cos=math.cos(STOP_LINE_MAX_ANGLE)):
    W, C, S, T, L = _check_red(pos_before, pos, heading, moving, scenario, log_index, signal_pos, signal_dir,
                               signal_state, signal_valid, num_signals)
    out = torch.empty(W, C, dtype=torch.int8, device=pos.device)
    rows = W * C
    if rows == 0:
        return out.bool()
    block_l = triton.next_power_of_2(max(L, 1))
    block_r = max(1, min(128, 4096 // block_l))
    _red_light_kernel[(triton.cdiv(rows, block_r),)](
        before_ptr=pos_before,
        pos_ptr=pos,
        heading_ptr=heading,
        moving_ptr=moving.view(torch.int8),
        scenario_ptr=scenario,
        log_index_ptr=log_index.contiguous(),
        spos_ptr=signal_pos,
        sdir_ptr=signal_dir,
        sstate_ptr=signal_state,
        svalid_ptr=signal_valid.view(torch.int8),
        nsig_ptr=num_signals,
        out_ptr=out,
        NROWS=rows,
        C=C,
        T=T,
        L=L,
        half_width=float(half_width),
        min_cos=float(min_cos),
        BLOCK_R=block_r,
        BLOCK_L=block_l,
    )
    return out.bool()


def red_light_violation(pos_before, pos, heading, moving, scenario, log_index, signal_pos, signal_dir, signal_state,
                        signal_valid, num_signals, half_width=STOP_LINE_HALF_WIDTH,
                        min_cos=math.cos(STOP_LINE_MAX_ANGLE), *, backend: str | None = None, check: bool = True):
    """Which slots crossed the stop line of a red signal during the step (same signature, result
    and errors as :func:`red_light_violation_reference`, whose docstring has the shapes and units).
    ``backend``: ``"torch"`` | ``"triton"`` | ``"c"`` (:func:`red_light_cpu`; ``check`` is its
    argument checks) | ``"cupy"`` (the Triton kernel), default :func:`gpusim.backend.op_backend`."""
    kw = dict(pos_before=pos_before, pos=pos, heading=heading, moving=moving, scenario=scenario, log_index=log_index,
              signal_pos=signal_pos, signal_dir=signal_dir, signal_state=signal_state, signal_valid=signal_valid,
              num_signals=num_signals, half_width=half_width, min_cos=min_cos)
    name = op_backend(backend, pos, WITH_C)
    if name == "c":
        return red_light_cpu(**kw, check=check)
    return (_red_light_triton if name == "triton" else red_light_violation_reference)(**kw)


def red_light_state(pos_before, pos, heading, moving, scenario, step, trial_start, init_steps: int, signal_pos,
                    signal_dir, signal_state, signal_valid, num_signals, *, backend: str | None = None,
                    check: bool = True):
    """Stage ``signals``' call: :func:`red_light_violation` of the first ``C`` agent slots of the
    state's ``pos`` [W, A, 2] and ``heading`` [W, A] (C = ``pos_before.shape[1]``) at the log index
    ``init_steps + (step - trial_start)`` ([W] int32 ``step``, ``trial_start``). On the C backend
    without checks and with no signal in any scenario it returns all False before building any
    of those inputs (what every kernel returns then).

    Returns:
        [W, C] bool. Raises: as :func:`red_light_violation`.
    """
    name = op_backend(backend, pos, WITH_C)
    W, C = pos_before.shape[:2]
    if name == "c" and not check and _no_signals(num_signals):
        return torch.zeros(W, C, dtype=torch.bool)
    return red_light_violation(pos_before, pos[:, :C].contiguous(), heading[:, :C].contiguous(), moving.contiguous(),
                               scenario, log_index(init_steps, step, trial_start), signal_pos, signal_dir, signal_state,
                               signal_valid, num_signals, backend=name, check=check)


def bind_red_light_state(backend: str | None, check: bool, init_steps: int, signal_pos, signal_dir, signal_state,
                         signal_valid, num_signals):
    """:func:`red_light_state` with the pack's signals (and ``backend``, ``check``, ``init_steps``)
    bound: returns ``fn(pos_before, pos, heading, moving, scenario, step, trial_start) -> [W, C]
    bool``. On the C backend without checks, where no scenario has a signal, ``fn`` returns all
    False at once (a host read of ``num_signals`` at binding: CPU tensors only)."""
    if backend == "c" and not check and _no_signals(num_signals):
        return lambda pos_before, *rest: torch.zeros(pos_before.shape[:2], dtype=torch.bool)
    return lambda pos_before, pos, heading, moving, scenario, step, trial_start: red_light_state(
        pos_before, pos, heading, moving, scenario, step, trial_start, init_steps, signal_pos, signal_dir,
        signal_state, signal_valid, num_signals, backend=backend, check=check)


# ---------------------------------------------------------------------------- C kernel (signals.c)
#: The argument struct of ``gpusim_red_light`` (signals.c; its C twin is generated from this table).
RED_LIGHT_ARGS = CStruct("RedLightArgs", """
    const float *pos_before, const float *pos, const float *cos_h, const float *sin_h, const uint8_t *moving,
    const int64_t *scenario, const int64_t *log_index, const float *signal_pos, const float *signal_dir,
    const int8_t *signal_state, const uint8_t *signal_valid, const int32_t *num_signals, uint8_t *out, int64_t W,
    int64_t C, int64_t T, int64_t L, int red0, int red1, float half_width, float min_cos, int num_threads""")


def _declare(lib) -> None:
    """ctypes signature of signals.c: one :data:`RED_LIGHT_ARGS` struct."""
    declare_struct_entry(lib, "gpusim_red_light")


#: signals.c, built at first use (:class:`gpusim.kernels.cbuild.CLibrary`).
LIBRARY = CLibrary(name="signals", source=Path(__file__).with_suffix(".c"), prefix="gpusim_signals", abi=2,
                   declare=_declare, label=STEP_LABEL, structs=(RED_LIGHT_ARGS,))

#: ``(weak reference, version, answer)`` of the last ``num_signals`` tensor :func:`_no_signals` read
_NO_SIGNALS: list = [None, -1, False]


def _no_signals(num_signals: torch.Tensor) -> bool:
    """True when no scenario has a signal: one host read per ``num_signals`` tensor (the same object
    and in-place version is not read again; a pack's tensor never changes)."""
    ref, version, answer = _NO_SIGNALS
    if ref is not None and ref() is num_signals and version == num_signals._version:
        return answer
    answer = num_signals.numel() == 0 or int(num_signals.max()) == 0
    _NO_SIGNALS[:] = [weakref.ref(num_signals), num_signals._version, answer]
    return answer


def red_light_cpu(pos_before, pos, heading, moving, scenario, log_index, signal_pos, signal_dir, signal_state,
                  signal_valid, num_signals, half_width=STOP_LINE_HALF_WIDTH, min_cos=math.cos(STOP_LINE_MAX_ANGLE),
                  cos_h=None, sin_h=None, out=None, check: bool = True) -> torch.Tensor:
    """The C kernel of :func:`red_light_violation` (same arguments and [W, C] bool result).
    ``cos_h``, ``sin_h`` [W, C] float32 ``torch.cos/sin(heading)`` when the caller has them;
    ``out`` [W, C] bool contiguous, every element overwritten; ``check=False`` skips the argument
    checks (``StepVars.checked``). Runs the reference where the library cannot be built.

    Raises:
        ValueError: a tensor of the wrong shape, dtype or device.
    """
    cc = checker(check)
    W, C = heading.shape
    S, T, L = signal_state.shape
    ins = [cc(t, "red_light", n, d, sh) for t, n, d, sh in (
        (pos_before, "pos_before", torch.float32, (W, C, 2)), (pos, "pos", torch.float32, (W, C, 2)),
        (heading, "heading", torch.float32, (W, C)), (moving, "moving", torch.bool, (W, C)),
        (scenario, "scenario", torch.int64, (W,)),
        (signal_pos, "signal_pos", torch.float32, (S, L, 2)), (signal_dir, "signal_dir", torch.float32, (S, L, 2)),
        (signal_state, "signal_state", torch.int8, (S, T, L)), (signal_valid, "signal_valid", torch.bool, (S, T, L)),
        (num_signals, "num_signals", torch.int32, (S,)),
    )]
    if tuple(log_index.shape) != (W,) or log_index.dtype not in (torch.int32, torch.int64):
        raise ValueError("red_light: log_index must be a [W] int32/int64 tensor")
    lib = LIBRARY.load(stacklevel=4)
    if lib is None:
        ref = red_light_violation_reference(*ins[:5], log_index, *ins[5:], half_width=half_width, min_cos=min_cos)
        return ref if out is None else out.copy_(ref)
    if out is None:
        out = torch.empty(W, C, dtype=torch.bool)
    elif out.dtype != torch.bool or tuple(out.shape) != (W, C) or not out.is_contiguous() or not out.is_cpu:
        raise ValueError(f"red_light: out must be a contiguous CPU bool tensor of shape {(W, C)}")
    if check:
        check_index_range(ins[4], S, f"red_light: scenario indices must lie in [0, S = {S})")
    c, s = (torch.cos(ins[2]), torch.sin(ins[2])) if cos_h is None or sin_h is None else (cos_h, sin_h)
    pb, p, _, mv, sc, sp, sd, st, sv, ns = ins
    red = [int(v) for v in RED_SIGNAL_STATES]
    li = log_index.to(torch.int64).contiguous()  # kept alive through the call
    c, s = c.contiguous(), s.contiguous()  # kept alive through the call
    lib.gpusim_red_light(RED_LIGHT_ARGS(
        pos_before=pb, pos=p, cos_h=c, sin_h=s, moving=mv, scenario=sc, log_index=li, signal_pos=sp, signal_dir=sd,
        signal_state=st, signal_valid=sv, num_signals=ns, out=out, W=W, C=C, T=T, L=L, red0=red[0], red1=red[1],
        half_width=half_width, min_cos=min_cos, num_threads=torch.get_num_threads()))
    return out
