"""Stage ``contacts``: collisions, offroad and (collision REMOVE) who was hit.

Collisions are tested for the present controlled agents against every present agent
(``query = present & controlled``, OBB separating axes with ``collision_box_scale``): overlaps among
experts alone have no effect and are not computed, so an expert is flagged only when it overlaps a
controlled agent. Offroad (box outline crosses a road edge, ``offroad_box_scale``) is tested for
the C controlled slots only (experts are never offroad).

Absent agents are never flagged (every backend of the ops). The ops (``kernels.collision``, ``kernels.offroad``) run on the step's backend; on the C backend
the three tests share one cos/sin of the headings (:func:`~gpusim.sim.context.heading_trig`, also
reused by the C observation).
"""

from __future__ import annotations

import torch

from gpusim.config import ContactBehavior
from gpusim.kernels.collision import collisions, hit_by
from gpusim.kernels.offroad import offroad
from gpusim.sim.context import SimContext, StepVars, heading_trig
from gpusim.state import EnvState


def contacts(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """Sets ``step.collided``, ``step.offroad``, ``step.hit`` [W, A] bool; changes
    ``collided_now``, ``offroad_now``."""
    cfg, p = ctx.config, ctx.pack
    live = state.present & state.controlled
    # cos/sin of the headings for the C kernels (the others compute their own)
    cos_h, sin_h = heading_trig(step, state.heading) if step.backend == "c" else (None, None)
    box = dict(pos=state.pos, heading=state.heading, length=state.length, width=state.width, backend=step.backend,
               check=not step.checked, cos_h=cos_h, sin_h=sin_h)
    collided = collisions(**box, present=state.present, box_scale=cfg.collision_box_scale, query=live)
    off = offroad(**box, present=live, scenario=state.scenario, road_seg=p.road_seg, grid_edge=p.grid_edge,
                  grid_start=p.grid_start, grid_origin=p.grid_origin, grid_dims=p.grid_dims, cell_size=p.cell_size,
                  box_scale=cfg.offroad_box_scale, num_slots=ctx.num_slots)
    if cfg.collision_behavior == ContactBehavior.REMOVE:
        step.hit = hit_by(**box, present=state.present, source=step.in_play & collided,
                          box_scale=cfg.collision_box_scale)
    else:
        step.hit = torch.zeros_like(collided)
    step.collided, step.offroad = collided, off
    return {"collided_now": collided, "offroad_now": off}
