"""Stage ``contacts``: collisions, offroad and (collision REMOVE) who was hit.

Collisions are tested for the present controlled agents against every present agent
(``query = present & controlled``, OBB separating axes with ``collision_box_scale``): overlaps among
experts alone have no effect and are not computed, so an expert is flagged only when it overlaps a
controlled agent. Offroad (box outline crosses a road edge, ``offroad_box_scale``) is tested for
the C controlled slots only (experts are never offroad).

Absent agents are never flagged (every backend of the ops). The ops (``kernels.collision``,
``kernels.offroad``) run on the step's backend, bound once per pack
(:func:`~gpusim.sim.context.bound_op`); their C kernels share one cos/sin of the headings
(``kernels.cbuild.heading_trig``, also reused by the C observation).
"""

from __future__ import annotations

import torch

from gpusim.config import ContactBehavior
from gpusim.kernels.collision import bind_collisions, bind_hit_by
from gpusim.kernels.offroad import bind_offroad
from gpusim.sim.context import SimContext, StepVars, bound_op
from gpusim.state import EnvState


def contacts(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """Sets ``step.collided``, ``step.offroad``, ``step.hit`` [W, A] bool; changes
    ``collided_now``, ``offroad_now``."""
    cfg, p = ctx.config, ctx.pack
    live = state.present & state.controlled
    box = (state.pos, state.heading, state.length, state.width)
    collided = bound_op(ctx, step, "collisions", lambda backend, check: bind_collisions(
        backend, check, cfg.collision_box_scale))(*box, state.present, live)
    off = bound_op(ctx, step, "offroad", lambda backend, check: bind_offroad(
        backend, check, p.road_seg, p.grid_edge, p.grid_origin, p.grid_dims, p.cell_size, cfg.offroad_box_scale,
        p.grid_start, ctx.num_slots))(*box, live, state.scenario)
    if cfg.collision_behavior == ContactBehavior.REMOVE:
        step.hit = bound_op(ctx, step, "hit_by", lambda backend, check: bind_hit_by(
            backend, check, cfg.collision_box_scale))(*box, state.present, step.in_play & collided)
    else:
        step.hit = torch.zeros_like(collided)
    step.collided, step.offroad = collided, off
    return {"collided_now": collided, "offroad_now": off}
