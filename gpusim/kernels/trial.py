"""Trial mode: the per-step trial state machine of one world (docs/design.md section 9).

In trial mode (``goal_behavior = TRIAL``) an *episode* is ``k_trials`` trials of the same scenario.
This kernel runs once per env step, after the events kernel, and decides per world ``w``:

* **goal removal**: a controlled agent that reached its goal in this step (``goal_now``) is
  removed (``removed = 1``, ``present = 0``: out of the scene, no contacts, not observed). No
  terminal and no truncation for it.
* **per-trial flags** of each policy slot: goal reached / collided / offroad *in the current
  trial* (OR-accumulated over the trial's steps).
* **trial end** (only in a world whose episode is still running, ``world_done = 0`` before the
  step) when any of:

  - every active slot's agent is removed (goal or REMOVE behaviour), the world having >= 1 active
    slot;
  - ``step - trial_start >= per_trial_timeout`` (``step`` counted after this step);
  - the events kernel truncated the world early in this step (STOP behaviours:
    ``stop_truncate_fraction`` of its controlled agents are contact-stopped). In trial mode an
    early truncation ends the *trial*, not the episode (docs/design.md section 9: the
    crash is exactly what a later trial should learn to avoid);
  - ``episode_end`` (step H reached; with H = ``k_trials * per_trial_timeout`` it always
    coincides with the last trial's timeout at the latest).

* at a trial end: ``trial_score[w, c, trial_count]`` = goal reached without collision and
  offroad in this trial (active slots; inactive slots stay 0); the per-trial flags are cleared;
  ``trial_count += 1``; ``trial_ended = 1`` for the active slots.

  - If ``trial_count < k_trials`` afterwards (``restart``): ``truncation = 1`` for the active
    slots and ``trial_start = step``. The caller restores every entity of the world exactly as
    at reset (``restart`` mask; this kernel does not touch poses).
  - Else (``last``, or ``episode_end``): ``terminal = 1`` for active slots without a terminal
    yet (``slot_done``), ``world_done = 1``, and every controlled agent is removed until the
    common reset (idle, ``loss_mask = 0``). No truncation.

A world whose episode is over (``world_done`` before the step) changes nothing but its
terminal flags at ``episode_end`` (for slots that never got one).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from gpusim.backend import op_backend
from gpusim.kernels.checks import check_tensors
from gpusim.kernels.clocks import trial_time


class TrialOut(NamedTuple):
    """Outputs of :func:`trial_step` (W worlds, A agent slots, C policy slots, K trial slots)."""

    removed: torch.Tensor  # [W, A] bool
    present: torch.Tensor  # [W, A] bool
    trial_end: torch.Tensor  # [W] bool, a trial ended in this step
    restart: torch.Tensor  # [W] bool, restore the world as at reset (a new trial starts)
    trial_count: torch.Tensor  # [W] int32
    trial_start: torch.Tensor  # [W] int32
    world_done: torch.Tensor  # [W] bool, the episode is over (all trials done)
    terminal: torch.Tensor  # [W, C] bool
    truncation: torch.Tensor  # [W, C] bool
    trial_ended: torch.Tensor  # [W, C] bool
    slot_done: torch.Tensor  # [W, C] bool
    trial_goal: torch.Tensor  # [W, C] bool
    trial_collided: torch.Tensor  # [W, C] bool
    trial_offroad: torch.Tensor  # [W, C] bool
    trial_score: torch.Tensor  # [W, C, K] bool


def trial_step_reference(
    goal_now, collided, offroad, removed, present, controlled, slot_active, slot_done,
    world_done, truncated, episode_end, step, trial_start, trial_count,
    trial_goal, trial_collided, trial_offroad, trial_score,
    per_trial_timeout: int, k_trials: int,
) -> TrialOut:
    """One step of the trial state machine (rules in the module docstring).

    Args:
        goal_now: [W, A] bool, agent reached its goal in this step (in-play agents only).
        collided, offroad: [W, C] bool, the slot's agent was in play and in collision / offroad
            in this step.
        removed, present: [W, A] bool after the step's events (contact REMOVE applied).
        controlled: [W, A] bool controlled agents (only slots ``< C`` may be controlled).
        slot_active, slot_done: [W, C] bool (active slot; terminal already emitted this episode).
        world_done: [W] bool, the world's episode was already over **before** this step.
        truncated: [W] bool, early STOP truncation of the world in this step (events kernel).
        episode_end: [W] bool, this step completes the horizon H.
        step: [W] int32 steps taken in the episode, this step included.
        trial_start: [W] int32 ``step`` at which the current trial started.
        trial_count: [W] int32 trials completed in this episode (``< k_trials`` while running).
        trial_goal, trial_collided, trial_offroad: [W, C] bool per-trial flags before the step.
        trial_score: [W, C, K] bool per-trial scores so far, K >= ``k_trials``.
        per_trial_timeout: steps per trial (>= 1). k_trials: trials per episode (>= 1).

    Returns:
        :class:`TrialOut` of new tensors (inputs are not modified).

    Raises:
        ValueError: on inconsistent shapes, dtypes, devices, non-contiguous inputs (Triton
            launcher), ``per_trial_timeout < 1``, ``k_trials < 1`` or ``K < k_trials`` (both).
    """
    _check_params(trial_score, per_trial_timeout, k_trials)
    C = slot_active.shape[1]
    K = trial_score.shape[2]
    running = ~world_done
    goal_rm = goal_now & controlled & running[:, None]
    rem = removed | goal_rm
    tg = trial_goal | (goal_now[:, :C] & slot_active)
    tc = trial_collided | (collided & slot_active)
    to = trial_offroad | (offroad & slot_active)

    n_act = slot_active.sum(1)
    n_rm = (slot_active & rem[:, :C]).sum(1)
    all_removed = (n_act > 0) & (n_rm == n_act)
    timeout = trial_time(step, trial_start) >= per_trial_timeout
    trial_end = running & (all_removed | timeout | truncated | episode_end)
    new_count = trial_count + trial_end.to(torch.int32)
    last = trial_end & ((new_count >= k_trials) | episode_end)
    restart = trial_end & ~last

    score = tg & ~tc & ~to & slot_active
    at_k = torch.arange(K, device=step.device)[None, None, :] == trial_count.to(torch.int64)[:, None, None]
    write = trial_end[:, None, None] & at_k
    new_score = torch.where(write, score[:, :, None], trial_score)

    end_c = trial_end[:, None]
    tg = tg & ~end_c
    tc = tc & ~end_c
    to = to & ~end_c

    rem = rem | (last[:, None] & controlled)
    pres = present & ~rem
    terminal = (last | episode_end)[:, None] & slot_active & ~slot_done
    truncation = restart[:, None] & slot_active
    trial_ended = end_c & slot_active
    return TrialOut(
        rem, pres, trial_end, restart, new_count.to(torch.int32),
        torch.where(restart, step, trial_start).to(torch.int32), world_done | last,
        terminal, truncation, trial_ended, slot_done | terminal, tg, tc, to, new_score)


def _check_params(trial_score, per_trial_timeout, k_trials):
    if int(per_trial_timeout) < 1:
        raise ValueError(f"trial_step: per_trial_timeout must be >= 1, got {per_trial_timeout}")
    if int(k_trials) < 1:
        raise ValueError(f"trial_step: k_trials must be >= 1, got {k_trials}")
    if trial_score.dim() != 3 or trial_score.shape[2] < int(k_trials):
        raise ValueError(f"trial_step: trial_score must be [W, C, K] with K >= k_trials={k_trials}, "
                         f"got {tuple(trial_score.shape)}")


@triton.jit
def _trial_step_kernel(
    goal_ptr, col_ptr, off_ptr, removed_ptr, present_ptr, ctrl_ptr, sa_ptr, sd_ptr,
    wd_ptr, trunc_ptr, eend_ptr, step_ptr, tstart_ptr, tcount_ptr,
    tg_ptr, tc_ptr, to_ptr, score_ptr,
    o_removed_ptr, o_present_ptr, o_end_ptr, o_restart_ptr, o_count_ptr, o_start_ptr, o_wd_ptr,
    o_term_ptr, o_trunc_ptr, o_tended_ptr, o_sd_ptr, o_tg_ptr, o_tc_ptr, o_to_ptr, o_score_ptr,
    A, C, K, timeout, k_trials,
    BLOCK_A: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One program per world applies the whole per-step trial state machine (reference:
    ``trial_step_reference``). Slightly over 80 lines because its ~20 outputs are written in one
    pass so the state machine costs one launch."""
    w = tl.program_id(0).to(tl.int64)
    wd = tl.load(wd_ptr + w) != 0
    trunc = tl.load(trunc_ptr + w) != 0
    eend = tl.load(eend_ptr + w) != 0
    stp = tl.load(step_ptr + w)
    tstart = tl.load(tstart_ptr + w)
    tcount = tl.load(tcount_ptr + w)
    running = wd == 0

    # ---- policy slots [C]
    c = tl.arange(0, BLOCK_C).to(tl.int64)
    mc = c < C
    oc = w * C + c
    oca = w * A + c  # the same agents in [W, A] tensors (slot c = agent c)
    sa = (tl.load(sa_ptr + oc, mask=mc, other=0) != 0) & mc
    sd = tl.load(sd_ptr + oc, mask=mc, other=0) != 0
    g_c = tl.load(goal_ptr + oca, mask=mc, other=0) != 0
    ctrl_c = tl.load(ctrl_ptr + oca, mask=mc, other=0) != 0
    rem_c = tl.load(removed_ptr + oca, mask=mc, other=0) != 0
    col = tl.load(col_ptr + oc, mask=mc, other=0) != 0
    off = tl.load(off_ptr + oc, mask=mc, other=0) != 0
    tg = (tl.load(tg_ptr + oc, mask=mc, other=0) != 0) | (g_c & sa)
    tc = (tl.load(tc_ptr + oc, mask=mc, other=0) != 0) | (col & sa)
    to = (tl.load(to_ptr + oc, mask=mc, other=0) != 0) | (off & sa)
    rem_c = rem_c | (g_c & ctrl_c & running)

    n_act = tl.sum(sa.to(tl.int32), axis=0)
    n_rm = tl.sum((sa & rem_c).to(tl.int32), axis=0)
    all_removed = (n_act > 0) & (n_rm == n_act)
    tout = (stp - tstart) >= timeout
    tend = running & (all_removed | tout | trunc | eend)
    new_count = tcount + tend.to(tl.int32)
    last = tend & ((new_count >= k_trials) | eend)
    restart = tend & (last == 0)

    score = tg & (tc == 0) & (to == 0) & sa
    term = (last | eend) & sa & (sd == 0)
    tl.store(o_term_ptr + oc, term.to(tl.int8), mask=mc)
    tl.store(o_trunc_ptr + oc, (restart & sa).to(tl.int8), mask=mc)
    tl.store(o_tended_ptr + oc, (tend & sa).to(tl.int8), mask=mc)
    tl.store(o_sd_ptr + oc, (sd | term).to(tl.int8), mask=mc)
    tl.store(o_tg_ptr + oc, (tg & (tend == 0)).to(tl.int8), mask=mc)
    tl.store(o_tc_ptr + oc, (tc & (tend == 0)).to(tl.int8), mask=mc)
    tl.store(o_to_ptr + oc, (to & (tend == 0)).to(tl.int8), mask=mc)

    # ---- per-trial scores [C, K]
    k = tl.arange(0, BLOCK_K).to(tl.int64)
    mck = mc[:, None] & (k < K)[None, :]
    ock = oc[:, None] * K + k[None, :]
    old = tl.load(score_ptr + ock, mask=mck, other=0) != 0
    write = tend & (k[None, :] == tcount.to(tl.int64))
    new = tl.where(write, score[:, None], old)
    tl.store(o_score_ptr + ock, new.to(tl.int8), mask=mck)

    # ---- agents [A]
    a = tl.arange(0, BLOCK_A).to(tl.int64)
    ma = a < A
    oa = w * A + a
    g = tl.load(goal_ptr + oa, mask=ma, other=0) != 0
    ctrl = tl.load(ctrl_ptr + oa, mask=ma, other=0) != 0
    rem = tl.load(removed_ptr + oa, mask=ma, other=0) != 0
    pres = tl.load(present_ptr + oa, mask=ma, other=0) != 0
    rem = rem | (g & ctrl & running) | (last & ctrl)
    tl.store(o_removed_ptr + oa, rem.to(tl.int8), mask=ma)
    tl.store(o_present_ptr + oa, (pres & (rem == 0)).to(tl.int8), mask=ma)

    # ---- world scalars
    tl.store(o_end_ptr + w, tend.to(tl.int8))
    tl.store(o_restart_ptr + w, restart.to(tl.int8))
    tl.store(o_count_ptr + w, new_count)
    tl.store(o_start_ptr + w, tl.where(restart, stp, tstart))
    tl.store(o_wd_ptr + w, (wd | last).to(tl.int8))


def _empty(shape, dtype, device) -> torch.Tensor:
    """Output allocation of the launcher (a seam for tests, which pre-fill outputs with garbage so
    that an element the kernel fails to write is caught)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _trial_step_triton(goal_now, collided, offroad, removed, present, controlled, slot_active, slot_done,
                       world_done, truncated, episode_end, step, trial_start, trial_count,
                       trial_goal, trial_collided, trial_offroad, trial_score, per_trial_timeout, k_trials):
    _check_params(trial_score, per_trial_timeout, k_trials)
    W, A = controlled.shape
    C = slot_active.shape[1]
    K = trial_score.shape[2]
    dev = goal_now.device
    spec = [(t, (W, A), torch.bool, n) for t, n in (
        (goal_now, "goal_now"), (removed, "removed"), (present, "present"), (controlled, "controlled"))]
    spec += [(t, (W, C), torch.bool, n) for t, n in (
        (collided, "collided"), (offroad, "offroad"), (slot_active, "slot_active"), (slot_done, "slot_done"),
        (trial_goal, "trial_goal"), (trial_collided, "trial_collided"), (trial_offroad, "trial_offroad"))]
    spec += [(t, (W,), torch.bool, n) for t, n in (
        (world_done, "world_done"), (truncated, "truncated"), (episode_end, "episode_end"))]
    spec += [(t, (W,), torch.int32, n) for t, n in (
        (step, "step"), (trial_start, "trial_start"), (trial_count, "trial_count"))]
    spec += [(trial_score, (W, C, K), torch.bool, "trial_score")]
    check_tensors("trial_step", spec, dev)
    if C > A:
        raise ValueError(f"trial_step: {C} policy slots exceed {A} agent slots")
    i8 = lambda t: t.view(torch.int8)  # noqa: E731
    e8 = lambda *s: _empty(s, torch.int8, dev)  # noqa: E731
    o_removed, o_present = e8(W, A), e8(W, A)
    o_end, o_restart, o_wd = e8(W), e8(W), e8(W)
    o_count = _empty((W,), torch.int32, dev)
    o_start = _empty((W,), torch.int32, dev)
    o_wc = [e8(W, C) for _ in range(7)]  # terminal, truncation, trial_ended, slot_done, tg, tc, to
    o_score = e8(W, C, K)
    if W > 0:
        _trial_step_kernel[(W,)](
            i8(goal_now), i8(collided), i8(offroad), i8(removed), i8(present), i8(controlled),
            i8(slot_active), i8(slot_done), i8(world_done), i8(truncated), i8(episode_end),
            step, trial_start, trial_count, i8(trial_goal), i8(trial_collided), i8(trial_offroad), i8(trial_score),
            o_removed, o_present, o_end, o_restart, o_count, o_start, o_wd, *o_wc, o_score,
            A, C, K, int(per_trial_timeout), int(k_trials),
            BLOCK_A=triton.next_power_of_2(max(A, 1)), BLOCK_C=triton.next_power_of_2(max(C, 1)),
            BLOCK_K=triton.next_power_of_2(max(K, 1)),
        )
    b = lambda t: t.view(torch.bool)  # noqa: E731
    return TrialOut(b(o_removed), b(o_present), b(o_end), b(o_restart), o_count, o_start, b(o_wd),
                    *(b(t) for t in o_wc), b(o_score))


def trial_step(
    goal_now, collided, offroad, removed, present, controlled, slot_active, slot_done,
    world_done, truncated, episode_end, step, trial_start, trial_count,
    trial_goal, trial_collided, trial_offroad, trial_score,
    per_trial_timeout: int, k_trials: int, *, backend: str | None = None,
) -> TrialOut:
    """One step of the trial state machine (rules in the module docstring).

    Same signature, semantics and errors as :func:`trial_step_reference`; ``backend``
    (:func:`gpusim.backend.op_backend`, default from ``goal_now``): the Triton kernel (one program
    per world) under ``"triton"`` / ``"cupy"``, else the reference.
    """
    args = (goal_now, collided, offroad, removed, present, controlled, slot_active, slot_done,
            world_done, truncated, episode_end, step, trial_start, trial_count,
            trial_goal, trial_collided, trial_offroad, trial_score, per_trial_timeout, k_trials)
    if op_backend(backend, goal_now) == "triton":
        return _trial_step_triton(*args)
    return trial_step_reference(*args)
