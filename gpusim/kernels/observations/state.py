"""The env's partner/road observation from the state's own fields, on every backend:
:func:`observations_state` (stage ``observe``'s one call).

It computes what :func:`gpusim.kernels.observations.observations` computes with the classic
inputs built from the state (the in-play slots ``(controlled & present)[:, :C]``, the goal slots
``goal[:, :C]``, the ego extras built from the ego inputs, :func:`~.tables.ego_extra` of
:data:`~.tables.EGO_INPUTS`), written only where it can change:

* ``"c"``: :func:`gpusim.kernels.observations.cpu.observations_cpu_state`, one C call;
* ``"triton"``: the Triton kernel with ``written`` (a slot neither in play nor written before
  returns at once: no host sync);
* ``"torch"``: the reference on the in-play rows (``nonzero``: no sync on the CPU), the rows that
  left play zeroed; a column view ``out`` goes through a contiguous scratch buffer kept in
  ``scratch`` (the reference writes contiguous buffers only).
"""

from __future__ import annotations

import torch

from gpusim.backend import WITH_C, op_backend
from gpusim.kernels.cbuild import heading_trig
from gpusim.kernels.observations.cpu import (cpu_kernel_available, load_library, observations_cpu_state,
                                              observations_cpu_static, state_call)
from gpusim.kernels.observations.launcher import observations_triton
from gpusim.kernels.observations.naive import observations_reference
from gpusim.kernels.observations.tables import ego_extra


def observations_state(pos, heading, speed, length, width, agent_type, present, goal, ego_inputs, controlled, written,
                       scenario, road_seg, road_type, grid_road, grid_origin, grid_dims, cell_size, num_partners,
                       partner_radius, road_radius, out, grid_start=None, zero_tail: int = 0, *,
                       backend: str | None = None, check: bool = True, static=None,
                       scratch: dict | None = None) -> torch.Tensor:
    """The partner/road block of the state's observation written into ``out`` (module docstring).

    Args (W worlds, A agents, C policy slots): as
        :func:`~gpusim.kernels.observations.cpu.observations_cpu_state`: ``goal`` [W, A, 2],
        ``ego_inputs`` the :data:`~.tables.EGO_INPUTS` by name (:func:`~.tables.ego_inputs`:
        ``collided`` / ``offroad`` [W, A] bool, the state's ``*_now``; ``t_index`` / ``t_time`` [W]
        float32 or None (0); ``last_reward`` [W, C]), ``controlled`` [W, A], ``written`` [W*C] bool
        (the rows that may be non-zero), ``out`` [W, C, D] float32 (a column view of a wider
        buffer allowed). zero_tail: columns after the first D that the C kernel zeroes in the rows
        it writes, in the same pass (the env: the signal block of a pack without signals); the
        other backends leave them alone (see the result's second entry).
        backend: ``"torch"`` | ``"triton"`` | ``"c"`` | ``"cupy"`` (the Triton kernel), default
            :func:`gpusim.backend.op_backend`.
        check: the C kernel's argument checks. static: its per-pack arguments
            (``observations_cpu_static``), a function of no argument returning them (called on
            the C backend only), or None.
        scratch: a dict the torch path keeps its contiguous buffer in between calls (None: a new
            one per call).

    Returns:
        ``(observed, tail_zeroed)``: [W*C] bool, the slots observed now (in play; every other row
        of ``out`` is zero), and whether the ``zero_tail`` columns were zeroed (the C kernel).

    Raises:
        ValueError: as the kernels, naming the argument.
    """
    name = op_backend(backend, pos, WITH_C)
    if name == "c" and cpu_kernel_available():
        return observations_cpu_state(
            pos=pos, heading=heading, speed=speed, length=length, width=width, agent_type=agent_type,
            present=present, goal=goal, ego_inputs=ego_inputs, controlled=controlled, written=written,
            scenario=scenario, road_seg=road_seg,
            road_type=road_type, grid_road=grid_road, grid_start=grid_start, grid_origin=grid_origin,
            grid_dims=grid_dims, cell_size=cell_size, num_partners=num_partners, partner_radius=partner_radius,
            road_radius=road_radius, out=out, zero_tail=zero_tail, check=check,
            static=static() if callable(static) else static), zero_tail > 0
    C = out.shape[1]
    active = (controlled[:, :C] & present[:, :C]).contiguous()
    kw = dict(pos=pos, heading=heading, speed=speed, length=length, width=width, agent_type=agent_type,
              present=present, goal=goal[:, :C].contiguous(), ego_active=active, scenario=scenario,
              ego_extra=ego_extra(ego_inputs, C),
              road_seg=road_seg, road_type=road_type, grid_road=grid_road, grid_start=grid_start,
              grid_origin=grid_origin, grid_dims=grid_dims, cell_size=cell_size, num_partners=num_partners,
              partner_radius=partner_radius, road_radius=road_radius)
    flat = active.view(-1)
    if name == "triton":
        observations_triton(**kw, out=out, written=written)
    else:
        _reference_rows(kw, flat, written, out, scratch)
    return flat, False


def bind_observations_state(backend: str | None, check: bool, road_seg, road_type, grid_road, grid_origin, grid_dims,
                            cell_size: float, num_partners: int, partner_radius: float, road_radius: float,
                            grid_start=None, static=None):
    """:func:`observations_state` with the pack's road tables and the config (and ``backend``,
    ``check``, ``static``) bound: returns ``fn(pos, heading, speed, length, width, agent_type,
    present, goal, ego_inputs, controlled, written, scenario, out, zero_tail, scratch) ->
    (observed, tail_zeroed)``. On the C backend without checks it
    calls the kernel's state entry directly (cos/sin of the headings: ``cbuild.heading_trig``).
    ``static``: the C kernel's per-pack arguments (``observations_cpu_static``, or a function of
    no argument returning them); None: derived here at the first call (the agent and slot counts
    come from the state) and kept with the bound call, so a stage names no C internals."""
    if static is None and backend == "c":
        kept: dict = {}

        def static():
            return kept["static"]

        def derive(present, out):
            if "static" not in kept:
                kept["static"] = observations_cpu_static(
                    road_seg=road_seg, road_type=road_type, grid_road=grid_road, grid_start=grid_start,
                    grid_origin=grid_origin, grid_dims=grid_dims, cell_size=cell_size, num_partners=num_partners,
                    partner_radius=partner_radius, road_radius=road_radius, A=present.shape[1],
                    C=out.shape[1])
    else:
        def derive(present, out):
            pass
    lib = load_library() if backend == "c" and not check else None
    if lib is None:
        def call(*state, out, zero_tail, scratch):
            derive(state[6], out)  # present
            return observations_state(*state, road_seg, road_type, grid_road, grid_origin, grid_dims, cell_size,
                                      num_partners, partner_radius, road_radius, out, grid_start, zero_tail,
                                      backend=backend, check=check, static=static, scratch=scratch)
        return call
    fixed = [None if callable(static) else static]

    def run(pos, heading, *state, out, zero_tail, scratch):
        if fixed[0] is None:
            derive(state[4], out)  # present
            fixed[0] = static()
        cos_h, sin_h = heading_trig(heading)
        return state_call(lib, fixed[0], pos, cos_h, sin_h, *state, out, zero_tail), zero_tail > 0
    return run


def _reference_rows(kw: dict, flat: torch.Tensor, written: torch.Tensor, out: torch.Tensor, scratch) -> None:
    """The torch reference on the in-play rows of ``out`` (through a contiguous scratch buffer when
    ``out`` is a column view), the rows that left play (``written & ~flat``) zeroed."""
    buf = out
    if not out.is_contiguous():
        buf = None if scratch is None else scratch.get("buf")
        if buf is None or buf.shape != out.shape or buf.device != out.device:
            buf = torch.zeros(out.shape, dtype=out.dtype, device=out.device)
            if scratch is not None:
                scratch["buf"] = buf
    rows = flat.nonzero().squeeze(1)
    stale = (written & ~flat).nonzero().squeeze(1)
    buf.view(-1, buf.shape[-1]).index_fill_(0, stale, 0.0)
    observations_reference(**kw, out=buf, rows=rows)
    if buf is not out:
        out.copy_(buf)
