"""Masked PPO update over whole rollout rows (docs/design.md section 12).

Loss (Schulman et al. 2017, "Proximal Policy Optimization Algorithms", with the clipped value loss
of the OpenAI baselines / CleanRL implementations), each term averaged over the steps with
``loss_mask = 1`` only::

    ratio   = exp(logp_new - logp_old)
    pg      = max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps))
    v_clip  = V_old + clip(V_new - V_old, -eps_v, eps_v)
    vf      = 0.5 * max((V_new - R)^2, (v_clip - R)^2)          (or 0.5 (V_new - R)^2 unclipped)
    loss    = pg - ent_coef * entropy + vf_coef * vf

``A`` is normalised per minibatch with the mean and standard deviation of its *valid* entries. A
minibatch without a valid step gives a loss of exactly 0 (no NaN) whose gradient is 0. Masked steps
are removed with ``torch.where`` (not a multiplication), so even a non-finite value at a masked step
cannot leak into the loss or the gradient.

Advantages come from :func:`gpusim.kernels.advantage.advantage` on the minibatch's rows (rows are
whole episodes and the last column never bootstraps, so per-row computation is exact): plain GAE by
default, or, with ``vtrace=True``, V-trace clipping with ``log_rho = logp_new - logp_behaviour``
(detached) recomputed for every minibatch, as PufferLib does.

Speed options for a GPU (all off by default, so a CPU run is bit for bit what it was without them):

* ``autocast="bf16"``: the policy's forward (and so its backward) runs under
  ``torch.autocast(dtype=bfloat16)``; its outputs are cast back to float32 before anything else,
  so the log-probabilities, the entropy, the ratio, the value loss, the advantages and the value
  targets (GAE / V-trace) are all computed in float32.
* ``fused_adam=True``: :func:`make_optimizer` builds ``torch.optim.Adam(fused=True)`` (one kernel
  for every parameter's update) when the parameters are on a CUDA device, the default Adam
  elsewhere.
* ``pack_removed=True``: the policy's forward in the update runs its encoder and per-token layers
  on the non-removed steps only, on every device (``ActorCritic.forward(pack=True)``; the CPU
  always does so). Removed steps (agents out of play after a collision, an off-road exit or the
  goal) are most of a trained policy's rollout rows, so this removes most of the update's work;
  on CUDA it costs one host read per minibatch (the kept-step count).
* Without ``pack_removed`` the update itself reads nothing back to the host: no ``.item()``, ``.tolist()`` or
  data-dependent shape per minibatch (its statistics stay device tensors; the trainer reads them
  once per report). Only the policy's CPU paths read (they pack the kept steps and the valid road
  slots), and the default Adam reads its step counters, which are host tensors on every device.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from gpusim.kernels.advantage import advantage


#: ``PPOConfig.autocast`` values and the dtype each runs the policy forward in (None: no autocast).
AUTOCAST_DTYPES = {"off": None, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class PPOConfig:
    """PPO hyper-parameters.

    Attributes:
        gamma, gae_lambda: discount and GAE lambda.
        vtrace: use V-trace importance clipping (rho_clip, c_clip) on the policy ratio.
        clip_coef: PPO ratio clip epsilon. clip_vloss: clip the value loss (same epsilon unless
            ``vf_clip_coef`` is set). vf_coef, ent_coef: loss weights.
        norm_adv: normalise advantages per minibatch over valid entries.
        max_grad_norm: global gradient-norm clip.
        update_epochs, num_minibatches: nominal optimizer steps per update =
            ``update_epochs * num_minibatches``.
        autocast: ``"off"`` (float32 everywhere) or ``"bf16"`` (the policy forward/backward of the
            update under bfloat16 autocast; log-probabilities, ratio, losses, advantages and
            value targets stay float32). Works on CPU and CUDA; meant for CUDA.
        fused_adam: build the optimizer with ``torch.optim.Adam(fused=True)`` where the
            parameters are on CUDA (:func:`make_optimizer`); ignored on other devices.
        pack_removed: compute the policy's forward in the update on the non-removed steps only,
            on every device (the CPU packs them anyway); on CUDA one host read per minibatch.
            The outputs at the steps trained on are the same (to float32 rounding).

    Raises:
        ValueError: ``autocast`` not one of ``"off"``, ``"bf16"``.
    """

    gamma: float = 0.99
    gae_lambda: float = 0.95
    vtrace: bool = False
    rho_clip: float = 1.0
    c_clip: float = 1.0
    clip_coef: float = 0.2
    clip_vloss: bool = True
    vf_clip_coef: float | None = None
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    norm_adv: bool = True
    max_grad_norm: float = 0.5
    update_epochs: int = 4
    num_minibatches: int = 4
    autocast: Literal["off", "bf16"] = "off"
    fused_adam: bool = False
    pack_removed: bool = False

    def __post_init__(self):
        if self.autocast not in AUTOCAST_DTYPES:
            raise ValueError(f"PPOConfig.autocast must be one of {', '.join(AUTOCAST_DTYPES)}, got {self.autocast!r}")


def make_optimizer(parameters, lr: float, eps: float, fused: bool = False) -> torch.optim.Adam:
    """The trainer's Adam optimizer.

    Args:
        parameters: the policy's parameters (an iterable of tensors).
        lr: learning rate. eps: Adam epsilon.
        fused: use PyTorch's fused CUDA implementation (``fused=True``: one kernel updates every
            parameter instead of a few multi-tensor kernels per step). Taken only when every
            parameter is on a CUDA device; elsewhere (CPU) the default implementation is built,
            the same optimizer as with ``fused=False``, so CPU results do not change.

    Returns:
        ``torch.optim.Adam``; ``optimizer.defaults["fused"]`` tells which implementation it is.
    """
    params = list(parameters)
    use_fused = bool(fused) and len(params) > 0 and all(p.device.type == "cuda" for p in params)
    if use_fused:
        return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)
    return torch.optim.Adam(params, lr=lr, eps=eps)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over ``mask`` (bool, same shape); 0 when the mask is empty. Masked entries
    contribute exactly nothing (also no NaN/inf) to the value and the gradient."""
    n = mask.sum()
    total = torch.where(mask, x, torch.zeros_like(x)).sum()
    return total / n.clamp(min=1).to(x.dtype)


def ppo_loss(policy, mb: dict, cfg: PPOConfig) -> tuple[torch.Tensor, dict]:
    """PPO loss of one minibatch of whole rows.

    Args:
        policy: :class:`policy.ActorCritic`.
        mb: dict with ``obs`` [B, T, D], ``actions``, ``logprobs``, ``values``, ``rewards`` [B, T],
            ``terminal``, ``removed``, ``loss_mask``, ``bootstrap_stop`` [B, T] bool; optionally
            ``prepared=True`` when ``obs`` is ``policy.prepare_obs(obs, removed)`` ([B, T, D']), and
            then optionally ``obs_rows`` [B] int64 when ``obs`` holds more rows and these are the
            minibatch's (``ActorCritic.forward``'s ``rows``).
        cfg: :class:`PPOConfig`.

    Returns:
        ``(loss, stats)``: scalar loss tensor and a dict of detached scalar tensors (pg_loss,
        v_loss, entropy, approx_kl, clipfrac, valid_steps) — all on the device.
    """
    mask = mb["loss_mask"]
    logits, new_values = _policy_forward(policy, mb, cfg.autocast, cfg.pack_removed)
    new_logp = policy.log_prob(logits, mb["actions"])
    entropy = policy.entropy(logits)
    log_ratio = new_logp - mb["logprobs"]
    # keep masked steps finite everywhere (their values may be arbitrary)
    log_ratio = torch.where(mask, log_ratio, torch.zeros_like(log_ratio))
    ratio = log_ratio.exp()

    with torch.no_grad():
        B = mb["rewards"].shape[0]
        last_value = torch.zeros(B, dtype=torch.float32, device=mask.device)
        log_rho = log_ratio.detach() if cfg.vtrace else None
        adv, returns = advantage(
            mb["rewards"], mb["values"], mb["bootstrap_stop"], last_value, cfg.gamma, cfg.gae_lambda,
            log_rho=log_rho, rho_clip=cfg.rho_clip, c_clip=cfg.c_clip,
        )
        if cfg.norm_adv:
            mean = masked_mean(adv, mask)
            var = masked_mean((adv - mean) ** 2, mask)
            adv = (adv - mean) / (var.sqrt() + 1e-8)
        adv = torch.where(mask, adv, torch.zeros_like(adv))
        returns = torch.where(mask, returns, torch.zeros_like(returns))

    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef))
    pg_loss = masked_mean(pg, mask)

    old_v = torch.where(mask, mb["values"], torch.zeros_like(mb["values"]))
    new_v = torch.where(mask, new_values, torch.zeros_like(new_values))
    if cfg.clip_vloss:
        eps_v = cfg.clip_coef if cfg.vf_clip_coef is None else cfg.vf_clip_coef
        v_clipped = old_v + (new_v - old_v).clamp(-eps_v, eps_v)
        v_err = torch.maximum((new_v - returns) ** 2, (v_clipped - returns) ** 2)
    else:
        v_err = (new_v - returns) ** 2
    v_loss = 0.5 * masked_mean(v_err, mask)
    ent = masked_mean(entropy, mask)
    loss = pg_loss - cfg.ent_coef * ent + cfg.vf_coef * v_loss

    with torch.no_grad():
        stats = {
            "pg_loss": pg_loss.detach(),
            "v_loss": v_loss.detach(),
            "entropy": ent.detach(),
            "approx_kl": masked_mean((ratio - 1) - log_ratio, mask),
            "clipfrac": masked_mean(((ratio - 1).abs() > cfg.clip_coef).float(), mask),
            "valid_steps": mask.sum().float(),
        }
    return loss, stats


def _policy_forward(policy, mb: dict, autocast: str, pack: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy's ``(logits, values)`` for the minibatch, float32; with ``autocast`` ``"bf16"``
    computed under bfloat16 autocast and cast back (``.float()`` is a no-op on float32 outputs);
    with ``pack`` on the non-removed steps only, on every device (``ActorCritic.forward(pack=True)``)."""
    dtype = AUTOCAST_DTYPES[autocast]
    scope = (torch.autocast(device_type=mb["loss_mask"].device.type, dtype=dtype) if dtype is not None
             else contextlib.nullcontext())
    kw = {"pack": True} if pack else {}
    with scope:
        if mb.get("prepared", False):  # obs from policy.prepare_obs (ppo_update): compact, removed steps cleared
            logits, values = policy(mb["obs"], mb["terminal"], mb["removed"], prepared=True, rows=mb.get("obs_rows"),
                                    **kw)
        else:
            logits, values = policy(mb["obs"], mb["terminal"], mb["removed"], **kw)
    return logits.float(), values.float()


def optimizer_steps(effective_steps: int, nominal_steps: int, cfg: PPOConfig) -> int:
    """Number of optimizer steps for an update whose experience hook kept ``effective_steps`` of
    ``nominal_steps`` valid steps.

    ``n = round(update_epochs * num_minibatches * effective / nominal)`` (round half up), at least 1
    when ``effective > 0`` (any trainable step gets one step, even below one nominal minibatch of
    data), and 0 when ``effective == 0`` or ``nominal == 0``. With the identity hook it is exactly
    ``update_epochs * num_minibatches``.
    """
    if effective_steps <= 0 or nominal_steps <= 0:
        return 0
    nominal_opt = cfg.update_epochs * cfg.num_minibatches
    n = int(math.floor(nominal_opt * effective_steps / nominal_steps + 0.5))
    return max(1, n)


def ppo_update(policy: nn.Module, optimizer: torch.optim.Optimizer, batch, cfg: PPOConfig, n_steps: int,
               rows_per_minibatch: int, active_rows: torch.Tensor, generator: torch.Generator | None = None) -> dict:
    """Run ``n_steps`` optimizer steps on minibatches of whole rows.

    Rows are visited in random permutations of ``active_rows`` (rows with at least one valid
    step), ``rows_per_minibatch`` at a time; a new permutation starts when one is used up (one
    "epoch"). The last minibatch of a permutation may be smaller.

    Args:
        policy: :class:`policy.ActorCritic`. optimizer: its optimizer.
        batch: :class:`train.rollout.RolloutBatch`.
        cfg: :class:`PPOConfig`. n_steps: optimizer steps (from :func:`optimizer_steps`).
        rows_per_minibatch: rows per minibatch (>= 1).
        active_rows: [n] int64 row indices to draw from (on the device).
        generator: torch generator for the permutations (on the batch's device).

    Returns:
        dict of scalar device tensors averaged over the steps (empty-statistics zeros when
        ``n_steps == 0``) plus ``grad_norm``.
    """
    device = batch.device
    keys = ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac", "valid_steps", "grad_norm")
    totals = {k: torch.zeros((), device=device) for k in keys}
    if n_steps <= 0 or active_rows.numel() == 0:
        return totals
    stop = batch.bootstrap_stop()
    # the forward's memory resets: episode ends, and trial ends for the memoryless control
    # (PolicyConfig.memory "trial", as the rollout's actor acted; docs/trial.md)
    memory = getattr(getattr(getattr(policy, "module", policy), "config", None), "memory", "episode")
    reset = batch.terminal | batch.truncation if memory == "trial" else batch.terminal
    n_rows = active_rows.numel()
    # once per update, not per minibatch: the active rows' observations as the encoder reads them
    # (unused road slots dropped, removed steps cleared; policy.prepare_obs), indexed by position
    prepare = getattr(policy, "prepare_obs", None)
    obs = prepare(batch.obs[active_rows], batch.removed[active_rows]) if prepare is not None else None
    perm = pos = None
    cursor = n_rows
    policy.train()
    for _ in range(n_steps):
        if cursor >= n_rows:
            pos = torch.randperm(n_rows, generator=generator, device=device)
            perm = active_rows[pos]
            cursor = 0
        idx = perm[cursor: cursor + rows_per_minibatch]
        mb = {
            "actions": batch.actions[idx], "logprobs": batch.logprobs[idx],
            "values": batch.values[idx], "rewards": batch.rewards[idx], "terminal": reset[idx],
            "removed": batch.removed[idx], "loss_mask": batch.loss_mask[idx], "bootstrap_stop": stop[idx],
        }
        if obs is not None:
            # the whole prepared tensor and the minibatch's rows in it: the forward copies only
            # the rows' kept steps (one copy instead of a minibatch copy and a kept-step copy)
            mb["obs"], mb["obs_rows"], mb["prepared"] = obs, pos[cursor: cursor + rows_per_minibatch], True
        else:
            mb["obs"] = batch.obs[idx]
        cursor += rows_per_minibatch
        loss, stats = ppo_loss(policy, mb, cfg)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
        optimizer.step()
        for k, v in stats.items():
            totals[k] += v
        totals["grad_norm"] += grad_norm.detach()
    return {k: v / n_steps for k, v in totals.items()}
