"""Human-regularised PPO (HR-PPO) and BC initialisation for ``train/run.py``.

HR-PPO (Cornelisse & Vinitsky 2024, "Human-compatible driving partners through data-regularized
self-play reinforcement learning", arXiv 2403.19648) adds ``human_kl * KL(pi || pi_BC)`` on the
visited states to the PPO loss, where ``pi_BC`` is a frozen behaviour-cloned policy
(``train/bc.py``). :func:`train.ppo.ppo_loss` computes the term; this module loads the BC policy
(``--ppo.human-policy PATH``), refuses one made for another observation layout, action space or
dynamics, records the file's SHA-256 in the checkpoints and refuses a changed file on resume, and
loads ``--init-policy PATH`` weights into a new run's policy.
"""

from __future__ import annotations

import hashlib
import pathlib

import torch

from gpusim.config import ActionSpace
from train.config import UserError, env_config_from_dict, resolve_path

#: Key of the BC file's SHA-256 in a checkpoint's ``extra``.
SHA_KEY = "human_policy_sha256"
#: The ego columns of the trial clock (:data:`gpusim.kernels.obs_layout.EGO_EXTRA`): 0 outside trial mode.
TRIAL_CLOCK_COLUMNS = ("trial_index", "time_in_trial")


def unseen_clock_columns(env_config, trained_config: dict) -> tuple:
    """The ego columns whose input weights a checkpoint never trained and that ``env_config``'s run
    feeds: :data:`TRIAL_CLOCK_COLUMNS` when ``env_config`` (an EnvConfig) is in trial mode and the
    checkpoint's ``trained_config`` (its saved ``env_config`` dict) was not, else ``()``. The one
    rule of ``--init-policy``, ``--ppo.human-policy`` and the evaluator's note."""
    if env_config.trial_mode and not env_config_from_dict(trained_config).trial_mode:
        return TRIAL_CLOCK_COLUMNS
    return ()


def file_sha256(path) -> str:
    """Hex SHA-256 of the file at ``path`` (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _checkpoint_file(path: str, flag: str) -> pathlib.Path:
    p = resolve_path(path)
    if p.is_dir() and (p / "checkpoint.pt").is_file():
        p = p / "checkpoint.pt"
    if not p.is_file():
        raise UserError(f"{flag} {path}: no such checkpoint file")
    return p


def load_frozen(path: str, flag: str, env, env_config, check_layout: bool = True):
    """The frozen policy of the checkpoint ``path`` for driving ``env`` (set up as ``env_config``);
    ``check_layout`` False: its observation layout may differ from ``env``'s (``--init-policy``).

    Returns:
        ``(policy, payload, file)``: the :class:`policy.ActorCritic` (eval mode, no gradients, on
        ``env.device``), the checkpoint dict and its resolved file.

    Raises:
        UserError: one line naming ``flag`` and the difference: observation layout, action count or
            action space (:class:`train.checkpoint.PolicyMismatch`), or dynamics; an unreadable file.
    """
    from train.checkpoint import CheckpointError, PolicyMismatch, load_policy

    file = _checkpoint_file(path, flag)
    continuous = int(env_config.action_space) == int(ActionSpace.CONTINUOUS)
    try:
        policy, payload = load_policy(file, env.device, env.obs_layout if check_layout else None, env.num_actions,
                                      continuous)
    except PolicyMismatch as e:
        raise UserError(f"{flag} {path}: {e.detail}") from None
    except CheckpointError as e:
        raise UserError(f"{flag} {path}: {e}") from None
    theirs = env_config_from_dict(payload["env_config"])
    for name in ("dynamics", "action_space", "dt"):
        if getattr(theirs, name) != getattr(env_config, name):
            raise UserError(f"{flag} {path}: trained with {name} {getattr(theirs, name)}, this run uses "
                            f"{getattr(env_config, name)}; use a policy of this run's {name}")
    return policy, payload, file


def human_policy(cfg, env, env_config, ckpt: dict | None):
    """The frozen BC policy of HR-PPO and its file's SHA-256, or ``(None, None)`` without
    ``--ppo.human-policy`` (PPOConfig refuses it with ``--ppo.human-kl 0``).

    Args:
        cfg: the run's :class:`train.config.TrainConfig`. env, env_config: the run's env and setting.
        ckpt: the checkpoint being resumed (None: a new run); its recorded SHA-256 must match.

    A BC policy trained outside trial mode anchors a trial-mode run with its trial-clock input
    weights at 0 (as :func:`init_policy` starts a policy): those weights were never trained.

    Raises:
        UserError: as :func:`load_frozen`; the file changed since the checkpoint was written; a
            resumed HR-PPO run without ``--ppo.human-policy``.
    """
    recorded = ((ckpt or {}).get("extra") or {}).get(SHA_KEY)
    if not cfg.ppo.human_policy or cfg.ppo.human_kl <= 0:
        if recorded is not None:
            saved = ((ckpt.get("config") or {}).get("ppo") or {})
            raise UserError(f"--resume: the run trained with --ppo.human-policy {saved.get('human_policy')} "
                            f"--ppo.human-kl {saved.get('human_kl')}; pass both again to continue it")
        return None, None
    flag = "--ppo.human-policy"
    policy, payload, file = load_frozen(cfg.ppo.human_policy, flag, env, env_config)
    unseen = unseen_clock_columns(env_config, payload["env_config"])
    with torch.no_grad():  # its trial-clock weights were never trained (init_policy does the same)
        policy.state_dict()[policy.EGO_INPUT][:, policy.ego_input_columns(unseen)] = 0.0
    sha = file_sha256(file)
    if recorded is not None and recorded != sha:
        raise UserError(f"{flag} {cfg.ppo.human_policy}: the file changed since the run's checkpoint was written "
                        f"(SHA-256 {sha[:12]}..., recorded {recorded[:12]}...); pass the original BC checkpoint")
    return policy, sha


def init_policy(policy, path: str, env, env_config) -> list[str]:
    """Load the weights of checkpoint ``path`` (e.g. ``train/bc.py``'s, or a shipped driver) into
    ``policy`` in place (``--init-policy``).

    The checkpoint may read another observation layout in the blocks the ego MLP reads besides
    ``ego`` (the candidate block of the memory task, the style block): those blocks' input columns
    start at 0 and every other weight is copied (:meth:`policy.ActorCritic.init_from`), so the run
    starts from the checkpoint's function. The same holds for the trial clock
    (:data:`TRIAL_CLOCK_COLUMNS`) when this run is in trial mode and the checkpoint was not: those
    columns were 0 in all of its training, so their weights are untrained noise, and they start at 0.

    Returns:
        notes to print: one line when some blocks or the trial-clock columns start at 0, or blocks are
        dropped; else none.

    Raises:
        UserError: as :func:`load_frozen` (action count or space, dynamics, an unreadable file);
            other policy sizes than the run's ``--policy.*``; another layout outside those blocks.
    """
    flag = "--init-policy"
    source, payload, _ = load_frozen(path, flag, env, env_config, check_layout=False)
    unseen = unseen_clock_columns(env_config, payload["env_config"])
    try:
        blocks = policy.init_from(source, unseen)
    except ValueError as e:
        raise UserError(f"{flag} {path}: {e}") from None
    said = [f"blocks {', '.join(blocks[k])} {what}" for k, what in
            (("fresh", "start with input weights 0 (not read by the checkpoint)"),
             ("dropped", "of the checkpoint are not read by this run")) if blocks[k]]
    if unseen:
        said.append(f"the ego columns {', '.join(unseen)} start with input weights 0 (always 0 while the "
                    "checkpoint trained: it was not in trial mode)")
    return [f"note: {flag} {path}: every weight copied; " + "; ".join(said)] if said else []
