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
  goal) are most of a trained policy's rollout rows, so this removes most of the update's work.
  The packed size of every minibatch (its kept-step count) is read once per update, all
  minibatches at once (:func:`ppo_update` draws the update's permutations first), so the
  minibatch loop reads nothing (``ActorCritic.forward(kept=...)``); a test counts the reads.
* ``ent_coef_final``: the entropy coefficient goes linearly from ``ent_coef`` at the start of the
  run to ``ent_coef_final`` at its end (:meth:`PPOConfig.at_progress`, applied by the trainer
  before each update, like the learning-rate annealing); the update reports the coefficient it
  used (``ent_coef``).
* Without ``pack_removed`` the update itself reads nothing back to the host: no ``.item()``, ``.tolist()`` or
  data-dependent shape per minibatch (its statistics stay device tensors; the trainer reads them
  once per report). Only the policy's CPU paths read (they pack the kept steps and the valid road
  slots), and the default Adam reads its step counters, which are host tensors on every device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from gpusim.config import check_finite
from gpusim.kernels.advantage import advantage
from policy.actor import memory_reset, resets_at_trial


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
        ent_coef_final: the entropy schedule: ``ent_coef`` falls (or rises) linearly over the run
            to this value (:meth:`at_progress`); ``None`` (default): constant ``ent_coef``.
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
            on every device (the CPU packs them anyway); one host read per update (the packed
            size of every minibatch). The outputs at the steps trained on are the same (to
            float32 rounding).
        human_kl: HR-PPO's coefficient (``train/human.py``): ``human_kl * KL(pi || pi_BC)`` on the
            update's valid steps is added to the loss; 0: off.
        human_policy: the checkpoint of ``pi_BC`` (``train/bc.py``), frozen; needed when
            ``human_kl`` > 0 and refused without it (it would do nothing).
        value_warmup: the first this many updates train the value head only (the other
            parameters get no gradient), e.g. after ``--init-policy`` from a BC checkpoint.

    Raises:
        ValueError: ``autocast`` not one of ``"off"``, ``"bf16"``; a non-finite number
            (:func:`gpusim.config.check_finite`); ``human_kl`` or ``value_warmup`` < 0;
            ``human_kl`` > 0 without ``human_policy``, or ``human_policy`` with ``human_kl`` 0.
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
    ent_coef_final: float | None = None
    norm_adv: bool = True
    max_grad_norm: float = 0.5
    update_epochs: int = 4
    num_minibatches: int = 4
    autocast: Literal["off", "bf16"] = "off"
    fused_adam: bool = False
    pack_removed: bool = False
    human_kl: float = 0.0
    human_policy: str | None = None
    value_warmup: int = 0

    def __post_init__(self):
        check_finite(self)
        if self.autocast not in AUTOCAST_DTYPES:
            raise ValueError(f"PPOConfig.autocast must be one of {', '.join(AUTOCAST_DTYPES)}, got {self.autocast!r}")
        if self.human_kl < 0 or self.value_warmup < 0:
            raise ValueError(f"PPOConfig.human_kl and value_warmup must be >= 0, got {self.human_kl}, {self.value_warmup}")
        if self.human_kl > 0 and not self.human_policy:
            raise ValueError("PPOConfig.human_kl > 0 needs human_policy (--ppo.human-policy PATH, a train/bc.py "
                             "checkpoint)")
        if self.human_policy and self.human_kl == 0:
            raise ValueError(f"PPOConfig.human_policy {self.human_policy} does nothing with human_kl 0: pass "
                             f"--ppo.human-kl COEF > 0 for HR-PPO, or drop --ppo.human-policy")


    def at_progress(self, progress: float) -> "PPOConfig":
        """The settings of the update at ``progress`` (agent-steps done / total, clipped to
        [0, 1]): with ``ent_coef_final`` set, ``ent_coef`` becomes
        ``ent_coef + progress * (ent_coef_final - ent_coef)`` (the linear schedule); otherwise
        ``self`` unchanged."""
        if self.ent_coef_final is None:
            return self
        f = min(max(float(progress), 0.0), 1.0)
        return dataclasses.replace(self, ent_coef=self.ent_coef + f * (self.ent_coef_final - self.ent_coef))


def linear_lr(base: float, progress: float) -> float:
    """The learning-rate anneal of ``--anneal-lr`` (``train/run.py`` and ``train/bc.py``): ``base``
    falling linearly to 0 as ``progress`` (the share of the run done, in the caller's unit: agent-steps
    for PPO, epochs for BC) goes from 0 to 1; 0 past the end."""
    return base * max(1.0 - progress, 0.0)


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


def ppo_loss(policy, mb: dict, cfg: PPOConfig, human=None, value_only: bool = False) -> tuple[torch.Tensor, dict]:
    """PPO loss of one minibatch of whole rows.

    Args:
        policy: :class:`policy.ActorCritic`.
        mb: dict with ``obs`` [B, T, D], ``actions``, ``logprobs``, ``values``, ``rewards`` [B, T],
            ``terminal``, ``removed``, ``loss_mask``, ``bootstrap_stop`` [B, T] bool; optionally
            ``prepared=True`` when ``obs`` is ``policy.prepare_obs(obs, removed)`` ([B, T, D']), and
            then optionally ``obs_rows`` [B] int64 when ``obs`` holds more rows and these are the
            minibatch's (``ActorCritic.forward``'s ``rows``).
        cfg: :class:`PPOConfig`.
        human: the frozen BC policy of HR-PPO (None: no KL term); its input is ``mb["human_obs"]``
            (its own ``prepare_obs`` of the rows; ``mb["obs"]`` when absent), its forward runs
            over the same rows with its own memory. The loss gets ``cfg.human_kl *
            masked_mean(KL(pi || pi_BC))`` (:func:`policy_kl`).
        value_only: the loss is ``vf_coef * v_loss`` alone (value warm-up).

    Returns:
        ``(loss, stats)``: scalar loss tensor and a dict of detached scalar tensors (pg_loss,
        v_loss, entropy, approx_kl, clipfrac, valid_steps, and human_kl with ``human``) — all on
        the device.
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
    human_kl = None
    if human is not None:
        with torch.no_grad():
            ref_mb = {**mb, "obs": mb.get("human_obs", mb["obs"]), "obs_rows": mb.get("human_rows", mb.get("obs_rows"))}
            ref_logits, _ = _policy_forward(human, ref_mb, cfg.autocast, cfg.pack_removed)
        human_kl = masked_mean(policy_kl(policy, logits, human, ref_logits), mask)
        loss = loss + cfg.human_kl * human_kl
    if value_only:
        loss = cfg.vf_coef * v_loss

    with torch.no_grad():
        stats = {
            "pg_loss": pg_loss.detach(),
            "v_loss": v_loss.detach(),
            "entropy": ent.detach(),
            "approx_kl": masked_mean((ratio - 1) - log_ratio, mask),
            "clipfrac": masked_mean(((ratio - 1).abs() > cfg.clip_coef).float(), mask),
            "valid_steps": mask.sum().float(),
        }
        if human_kl is not None:
            stats["human_kl"] = human_kl.detach()
    return loss, stats


def policy_kl(policy, logits: torch.Tensor, ref, ref_logits: torch.Tensor) -> torch.Tensor:
    """KL(pi || pi_ref) [...] float32 (nats) per step, exact for both heads.

    Args:
        policy, ref: :class:`policy.ActorCritic` with the same action space (``ref`` frozen).
        logits, ref_logits: [..., A] their head outputs (categorical logits, or Gaussian means
            with each policy's state-independent ``log_std``).

    Discrete: ``sum_a p(a) (log p(a) - log q(a))``. Continuous (diagonal Gaussians, summed over
    the action dimensions): ``log(s_q / s_p) + (s_p^2 + (m_p - m_q)^2) / (2 s_q^2) - 1/2``.
    """
    if policy.continuous:
        ls_p, ls_q = policy.log_std, ref.log_std
        var_p, var_q = (2 * ls_p).exp(), (2 * ls_q).exp()
        return (ls_q - ls_p + (var_p + (logits - ref_logits) ** 2) / (2 * var_q) - 0.5).sum(-1)
    logp = torch.log_softmax(logits, dim=-1)
    logq = torch.log_softmax(ref_logits, dim=-1)
    return (logp.exp() * (logp - logq)).sum(-1)


def _policy_forward(policy, mb: dict, autocast: str, pack: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy's ``(logits, values)`` for the minibatch, float32; with ``autocast`` ``"bf16"``
    computed under bfloat16 autocast and cast back (``.float()`` is a no-op on float32 outputs);
    with ``pack`` on the non-removed steps only, on every device (``ActorCritic.forward(pack=True)``)."""
    dtype = AUTOCAST_DTYPES[autocast]
    scope = (torch.autocast(device_type=mb["loss_mask"].device.type, dtype=dtype) if dtype is not None
             else contextlib.nullcontext())
    kw = {"pack": True} if pack else {}
    if pack and mb.get("kept") is not None:  # the minibatch's kept-step count, read once per update
        kw["kept"] = mb["kept"]
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


class NonFiniteLoss(ValueError):
    """A loss statistic of an update is NaN or infinite: training stops there (the trainer prints
    the message as one line and exits with code 2; the checkpoint of an earlier update is kept)."""


def check_losses(stats: dict, update: int) -> None:
    """Stop training at an update whose statistics (:func:`ppo_update`'s: ``pg_loss``, ``v_loss``,
    ``entropy``, ``approx_kl``, ..., ``grad_norm``; every scalar it returns) are not all finite. One
    host read per update (the statistics stacked); the trainer calls it after each update, before
    the update can be reported or checkpointed, so the last checkpoint written holds finite weights.

    Args:
        stats: name -> scalar tensor. update: the update's number (1-based, for the message).

    Raises:
        NonFiniteLoss: naming the update and the non-finite terms with their values.
    """
    if not stats:
        return
    names = list(stats)
    values = torch.stack([torch.as_tensor(stats[k]).float().reshape(()) for k in names]).tolist()
    bad = [f"{k} {v}" for k, v in zip(names, values) if not math.isfinite(v)]
    if bad:
        raise NonFiniteLoss(f"update {update}: non-finite loss ({', '.join(bad)}); training stopped before saving "
                            "this update (the last checkpoint is kept). Look for NaN/inf in the rewards, the "
                            "experience hook's arguments or a too large --learning-rate")


def ppo_update(policy: nn.Module, optimizer: torch.optim.Optimizer, batch, cfg: PPOConfig, n_steps: int,
               rows_per_minibatch: int, active_rows: torch.Tensor, generator: torch.Generator | None = None,
               human=None, value_only: bool = False) -> dict:
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
        human: HR-PPO's frozen BC policy (:func:`ppo_loss`); its ``prepare_obs`` of the active
            rows is computed once per update, like the policy's.
        value_only: value warm-up: the loss is the value loss and only the ``critic`` head's
            parameters get gradients (the others' are cleared before the optimizer step).

    Returns:
        dict of scalar device tensors averaged over the steps (empty-statistics zeros when
        ``n_steps == 0``) plus ``grad_norm``; with ``human`` also ``human_kl`` and
        ``human_kl_coef``; ``value_warmup`` (1 during the warm-up, else 0); ``ent_coef`` (the
        entropy coefficient used, :meth:`PPOConfig.at_progress`).

    With ``cfg.pack_removed`` the update's permutations are drawn first and the kept-step count
    of every minibatch is read in one transfer (the only host read of the update); without it the
    update reads nothing (the policy's CPU-only paths aside).
    """
    device = batch.device
    keys = ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac", "valid_steps", "grad_norm")
    keys = keys + (("human_kl",) if human is not None else ())
    totals = {k: torch.zeros((), device=device) for k in keys}
    # torch.full: filled on the device (torch.tensor of a number would copy it from the host)
    fixed = {"value_warmup": torch.full((), float(value_only), device=device),
             "ent_coef": torch.full((), float(cfg.ent_coef), device=device)}
    if human is not None:
        fixed["human_kl_coef"] = torch.full((), float(cfg.human_kl), device=device)
        human_obs = human.prepare_obs(batch.obs[active_rows], batch.removed[active_rows])
    if n_steps <= 0 or active_rows.numel() == 0:
        return totals
    stop = batch.bootstrap_stop()
    # the forward's memory resets: episode ends, and trial ends for the memoryless control
    # (PolicyConfig.memory "trial", as the rollout's actor acted; docs/trial.md)
    reset = memory_reset(batch.terminal, batch.truncation, resets_at_trial(policy))
    n_rows = active_rows.numel()
    # once per update, not per minibatch: the active rows' observations as the encoder reads them
    # (unused road slots dropped, removed steps cleared; policy.prepare_obs), indexed by position
    prepare = getattr(policy, "prepare_obs", None)
    obs = prepare(batch.obs[active_rows], batch.removed[active_rows]) if prepare is not None else None
    # the update's minibatches (rows, and their positions in active_rows), drawn before any step
    plan, pos, cursor = [], None, n_rows
    for _ in range(n_steps):
        if cursor >= n_rows:
            pos = torch.randperm(n_rows, generator=generator, device=device)
            cursor = 0
        plan.append(pos[cursor: cursor + rows_per_minibatch])
        cursor += rows_per_minibatch
    kept = [None] * n_steps
    if cfg.pack_removed:  # the packed size of every minibatch: the update's one host read
        kept_per_row = (~batch.removed.index_select(0, active_rows)).sum(dim=1)
        kept = torch.stack([kept_per_row.index_select(0, p).sum() for p in plan]).tolist()
    policy.train()
    for step in range(n_steps):
        mb_pos = plan[step]
        idx = active_rows.index_select(0, mb_pos)
        mb = {
            "actions": batch.actions[idx], "logprobs": batch.logprobs[idx],
            "values": batch.values[idx], "rewards": batch.rewards[idx], "terminal": reset[idx],
            "removed": batch.removed[idx], "loss_mask": batch.loss_mask[idx], "bootstrap_stop": stop[idx],
        }
        if obs is not None:
            # the whole prepared tensor and the minibatch's rows in it: the forward copies only
            # the rows' kept steps (one copy instead of a minibatch copy and a kept-step copy)
            mb["obs"], mb["obs_rows"], mb["prepared"] = obs, mb_pos, True
        else:
            mb["obs"] = batch.obs[idx]
        mb["kept"] = kept[step]
        if human is not None:
            mb["human_obs"], mb["human_rows"] = human_obs, mb_pos
        loss, stats = ppo_loss(policy, mb, cfg, human=human, value_only=value_only)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if value_only:  # value warm-up: only the value head moves
            for name, p in policy.named_parameters():
                if not (name.startswith("critic.") or ".critic." in name):
                    p.grad = None
        grad_norm = nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
        optimizer.step()
        for k, v in stats.items():
            totals[k] += v
        totals["grad_norm"] += grad_norm.detach()
    return {**{k: v / n_steps for k, v in totals.items()}, **fixed}
