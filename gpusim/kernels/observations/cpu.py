"""Hand-written C kernel of the observations for the CPU (``cpu.c``), built at first use.

The torch backend's observation stage calls :func:`observations_cpu` by default
(``EnvConfig.cpu_kernels``, docs/performance.md "The CPU step"). It computes what
the torch reference (:func:`.naive.observations_reference`) computes, operation for operation, in
one loop nest per slot row (OpenMP over rows): same sort keys, hence the same partner and road
order, and bit-identical values (tests/test_observations_c.py).

Build (shared machinery in :mod:`gpusim.kernels.cbuild`): the first call compiles ``cpu.c`` with
the system C compiler (``$CC``, else ``cc``) and :data:`CFLAGS` plus ``-fopenmp`` (then without it
if that fails; the kernel is then
single-threaded), about 0.3-1 s. The shared library is cached under ``$XDG_CACHE_HOME/gpusim``
(default ``~/.cache/gpusim``), named by a hash of the source, the flags and the compiler, and
written through a temporary file and an atomic rename, so concurrent processes (parallel test
workers, torchrun ranks) never load a half-written file. Where no compiler exists or the build
fails, one ``RuntimeWarning`` names the reason and the torch reference runs instead (same results,
slower). No ``-march=native``: the cached library runs on any machine of the same architecture.

OpenMP: loaded after torch, the library binds to the ``libgomp.so.1`` torch already loaded, so it
shares torch's thread pool; each call uses ``torch.get_num_threads()`` threads.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import NamedTuple

import torch

from gpusim.kernels.cbuild import CFLAGS, CLibrary, cache_dir, check_index_range  # noqa: F401  (re-exported)
from gpusim.kernels.cbuild import CStruct, declare_struct_entry, define_lines, heading_trig
from gpusim.kernels.grid import grid_table_rows
from gpusim.kernels.obs_layout import EGO_EXTRA, GOAL_SCALE, SIZE_SCALE, SPEED_SCALE, kernel_layout
from gpusim.kernels.observations.naive import observations_reference
from gpusim.kernels.observations.tables import (EGO_INPUTS, GEO_COLS, ROAD_COLS, check_inputs, ego_extra, index_bits,
                                                 road_table)

#: Version of the C functions' argument structs (``gpusim_obs_abi()`` in cpu.c must return it).
ABI = 4
SOURCE = Path(__file__).with_name("cpu.c")

#: The constants both entry points take (sizes, sort-key index bits, the grid cell, squared radii and
#: their inverses, feature scales, threads; :func:`_kernel_constants`).
_CONSTANTS = """int64_t A, int64_t C, int64_t K, int64_t R, int64_t P, int abits, int rbits, float cell_size, float pr2,
    float inv_pr, float rr2, float inv_rr, float two_inv_rr, float speed_mul, float size_mul, float goal_div,
    int num_threads"""
#: C pointer types of the ego inputs' dtypes (:data:`~.tables.EGO_INPUTS`).
_C_TYPES = {torch.bool: "const uint8_t", torch.float32: "const float", torch.int32: "const int32_t",
            torch.int64: "const int64_t"}
#: The state entry's ego-input fields, one pointer per :data:`~.tables.EGO_INPUTS` entry, by name.
_EGO_INPUT_FIELDS = "".join(f"{_C_TYPES[dtype]} *{name}, " for name, (_, dtype, _) in EGO_INPUTS.items())
#: The argument structs of ``gpusim_observations`` and ``gpusim_observations_state`` (cpu.c; their C
#: twins are generated from these tables).
OBSERVATIONS_ARGS = CStruct("ObservationsArgs", """
    const float *pos, const float *cos_h, const float *sin_h, const float *speed, const float *length,
    const float *width, const int8_t *agent_type, const uint8_t *present, const float *goal, const float *extra,
    const uint8_t *active, const int64_t *scenario, const float *geo, const float *feat, const void *grid,
    int grid_is16, const int64_t *grid_start, const float *grid_origin, const int32_t *grid_dims,
    const int64_t *rows, int64_t n, float *out, int64_t out_stride, int64_t zero_tail, """ + _CONSTANTS)
OBSERVATIONS_STATE_ARGS = CStruct("ObservationsStateArgs", """
    const float *pos, const float *cos_h, const float *sin_h, const float *speed, const float *length,
    const float *width, const int8_t *agent_type, const uint8_t *present, const float *goal,
    """ + _EGO_INPUT_FIELDS + """const uint8_t *controlled, const uint8_t *written, uint8_t *written_out,
    const int64_t *scenario, const float *geo, const float *feat, const void *grid, int grid_is16,
    const int64_t *grid_start, const float *grid_origin, const int32_t *grid_dims, int64_t W, float *out,
    int64_t out_stride, int64_t zero_tail, """ + _CONSTANTS)


def _declare(lib) -> None:
    """ctypes signatures of cpu.c: one struct each (:data:`OBSERVATIONS_ARGS`,
    :data:`OBSERVATIONS_STATE_ARGS`), an int status returned."""
    declare_struct_entry(lib, "gpusim_observations", ctypes.c_int)
    declare_struct_entry(lib, "gpusim_observations_state", ctypes.c_int)


def generated_header() -> str:
    """The constants ``cpu.c`` takes from the layout (its ``gpusim_generated.h``): the kernel
    blocks' widths and the ego columns by feature name (:func:`~gpusim.kernels.obs_layout.kernel_layout`,
    ``EGO_<name>``), the road tables' widths (``tables.GEO_COLS``, ``ROAD_COLS``).

    Raises:
        ValueError: the ego extras not contiguous and in the order of ``EGO_EXTRA`` (the kernel
            copies them in one block).
    """
    lay = kernel_layout(1, 1)
    cols = {name.split("/")[0]: i for i, name in enumerate(lay.ego_features)}
    first = cols[EGO_EXTRA[0]]
    if [cols[n] for n in EGO_EXTRA] != list(range(first, first + len(EGO_EXTRA))):
        raise ValueError(f"observations_cpu: the ego extras {EGO_EXTRA} must be adjacent ego columns")
    consts = {"EGO_DIM": lay.ego_dim, "NEXTRA": len(EGO_EXTRA), "PDIM": lay.partner_dim, "RDIM": lay.road_dim,
              "GEO_COLS": GEO_COLS, "FEAT_COLS": ROAD_COLS}
    consts.update({f"EGO_{name}": i for name, i in cols.items()})
    return define_lines("", consts)


_LIB = CLibrary(name="obs_cpu", source=SOURCE, prefix="gpusim_obs", abi=ABI, declare=_declare,
                label="C observation kernel", generated=generated_header,
                structs=(OBSERVATIONS_ARGS, OBSERVATIONS_STATE_ARGS))


def load_library():
    """The loaded C library (built and cached on first use), or None when it cannot be built; the
    first failure warns once (``RuntimeWarning`` naming the reason)."""
    return _LIB.load(stacklevel=4)


def cpu_kernel_available() -> bool:
    """True when the C library is built and loaded (builds it on first call; warns once if not)."""
    return load_library() is not None


def cpu_kernel_status() -> dict:
    """``{"available": bool, "reason": str, "openmp": bool, "path": str | None}`` (builds on first call)."""
    return _LIB.status()


def forget_library() -> None:
    """Forget the loaded library and any build failure, so the next call builds/loads again (tests:
    a changed ``CC`` or cache directory). The already-loaded library stays mapped in the process."""
    _LIB.forget()


def _check_out_rows(out, rows, W: int, C: int, D: int, device) -> None:
    """``out`` [W, C, D] float32 with unit feature stride and any row stride >= D (a view of the
    first D columns of a wider buffer); ``rows`` 1-D int64 in ``[0, W*C)``."""
    if out is not None:
        if (tuple(out.shape) != (W, C, D) or out.dtype != torch.float32 or out.device != device
                or out.stride(2) != 1 or out.stride(1) < D or out.stride(0) != C * out.stride(1)):
            raise ValueError(f"observations: out must be float32 [W, C, D] = {(W, C, D)} on {device} with rows "
                             f"of stride >= D, got {out.dtype} {tuple(out.shape)} stride {out.stride()}")
    if rows is not None:
        if out is None:
            raise ValueError("observations: rows needs out (the slots not listed are left as they are in out)")
        if not isinstance(rows, torch.Tensor) or rows.dim() != 1 or rows.dtype != torch.int64:
            raise ValueError("observations: rows must be a 1-D int64 tensor of flat slot indices w * C + c")
        if rows.device != device:
            raise ValueError(f"observations: rows is on {rows.device}, pos on {device}")
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= W * C):
            raise ValueError(f"observations: rows must lie in [0, W*C = {W * C})")


def _trig_input(t, name: str, W: int, A: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype is not torch.float32 or t.shape != (W, A) or not t.is_cpu:
        raise ValueError(f"observations_cpu: {name} must be a CPU float32 tensor of shape {(W, A)}")
    return t.contiguous()


def _kernel_constants(A: int, C: int, K: int, R: int, P: int, cell_size, partner_radius, road_radius) -> dict:
    """The size and scale fields shared by both C entry points (:data:`_CONSTANTS`: sizes, sort-key
    index bits, the grid cell, squared radii and their inverses, feature scales), threads excluded."""
    pr, rr = float(partner_radius), float(road_radius)
    return dict(A=A, C=C, K=K, R=R, P=P, abits=index_bits(A), rbits=index_bits(K), cell_size=float(cell_size),
                pr2=pr * pr, inv_pr=1.0 / pr, rr2=rr * rr, inv_rr=1.0 / rr, two_inv_rr=2.0 * (1.0 / rr),
                speed_mul=1.0 / SPEED_SCALE, size_mul=1.0 / SIZE_SCALE, goal_div=GOAL_SCALE)


def observations_cpu(
    pos, heading, speed, length, width, agent_type, present, goal, ego_extra, ego_active, scenario,
    road_seg, road_type, grid_road, grid_origin, grid_dims, cell_size, num_partners, partner_radius,
    road_radius, out=None, rows=None, grid_start=None, zero_tail=0, cos_h=None, sin_h=None, check=True,
):
    """C implementation of :func:`gpusim.kernels.observations.observations` on CPU tensors (same
    arguments, result and errors; the full docstring is there), with one relaxation: ``out`` may
    be a view of the first D columns of a wider buffer (``full[..., :D]``: unit feature stride, any
    row stride >= D), which the kernel writes in place, so the traffic-signal stage can share the
    buffer without a copy. ``zero_tail``: that many columns after the D written ones in each
    written row are set to zero too (they must lie inside the row stride); the env uses it for an
    all-zero traffic-signal block when its scenarios have no signals. ``cos_h``, ``sin_h``: [W, A]
    float32 ``torch.cos/sin(heading)`` when the caller has them (else computed here). ``check``:
    False skips the argument checks (the env's observation stage on a state whose layout an
    earlier checked step established, ``gpusim.sim.context.StepVars.checked``; needs ``out``).

    Falls back to the torch reference (one warning) when the C library cannot be built.

    Raises:
        ValueError: as :func:`gpusim.kernels.observations.observations`; also on a CUDA tensor or
            ``rows`` outside ``[0, W*C)``.
    """
    inputs = dict(
        pos=pos, heading=heading, speed=speed, length=length, width=width, agent_type=agent_type,
        present=present, goal=goal, ego_extra=ego_extra, scenario=scenario, road_seg=road_seg,
        road_type=road_type, grid_road=grid_road, grid_origin=grid_origin, grid_dims=grid_dims,
        cell_size=cell_size, num_partners=num_partners, partner_radius=partner_radius,
        road_radius=road_radius, grid_start=grid_start,
    )
    W, A = heading.shape
    C, K = goal.shape[1], grid_road.shape[-1]
    zero_tail = int(zero_tail)
    if check or out is None:
        lay = check_inputs(**inputs, ego_active=ego_active, out=None, rows=None)
        if pos.device.type != "cpu":
            raise ValueError(f"observations_cpu: tensors must be on the CPU, got {pos.device}")
        D, P = lay.obs_dim, lay.num_partners
        _check_out_rows(out, rows, W, C, D, pos.device)
        if zero_tail < 0 or (zero_tail and (out is None or D + zero_tail > out.stride(1))):
            raise ValueError(f"observations_cpu: zero_tail = {zero_tail} columns do not fit in the rows of out")
    else:
        D, P = out.shape[2], int(num_partners)
    lib = load_library()
    if lib is None:
        if out is None or out.is_contiguous():
            return observations_reference(**inputs, ego_active=ego_active, out=out, rows=rows)
        tmp = out.contiguous()  # the reference writes contiguous buffers only
        observations_reference(**inputs, ego_active=ego_active, out=tmp, rows=rows)
        out.copy_(tmp)
        if zero_tail:
            wide = out.as_strided((W * C, zero_tail), (out.stride(1), 1), out.storage_offset() + D)
            wide.index_fill_(0, torch.arange(W * C) if rows is None else rows, 0.0)
        return out
    S, R = road_seg.shape[:2]
    if check:
        check_index_range(scenario, S, f"observations: scenario indices must lie in [0, S = {S})")
    obs = out if out is not None else torch.empty(W, C, D, device=pos.device, dtype=torch.float32)
    n = W * C if rows is None else rows.numel()
    if n == 0:
        return obs
    grid2, start = grid_table_rows(grid_road, grid_start, "observations: grid_road")
    geo, feat = road_table(road_seg, road_type)
    if cos_h is None or sin_h is None:
        cos_h, sin_h = torch.cos(heading), torch.sin(heading)
    elif check:
        cos_h = _trig_input(cos_h, "cos_h", W, A)
        sin_h = _trig_input(sin_h, "sin_h", W, A)
    rc = lib.gpusim_observations(OBSERVATIONS_ARGS(  # all checked contiguous above
        pos=pos, cos_h=cos_h, sin_h=sin_h, speed=speed, length=length, width=width, agent_type=agent_type,
        present=present, goal=goal, extra=ego_extra, active=ego_active, scenario=scenario, geo=geo, feat=feat,
        grid=grid2, grid_is16=int(grid2.dtype == torch.int16), grid_start=start, grid_origin=grid_origin,
        grid_dims=grid_dims, rows=rows, n=n, out=obs, out_stride=obs.stride(1), zero_tail=zero_tail,
        **_kernel_constants(A, C, K, R, P, cell_size, partner_radius, road_radius),
        num_threads=torch.get_num_threads()))
    if rc != 0:
        raise RuntimeError(f"observations_cpu: the C kernel returned {rc} (A={A}, K={K})")
    return obs


def _check_state_inputs(W: int, A: int, C: int, device, **named) -> dict:
    """Shapes/dtypes of :func:`observations_cpu_state`'s state inputs (the ego inputs by their
    :data:`~.tables.EGO_INPUTS` entries; a stage-computed one may be None); returns them contiguous."""
    kinds = {"W": (W,), "WA": (W, A), "WC": (W, C)}
    expect = {"goal": ((W, A, 2), torch.float32), "controlled": ((W, A), torch.bool),
              "written": ((W * C,), torch.bool),
              **{n: (kinds[kind], dtype) for n, (kind, dtype, _) in EGO_INPUTS.items()}}
    optional = {n for n, (_, _, field) in EGO_INPUTS.items() if field is None}
    for name, t in named.items():
        if t is None and name in optional:
            continue
        shape, dtype = expect[name]
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != dtype or t.device != device:
            got = f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"observations_cpu_state: {name} must be a {dtype} tensor of shape {shape} on "
                             f"{device}, got {got}")
        named[name] = t.contiguous()
    return named


def _check_state_call(pos, heading, speed, length, width, agent_type, present, goal, ego_inputs, controlled,
                      written, scenario, road_seg, road_type, grid_road, grid_origin, grid_dims, cell_size,
                      num_partners, partner_radius, road_radius, out, grid_start, zero_tail, cos_h, sin_h) -> tuple:
    """The argument checks of :func:`observations_cpu_state` (``check=True``): returns its state
    inputs ``(goal, ego_inputs, controlled, written, cos_h, sin_h)`` contiguous. Raises ValueError as
    documented there."""
    W, A = heading.shape
    if not isinstance(out, torch.Tensor) or out.dim() != 3:
        raise ValueError("observations_cpu_state: out is required (the env's [W, C, D] buffer or a column view)")
    C = out.shape[1]
    if not isinstance(ego_inputs, dict) or set(ego_inputs) != set(EGO_INPUTS):
        got = sorted(ego_inputs) if isinstance(ego_inputs, dict) else type(ego_inputs).__name__
        raise ValueError(f"observations_cpu_state: ego_inputs must name {sorted(EGO_INPUTS)} (tables.EGO_INPUTS), "
                         f"got {got}")
    fixed = _check_state_inputs(W, A, C, pos.device, goal=goal, controlled=controlled, written=written, **ego_inputs)
    goal, controlled, written = fixed.pop("goal"), fixed.pop("controlled"), fixed.pop("written")
    ego_inputs = fixed
    if pos.device.type != "cpu":
        raise ValueError(f"observations_cpu_state: tensors must be on the CPU, got {pos.device}")
    lay = check_inputs(pos=pos, heading=heading, speed=speed, length=length, width=width,
                       agent_type=agent_type, present=present, goal=goal[:, :C].contiguous(),
                       ego_extra=torch.empty(W, C, len(EGO_EXTRA)), ego_active=controlled[:, :C].contiguous(),
                       scenario=scenario,
                       road_seg=road_seg, road_type=road_type, grid_road=grid_road, grid_origin=grid_origin,
                       grid_dims=grid_dims, cell_size=cell_size, num_partners=num_partners,
                       partner_radius=partner_radius, road_radius=road_radius, out=None,
                       grid_start=grid_start)
    _check_out_rows(out, None, W, C, lay.obs_dim, pos.device)
    if zero_tail < 0 or (zero_tail and lay.obs_dim + zero_tail > out.stride(1)):
        raise ValueError(f"observations_cpu_state: zero_tail = {zero_tail} columns do not fit in the rows of out")
    check_index_range(scenario, road_seg.shape[0], f"observations: scenario indices must lie in [0, S = {road_seg.shape[0]})")
    if cos_h is not None and sin_h is not None:
        cos_h, sin_h = _trig_input(cos_h, "cos_h", W, A), _trig_input(sin_h, "sin_h", W, A)
    return goal, ego_inputs, controlled, written, cos_h, sin_h


def observations_cpu_state(
    pos, heading, speed, length, width, agent_type, present, goal, ego_inputs, controlled, written, scenario,
    road_seg, road_type, grid_road, grid_origin, grid_dims, cell_size, num_partners, partner_radius, road_radius,
    out, grid_start=None, zero_tail=0, cos_h=None, sin_h=None, check=True, static=None,
) -> torch.Tensor:
    """The env's observation stage (``gpusim.sim.observe``) in one C call, reading the state's own
    fields: what :func:`observations_cpu` computes with ``goal = goal[:, :C]``, ``ego_active =
    (controlled & present)[:, :C]``, ``ego_extra`` = :func:`~.tables.ego_extra` of ``ego_inputs``
    and ``rows`` = the slots in play or set in ``written``, with no torch op in between.

    Args (W worlds, A agents, C policy slots): as :func:`observations_cpu`, except
        goal: [W, A, 2] float32 (the state's field; the first C columns are read).
        ego_inputs: the :data:`~.tables.EGO_INPUTS` by name (:func:`~.tables.ego_inputs`):
            ``collided``, ``offroad`` [W, A] bool (the state's ``collided_now`` / ``offroad_now``),
            ``t_index``, ``t_time`` [W] float32 trial index / time in trial or None for 0 (no trial
            mode), ``last_reward`` [W, C] float32; each passed to the C kernel as its struct field.
        controlled: [W, A] bool (the state's field; a slot is
            controlled when its column is set, ``EnvState.slot_active``).
        written: [W*C] bool, slots whose rows may be non-zero (those not in play are zeroed).
        out: required, as in :func:`observations_cpu` (a column view of a wider buffer allowed).
        static: :func:`observations_cpu_static` of the same pack and config, or None (derived here).
    Returns:
        [W*C] bool, new tensor: the in-play flags (``ego_active`` flattened), which rows are non-zero now.
    Raises:
        ValueError: as :func:`observations_cpu`, naming the argument, when ``check`` is True.
    """
    W, A = heading.shape
    zero_tail = int(zero_tail)
    if check:
        goal, ego_inputs, controlled, written, cos_h, sin_h = _check_state_call(
            pos, heading, speed, length, width, agent_type, present, goal, ego_inputs, controlled, written,
            scenario, road_seg, road_type, grid_road, grid_origin, grid_dims, cell_size, num_partners,
            partner_radius, road_radius, out, grid_start, zero_tail, cos_h, sin_h)
    C = out.shape[1]
    lib = load_library()
    if lib is None:  # the torch reference through observations_cpu, with the classic inputs
        active = (controlled & present)[:, :C].contiguous()
        extra = ego_extra(ego_inputs, C)
        flat = active.view(-1)
        observations_cpu(pos=pos, heading=heading, speed=speed, length=length, width=width,
                         agent_type=agent_type, present=present, goal=goal[:, :C].contiguous(), ego_extra=extra,
                         ego_active=active, scenario=scenario, road_seg=road_seg, road_type=road_type,
                         grid_road=grid_road, grid_origin=grid_origin, grid_dims=grid_dims, cell_size=cell_size,
                         num_partners=num_partners, partner_radius=partner_radius, road_radius=road_radius,
                         out=out, rows=(flat | written).nonzero().squeeze(1), grid_start=grid_start,
                         zero_tail=zero_tail, cos_h=cos_h, sin_h=sin_h, check=False)
        return flat
    if static is None:
        static = observations_cpu_static(road_seg=road_seg, road_type=road_type, grid_road=grid_road,
                                         grid_start=grid_start, grid_origin=grid_origin, grid_dims=grid_dims,
                                         cell_size=cell_size, num_partners=num_partners,
                                         partner_radius=partner_radius, road_radius=road_radius, A=A, C=C)
    if cos_h is None or sin_h is None:  # shared with the contacts' C kernels while the headings are the same
        cos_h, sin_h = heading_trig(heading)
    # layout established by a checked call (or checked above)
    return state_call(lib, static, pos, cos_h, sin_h, speed, length, width, agent_type, present, goal, ego_inputs,
                      controlled, written, scenario, out, zero_tail)


def state_call(lib, static, pos, cos_h, sin_h, speed, length, width, agent_type, present, goal, ego_inputs, controlled,
               written, scenario, out, zero_tail: int) -> torch.Tensor:
    """The C state entry on arguments whose layout is established (:func:`observations_cpu_state`
    without its checks; ``lib``: the loaded library, ``static``: :func:`observations_cpu_static`);
    ``ego_inputs`` by name (each its struct field; a None one, the trial clock outside trial mode,
    passes NULL). Returns the [W*C] bool in-play flags.

    Raises:
        RuntimeError: the C kernel reports an error.
    """
    W, A = present.shape
    written_out = torch.empty(W * out.shape[1], dtype=torch.bool)
    rc = lib.gpusim_observations_state(static.args(
        pos=pos, cos_h=cos_h, sin_h=sin_h, speed=speed, length=length, width=width, agent_type=agent_type,
        present=present, goal=goal, **ego_inputs, controlled=controlled, written=written, written_out=written_out,
        scenario=scenario, W=W, out=out, out_stride=out.stride(1), zero_tail=int(zero_tail),
        num_threads=torch.get_num_threads()))
    if rc != 0:
        raise RuntimeError(f"observations_cpu_state: the C kernel returned {rc} (A={A}, K={static.K})")
    return written_out


class StateCallStatic(NamedTuple):
    """The fields of the C state entry's struct that depend only on the pack and the config
    (:func:`observations_cpu_static`), by name: ``pack_args`` (road tables, grid table and its
    layout flag, grid starts, origins and dims), ``constants`` (sizes, index bits, radii and
    scales, threads excluded) and ``K``; ``keep`` holds the tensors the pointers point into, so
    they live as long as this tuple; ``args``: the struct's packer with those fields set."""

    pack_args: dict
    constants: dict
    K: int
    keep: tuple
    args: object = None  # OBSERVATIONS_STATE_ARGS.bind(**pack_args, **constants)


def observations_cpu_static(road_seg, road_type, grid_road, grid_start, grid_origin, grid_dims, cell_size,
                            num_partners, partner_radius, road_radius, A: int, C: int) -> StateCallStatic:
    """What :func:`observations_cpu_state` derives from the pack and the config on every call,
    computed once (the env caches it per pack, ``SimContext.pack_fact``): pass it as ``static=``.
    Arguments as :func:`observations_cpu_state`'s; A, C: agent and policy slots.

    Raises:
        ValueError: a grid table of the wrong layout (``grid_table_rows``).
    """
    grid2, start = grid_table_rows(grid_road, grid_start, "observations: grid_road")
    geo, feat = road_table(road_seg, road_type)
    grid2, start = grid2.contiguous(), start.contiguous()
    K, R = grid_road.shape[-1], road_seg.shape[1]
    pack_args = dict(geo=geo.data_ptr(), feat=feat.data_ptr(), grid=grid2.data_ptr(),
                     grid_is16=int(grid2.dtype == torch.int16), grid_start=start.data_ptr(),
                     grid_origin=grid_origin.data_ptr(), grid_dims=grid_dims.data_ptr())
    constants = _kernel_constants(A, C, K, R, int(num_partners), cell_size, partner_radius, road_radius)
    return StateCallStatic(pack_args, constants, K, (geo, feat, grid2, start, grid_origin, grid_dims),
                           OBSERVATIONS_STATE_ARGS.bind(**pack_args, **constants))
