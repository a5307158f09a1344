"""Stage ``observe``: the observation [W, C, D] of the new state (``kernels.observations``).

Ego extras, in the order of ``observations.EGO_EXTRA``: collided now, offroad now, trial index
``trial_count / k_trials``, time in trial ``(step - trial_start) / scenario_length`` (both 0
outside trial mode), last reward. The op builds them from the ego inputs
(``observations.tables.EGO_INPUTS``: the state's fields by name,
:func:`~gpusim.kernels.observations.tables.ego_inputs`; the trial clock from :func:`_trial_clock`
here). A new ego feature = its name, its input entry and column (torch), and its C line; nothing
here (docs/architecture.md).

The partner/road block (the first D0 columns) comes from one call on the step's backend:
:func:`~gpusim.kernels.observations.observations_state` (the C kernel's state entry, the Triton
kernel with ``ctx.obs_written``: a slot neither in play nor written before returns at once with
no host sync, or the torch reference on the in-play rows); every backend writes only the rows
that can change, into the env's reused buffer ``ctx.obs_buf`` (valid until the next step).

Traffic signals (``EnvConfig.num_signals`` > 0): the block of the N nearest signals
(``kernels.signals.signal_observations``, docs/signals.md) follows. When no scenario of the pack
has a signal, the C kernel zeroes the signal block in its pass instead (the signal kernel's result
would be all zero).

Memory task (``EnvConfig.goal_candidates`` >= 2): the candidate block
(:func:`gpusim.sim.candidates.candidate_block`, 3 G + 1 columns) is written
after every other block (zero for slots not observed), and the ego block's goal columns
(``goal_x``, ``goal_y``, ``goal_dist``) are zeroed: the true goal must not show.

Exact memoryless control (``EnvConfig.zero_trial_index``): the ego block's ``trial_index`` column
is zeroed after every other block is written, so the first observation of every trial is the same
(docs/trial.md).

Every block is written at its slice of the env's layout (:func:`config_obs_layout`, the one
table ``gpusim.kernels.obs_layout.BLOCKS``); no offset is computed here.

Driving styles (``EnvConfig.reward_conditioning``): the style block holds the
slot's own normalised style (:func:`gpusim.sim.styles.style_observation`), written after the
other blocks for every backend (one torch ``where`` + copy; zero for slots not observed).
"""

from __future__ import annotations

import torch

from gpusim.backend import step_backend
from gpusim.kernels.clocks import trial_features
from gpusim.kernels.obs_layout import KERNEL_BLOCKS, ObsLayout, obs_layout
from gpusim.kernels.observations.state import bind_observations_state
from gpusim.kernels.observations.tables import ego_inputs
from gpusim.kernels.signals import signal_observations
from gpusim.sim.candidates import candidate_block
from gpusim.sim.context import SimContext, StepVars, bound_op, slots
from gpusim.sim.signals import no_signal_pack, signal_log_index
from gpusim.sim.styles import style_observation
from gpusim.state import EnvState



def config_obs_layout(cfg) -> ObsLayout:
    """The env's :class:`~gpusim.kernels.obs_layout.ObsLayout` for ``cfg`` (``EnvConfig``): its
    partner, road and signal slots, the style block with reward conditioning, the candidate block
    in the memory task, and any block whose size is an ``EnvConfig`` field read by name in the block
    table (``DriveEnv.obs_layout``; every block found by its slice)."""
    return obs_layout(num_partners=cfg.num_partners, num_roads=cfg.num_roads, num_signals=cfg.num_signals,
                      styles=cfg.reward_conditioning, candidates=cfg.goal_candidates, settings=cfg)


#: The ego block's trial-index column in the default layout (zeroed by the exact memoryless control;
#: the stage itself reads it from the env's layout).
TRIAL_INDEX_COLUMN = obs_layout(1, 1).column("ego", "trial_index")


def goal_columns(layout: ObsLayout) -> slice:
    """The ego block's goal columns ``goal_x .. goal_dist`` (hidden in the memory task)."""
    return slice(layout.column("ego", "goal_x/100"), layout.column("ego", "goal_dist/100") + 1)


def _trial_clock(ctx: SimContext, state: EnvState) -> tuple:
    """``(trial index, time in trial)`` [W] float32 of the ego extras in trial mode, else ``(None, None)``."""
    cfg = ctx.config
    if not cfg.trial_mode:
        return None, None
    return trial_features(state.trial_count, state.step, state.trial_start, cfg.k_trials, cfg.scenario_length)


def observe_state(ctx: SimContext, state: EnvState, step: StepVars | None = None) -> torch.Tensor:
    """Observations [W, C, D] of ``state`` written into ``ctx.obs_buf`` (returned). ``step``: the
    running step, whose backend and checked layout the kernels use."""
    cfg, p, C = ctx.config, ctx.pack, ctx.num_slots
    full = ctx.obs_buf
    lay = ctx.cached("obs_layout", config_obs_layout)
    n_style, n_cand = (sl.stop - sl.start for sl in (lay.style, lay.candidates))
    kern = lay.kernel  # the partner/road kernels' columns; d0: where they end
    d0 = kern.stop
    if step is None:  # env.observe() outside a step: the step's backend, arguments checked
        step = StepVars(actions=None, episode_end=False, backend=step_backend(state.pos, cfg.cpu_kernels))
    # a pack without any signal (a host read of the pack, on the C backend only): the C kernel zeroes
    # the signal block in the same pass instead of the signal kernel running (all zero then)
    no_signals = cfg.num_signals > 0 and step.backend == "c" and ctx.pack_fact("no_signals", no_signal_pack)
    t_index, t_time = _trial_clock(ctx, state)
    observe_op = bound_op(ctx, step, "observations", lambda backend, check: bind_observations_state(
        backend, check, p.road_seg, p.road_type, p.grid_road, p.grid_origin, p.grid_dims, p.cell_size, cfg.num_partners,
        cfg.partner_radius, cfg.road_radius, p.grid_start))
    ctx.obs_written, signals_done = observe_op(
        state.pos, state.heading, state.speed, state.length, state.width, state.agent_type, state.present, state.goal,
        ego_inputs(state, t_index=t_index, t_time=t_time), state.controlled, ctx.obs_written, state.scenario,
        out=full if kern == slice(0, full.shape[-1]) else full[..., kern],
        zero_tail=lay.signals.stop - d0 if no_signals else 0, scratch=ctx.obs_scratch)
    if cfg.zero_trial_index:  # the exact memoryless control: trial k starts like trial 0
        full[..., lay.column("ego", "trial_index")].fill_(0.0)
    # done unless a block after the kernels' is left to write (any block of the table with columns;
    # the signal block not when the C kernel zeroed it)
    if not any(sl.stop > sl.start and name not in KERNEL_BLOCKS and not (name == "signals" and signals_done)
               for name, sl in lay.blocks):
        return full
    active = ctx.obs_written.view(-1, C)  # the slots observed; the other rows are zero
    if cfg.num_signals > 0 and not signals_done:
        signal_observations(
            pos=slots(state.pos, C), heading=slots(state.heading, C), active=active, scenario=state.scenario,
            log_index=signal_log_index(ctx, state), signal_pos=p.signal_pos, signal_dir=p.signal_dir,
            signal_state=p.signal_state, signal_valid=p.signal_valid, num_signals=p.num_signals,
            num_obs=cfg.num_signals, radius=cfg.road_radius, out=full, offset=lay.signals.start,
            backend=step.backend)
    if n_style:
        full[..., lay.style].copy_(style_observation(ctx, state, active))
    if n_cand:
        block = candidate_block(state)
        full[..., lay.candidates].copy_(torch.where(active[..., None], block, torch.zeros_like(block)))
        full[..., goal_columns(lay)].fill_(0.0)
    return full


def observe(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """Sets ``step.obs``; changes no state field."""
    step.obs = observe_state(ctx, state, step)
    return {}
