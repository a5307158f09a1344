"""Stage ``observe``: the observation [W, C, D] of the new state (``kernels.observations``).

Ego extras, in the order of ``observations.EGO_EXTRA``: collided now, offroad now, trial index
``trial_count / k_trials``, time in trial ``(step - trial_start) / scenario_length`` (both 0
outside trial mode), last reward. A new ego feature = a column here plus the kernel's layout
(docs/architecture.md).

Traffic signals (``EnvConfig.num_signals`` > 0): the block of the N nearest signals
(``kernels.signals.signal_observations``, docs/signals.md) fills the last columns of the
observation. The C and Triton kernels write the first D0 columns of the full buffer in place
(the C kernel, when no scenario of the pack has a signal, also zeroes the signal block in the
same pass instead of running the signal kernel, whose result would be all zero). The torch
reference writes ``ctx.obs_core`` [W, C, D0] and copies it into the first D0 columns.

Memory task (``EnvConfig.goal_candidates`` >= 2): the candidate block
(:func:`gpusim.sim.candidates.candidate_block`, 3 G + 1 columns) is the very last block, written
after every other one (zero for slots not observed), and the ego block's goal columns
(``goal_x``, ``goal_y``, ``goal_dist``) are zeroed: the true goal must not show.

Driving styles (``EnvConfig.reward_conditioning``): the last ``NUM_STYLE_TERMS`` columns hold the
slot's own normalised style (:func:`gpusim.sim.styles.style_observation`), written after the
other blocks for every backend (one torch ``where`` + copy; zero for slots not observed).

The result is written into the env's reused buffer ``ctx.obs_buf`` (valid until the next step).
On the torch (CPU) backend only the in-play slots are recomputed; slots that left play are zeroed
once. The C path does it in one call on the state's own fields
(:func:`~gpusim.kernels.observations.cpu.observations_cpu_state`: it picks the rows from
``controlled``, ``present`` and ``written`` and reads the ego extras and goal slots itself, no
torch op around it); the torch reference compacts the rows with ``nonzero`` (no device sync on
the CPU). The Triton kernel
gets ``written`` (``ctx.obs_written``) instead: a slot neither in play nor written before
returns at once, with no host sync (on an H100 at 16,384 worlds the kernel had written all 32
slots' rows, 87% of them empty, and the env copied the whole buffer once more).

C kernel: on the step's ``"c"`` backend (``EnvConfig.cpu_kernels`` on CPU tensors) the
partner/road block comes from the hand-written C kernel (``kernels.observations.observations_cpu``;
built at first use, bit-identical to the torch reference but for the goal distance's last bit).
Where no C compiler is available it warns once and the torch reference runs.
"""

from __future__ import annotations

import torch

from gpusim.backend import step_backend
from gpusim.kernels.obs_layout import EGO_FEATURES
from gpusim.kernels.observations import cpu_kernel_available, observations
from gpusim.kernels.observations.cpu import observations_cpu_state, observations_cpu_static
from gpusim.kernels.signals import SIGNAL_DIM, signal_observations
from gpusim.sim.candidates import candidate_block
from gpusim.sim.context import SimContext, StepVars, slots
from gpusim.sim.signals import no_signal_pack, signal_log_index
from gpusim.sim.styles import style_observation
from gpusim.state import EnvState

#: The ego block's goal columns (hidden in the memory task).
GOAL_COLUMNS = slice(EGO_FEATURES.index("goal_x/100"), EGO_FEATURES.index("goal_dist/100") + 1)
from gpusim.styles import NUM_STYLE_TERMS


def ego_extra(ctx: SimContext, state: EnvState) -> torch.Tensor:
    """[W, C, 5] float32 ego extras of ``state`` (order in the module docstring)."""
    cfg, C = ctx.config, ctx.num_slots
    zeros = torch.zeros_like(state.last_reward)
    if cfg.trial_mode:
        t_index = (state.trial_count.to(torch.float32) / cfg.k_trials)[:, None] + zeros
        t_time = ((state.step - state.trial_start).to(torch.float32) / cfg.scenario_length)[:, None] + zeros
    else:
        t_index, t_time = zeros, zeros
    return torch.stack([state.collided_now[:, :C].float(), state.offroad_now[:, :C].float(), t_index, t_time,
                        state.last_reward], dim=-1)


def _trial_clock(ctx: SimContext, state: EnvState) -> tuple:
    """``(trial index, time in trial)`` [W] float32 of the ego extras in trial mode, else ``(None, None)``."""
    cfg = ctx.config
    if not cfg.trial_mode:
        return None, None
    return (state.trial_count.to(torch.float32) / cfg.k_trials,
            (state.step - state.trial_start).to(torch.float32) / cfg.scenario_length)


def _observe_inputs(ctx: SimContext, state: EnvState, active: torch.Tensor) -> dict:
    """Keyword arguments of the partner/road observation kernels for ``state`` (all but out/rows)."""
    cfg, p, C = ctx.config, ctx.pack, ctx.num_slots
    return dict(
        pos=state.pos, heading=state.heading, speed=state.speed, length=state.length, width=state.width,
        agent_type=state.agent_type, present=state.present, goal=slots(state.goal, C),
        ego_extra=ego_extra(ctx, state), ego_active=active, scenario=state.scenario, road_seg=p.road_seg,
        road_type=p.road_type, grid_road=p.grid_road, grid_start=p.grid_start, grid_origin=p.grid_origin,
        grid_dims=p.grid_dims, cell_size=p.cell_size, num_partners=cfg.num_partners,
        partner_radius=cfg.partner_radius, road_radius=cfg.road_radius,
    )


def cpu_static(ctx: SimContext):
    """The C observation kernel's pack- and config-derived arguments
    (:func:`~gpusim.kernels.observations.cpu.observations_cpu_static`), computed once per pack."""
    cfg = ctx.config
    return ctx.pack_fact("observations_cpu_static", lambda pk: observations_cpu_static(
        road_seg=pk.road_seg, road_type=pk.road_type, grid_road=pk.grid_road, grid_start=pk.grid_start,
        grid_origin=pk.grid_origin, grid_dims=pk.grid_dims, cell_size=pk.cell_size,
        num_partners=cfg.num_partners, partner_radius=cfg.partner_radius, road_radius=cfg.road_radius,
        A=pk.traj_valid.shape[1], C=ctx.num_slots))


def observe_state(ctx: SimContext, state: EnvState, step: StepVars | None = None) -> torch.Tensor:
    """Observations [W, C, D] of ``state`` written into ``ctx.obs_buf`` (returned). ``step``: the
    running step, whose backend and checked layout the kernels use."""
    cfg, p, C = ctx.config, ctx.pack, ctx.num_slots
    full = ctx.obs_buf
    n_style = NUM_STYLE_TERMS if cfg.reward_conditioning else 0  # style block (reward conditioning): the last columns, written last
    n_cand = 3 * cfg.goal_candidates + 1 if cfg.goal_candidates >= 2 else 0  # memory task block: the very last
    d0 = full.shape[-1] - cfg.num_signals * SIGNAL_DIM - n_style - n_cand
    name = step.backend if step is not None and step.backend is not None else step_backend(state.pos, cfg.cpu_kernels)
    no_signals = False
    if name == "c" and cpu_kernel_available():
        # scenarios without signals: the C kernel zeroes the signal block in the same pass
        no_signals = cfg.num_signals > 0 and ctx.pack_fact("no_signals", no_signal_pack)
        ctx.obs_written = _partner_road_c(ctx, state, step, full, d0, full.shape[-1] - d0 if no_signals else 0)
        if not (n_style or n_cand or (cfg.num_signals > 0 and not no_signals)):
            return full
        active = ctx.obs_written.view(-1, C)
    else:
        active = _partner_road_torch(ctx, state, name, full, d0, separate=bool(cfg.num_signals or n_style or n_cand))
        ctx.obs_written = active.view(-1)  # inactive slots are all zero now (``active`` is this call's own)
    if cfg.num_signals > 0 and not no_signals:
        signal_observations(
            pos=slots(state.pos, C), heading=slots(state.heading, C), active=active, scenario=state.scenario,
            log_index=signal_log_index(ctx, state), signal_pos=p.signal_pos, signal_dir=p.signal_dir,
            signal_state=p.signal_state, signal_valid=p.signal_valid, num_signals=p.num_signals,
            num_obs=cfg.num_signals, radius=cfg.road_radius, out=full, offset=d0)
    if n_style:
        full[..., d0 + cfg.num_signals * SIGNAL_DIM: full.shape[-1] - n_cand].copy_(
            style_observation(ctx, state, active))
    if n_cand:
        block = candidate_block(state)
        full[..., full.shape[-1] - n_cand:].copy_(torch.where(active[..., None], block, torch.zeros_like(block)))
        full[..., GOAL_COLUMNS].fill_(0.0)
    return full


def _partner_road_c(ctx: SimContext, state: EnvState, step: StepVars | None, full: torch.Tensor, d0: int,
                    zero_tail: int) -> torch.Tensor:
    """The C kernel, one call on the state's own fields: picks the slots in play or written before,
    writes the in-play rows and zeroes the others in place in the first ``d0`` columns of ``full``
    (and ``zero_tail`` columns after them); returns the [W*C] bool in-play flags (the rows that may
    be non-zero now)."""
    cfg, p = ctx.config, ctx.pack
    t_index, t_time = _trial_clock(ctx, state)
    return observations_cpu_state(
        pos=state.pos, heading=state.heading, speed=state.speed, length=state.length, width=state.width,
        agent_type=state.agent_type, present=state.present, goal=state.goal, collided=state.collided_now,
        offroad=state.offroad_now, t_index=t_index, t_time=t_time, last_reward=state.last_reward,
        controlled=state.controlled, written=ctx.obs_written, scenario=state.scenario, road_seg=p.road_seg,
        road_type=p.road_type, grid_road=p.grid_road, grid_start=p.grid_start, grid_origin=p.grid_origin,
        grid_dims=p.grid_dims, cell_size=p.cell_size, num_partners=cfg.num_partners,
        partner_radius=cfg.partner_radius, road_radius=cfg.road_radius,
        out=full if d0 == full.shape[-1] else full[..., :d0], zero_tail=zero_tail,
        check=step is None or not step.checked, static=cpu_static(ctx))


def _partner_road_torch(ctx: SimContext, state: EnvState, name: str, full: torch.Tensor, d0: int,
                        separate: bool) -> torch.Tensor:
    """The partner/road block into the first ``d0`` columns of ``full`` on the Triton or torch
    backend; returns ``active`` [W, C] bool (the slots observed). Triton writes ``full`` in place
    and skips the slots neither in play nor written before (no host sync, no copy); the torch
    reference rewrites the in-play rows of ``ctx.obs_core`` (``separate``: other blocks follow) or
    of ``full``, zeroing the rows that left play (``nonzero``: no sync on the CPU)."""
    C = ctx.num_slots
    active = (state.slot_active & state.present[:, :C]).contiguous()
    if name == "triton":
        observations(**_observe_inputs(ctx, state, active), out=full[..., :d0], written=ctx.obs_written)
        return active
    buf = full
    if separate:  # the torch kernels write their own [W, C, D0] buffer
        if ctx.obs_core is None or ctx.obs_core.shape[-1] != d0:
            ctx.obs_core = torch.zeros(*full.shape[:2], d0, device=full.device)
        buf = ctx.obs_core
    flat = active.view(-1)
    rows = flat.nonzero().squeeze(1)
    stale = (ctx.obs_written & ~flat).nonzero().squeeze(1)
    buf.view(-1, buf.shape[-1]).index_fill_(0, stale, 0.0)
    observations(**_observe_inputs(ctx, state, active), out=buf, rows=rows)
    if buf is not full:
        full[..., :d0].copy_(buf)
    return active


def observe(ctx: SimContext, state: EnvState, step: StepVars) -> dict:
    """Sets ``step.obs``; changes no state field."""
    step.obs = observe_state(ctx, state, step)
    return {}
