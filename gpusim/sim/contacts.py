"""Stage ``contacts``: collisions, offroad and (collision REMOVE) who was hit.

Collisions are tested for the present controlled agents against every present agent
(``query = present & controlled``, OBB separating axes with ``collision_box_scale``): overlaps among
experts alone have no effect and are not computed, so an expert is flagged only when it overlaps a
controlled agent. Offroad (box outline crosses a road edge, ``offroad_box_scale``) is tested for
the C controlled slots only (experts are never offroad).

CPU kernels: on the torch backend with ``EnvConfig.cpu_kernels`` (default) the three tests run
the hand-written C kernels of ``kernels.step_cpu`` (same booleans as the torch references, one
cos/sin of the headings shared by all three); where no C compiler is available it warns once and
the references run. This stage is eager inside the compiled step too, so ``compile`` keeps them.
"""

from __future__ import annotations

import torch

from gpusim.config import ContactBehavior
from gpusim.kernels.collision import collisions
from gpusim.kernels.events import hit_by
from gpusim.kernels.offroad import offroad
from gpusim.kernels.step_cpu import collisions_cpu, hit_by_cpu, offroad_cpu
from gpusim.sim.context import SimContext, StepVars, heading_trig, slots, use_step_c
from gpusim.state import EnvState


def contacts(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """Sets ``step.collided``, ``step.offroad``, ``step.hit`` [W, A] bool; changes
    ``collided_now``, ``offroad_now``."""
    cfg, p, C = ctx.config, ctx.pack, ctx.num_slots
    live = state.present & state.controlled
    if use_step_c(ctx, state, step, eager_only=False):
        return _contacts_c(ctx, state, step, live)
    collided = collisions(
        pos=state.pos,
        heading=state.heading,
        length=state.length,
        width=state.width,
        present=state.present,
        box_scale=cfg.collision_box_scale,
        query=live,
    ) & state.present
    off_c = offroad(
        pos=slots(state.pos, C),
        heading=slots(state.heading, C),
        length=slots(state.length, C),
        width=slots(state.width, C),
        present=slots(live, C),
        scenario=state.scenario,
        road_seg=p.road_seg,
        grid_edge=p.grid_edge,
        grid_start=p.grid_start,
        grid_origin=p.grid_origin,
        grid_dims=p.grid_dims,
        cell_size=p.cell_size,
        box_scale=cfg.offroad_box_scale,
    )
    off = torch.zeros_like(collided)
    off[:, :C] = off_c
    if cfg.collision_behavior == ContactBehavior.REMOVE:
        step.hit = hit_by(
            pos=state.pos,
            heading=state.heading,
            length=state.length,
            width=state.width,
            present=state.present,
            source=step.in_play & collided,
            box_scale=cfg.collision_box_scale,
        )
    else:
        step.hit = torch.zeros_like(collided)
    step.collided, step.offroad = collided, off
    return {"collided_now": collided, "offroad_now": off}


def _contacts_c(ctx: SimContext, state: EnvState, step: StepVars, live) -> dict:
    """:func:`contacts` through the C kernels (``kernels.step_cpu``); same results."""
    cfg, p = ctx.config, ctx.pack
    cos_h, sin_h = heading_trig(step, state.heading)  # shared with the observation (same headings)
    box = dict(pos=state.pos, heading=state.heading, length=state.length, width=state.width,
               cos_h=cos_h, sin_h=sin_h)
    check = not step.checked
    collided = collisions_cpu(**box, present=state.present, box_scale=cfg.collision_box_scale, query=live,
                              check=check)
    off = offroad_cpu(**box, present=live, scenario=state.scenario, road_seg=p.road_seg, grid_edge=p.grid_edge,
                      grid_start=p.grid_start, grid_origin=p.grid_origin, grid_dims=p.grid_dims,
                      cell_size=p.cell_size, box_scale=cfg.offroad_box_scale, num_slots=ctx.num_slots, check=check)
    if cfg.collision_behavior == ContactBehavior.REMOVE:
        step.hit = hit_by_cpu(**box, present=state.present, source=step.in_play & collided,
                              box_scale=cfg.collision_box_scale, check=check)
    else:
        step.hit = torch.zeros_like(collided)
    step.collided, step.offroad = collided, off
    return {"collided_now": collided, "offroad_now": off}
