"""Stage ``contacts``: collisions, offroad and (collision REMOVE) who was hit.

Collisions are tested for the present controlled agents against every present agent
(``query = present & controlled``, OBB separating axes with ``collision_box_scale``): overlaps among
experts alone have no effect and are not computed, so an expert is flagged only when it overlaps a
controlled agent. Offroad (box outline crosses a road edge, ``offroad_box_scale``) is tested for
the C controlled slots only (experts are never offroad).

Absent agents are never flagged (every backend of the ops). The ops (``kernels.collision``, ``kernels.offroad``) run on the step's backend, bound once per pack
(:func:`~gpusim.sim.context.bound_op`); on the C backend the three tests share one cos/sin of the headings (:func:`~gpusim.sim.context.heading_trig`, also
reused by the C observation).
"""

from __future__ import annotations

import torch

from gpusim.config import ContactBehavior
from gpusim.kernels.collision import bind_collisions, bind_hit_by
from gpusim.kernels.offroad import bind_offroad
from gpusim.sim.context import SimContext, StepVars, bound_op, heading_trig
from gpusim.state import EnvState


def contacts(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """Sets ``step.collided``, ``step.offroad``, ``step.hit`` [W, A] bool; changes
    ``collided_now``, ``offroad_now``."""
    cfg, p = ctx.config, ctx.pack
    live = state.present & state.controlled
    # cos/sin of the headings for the C kernels (the others compute their own)
    cos_h, sin_h = heading_trig(step, state.heading) if step.backend == "c" else (None, None)
    box = (state.pos, state.heading, state.length, state.width)
    collided = bound_op(ctx, step, "collisions", lambda backend, check: bind_collisions(
        backend, check, cfg.collision_box_scale))(*box, state.present, live, cos_h, sin_h)
    off = bound_op(ctx, step, "offroad", lambda backend, check: bind_offroad(
        backend, check, p.road_seg, p.grid_edge, p.grid_origin, p.grid_dims, p.cell_size, cfg.offroad_box_scale,
        p.grid_start, ctx.num_slots))(*box, live, state.scenario, cos_h, sin_h)
    if cfg.collision_behavior == ContactBehavior.REMOVE:
        step.hit = bound_op(ctx, step, "hit_by", lambda backend, check: bind_hit_by(
            backend, check, cfg.collision_box_scale))(*box, state.present, step.in_play & collided, cos_h, sin_h)
    else:
        step.hit = torch.zeros_like(collided)
    step.collided, step.offroad = collided, off
    return {"collided_now": collided, "offroad_now": off}
