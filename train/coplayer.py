"""Co-player population play (docs/design.md section 10): frozen partner policies drive the
co-player slots of every world while the ego policy learns (or is evaluated).

* **Roles** come from the env (``EnvState.ego`` [W, C], ``gpusim/sim/roles.py``): with
  ``--coplayer`` the trainer defaults to one ego per world (the SDC where it is controllable,
  :func:`coplayer_env_config`), every other controlled slot is a co-player.
* **Population**: :class:`CoplayerPool` loads each checkpoint once (``train.checkpoint``), builds its
  :class:`policy.ActorCritic` from the checkpoint's own description (a partner may differ in size
  from the ego), freezes it (``requires_grad_(False)``, eval mode) and keeps it on the device. At
  each episode start one partner is drawn per world (uniformly, the pool's own seeded generator).
* **Batched forward**: per env step, one ``forward_eval`` per partner checkpoint over all the
  co-player slots that use it (gathered with ``index_select``), each partner with its own KV
  cache; its actions are written into the ego's action tensor with ``index_copy`` (fixed shapes
  within an episode, no host sync per step). The slot lists are built once per episode (one
  ``nonzero`` per partner: the only host sync, at the episode start, where the trainer syncs anyway).
* **Memory**: a co-player's cache is cleared at every trial start (``truncation``) and at its
  episode end (``terminal``), so a partner behaves as the same stationary "person" in every trial
  and trial k differs from trial 1 only through the ego's memory (docs/trial.md).
* Partners act by argmax by default (``deterministic=True``; ``--coplayer-sample`` samples with
  torch's global generator instead).
* ``--coplayer PATH@STYLE`` specs are parsed here (:func:`partner_styles`), for the trainer and the
  evaluator alike: the evaluation package (``train.eval``) imports this module, never the reverse
  (``tests/test_layering.py``).

Training side (``train/rollout.py``): co-player steps get ``loss_mask = 0`` and do not count as
active slots, so they never enter the PPO loss, the advantage normalisation, the optimizer-step
count or ``global_step``. Metrics: the env logs egos and co-players apart (``DriveEnv.metrics(role=)``);
:func:`report_metrics` adds ``ego/*`` and ``coplayer/*`` to a training report.
"""

from __future__ import annotations

import dataclasses
import pathlib

import torch

from gpusim.styles import STYLES, style_values
from train.config import UserError, resolve_path


def partner_styles(specs) -> tuple[list[str], tuple | None]:
    """Split ``--coplayer PATH@STYLE`` specs: ``(paths, [P][R] style table or None)``. The distinct
    styles form the table (one drawn per world per episode); a path without ``@`` uses
    ``default`` when another spec names a style. The style is what follows the last ``@``,
    unless the whole spec is an existing file or directory or that part holds a path separator:
    a path may itself contain ``@`` (``runs/a@b/checkpoint.pt``, ``runs/x.pt@fast``).

    Raises:
        UserError: an unknown style name.
    """
    import os

    paths, names = [], []
    for spec in specs:
        path, at, name = str(spec).rpartition("@")
        if not at or "/" in name or os.sep in name or resolve_path(str(spec)).exists():
            path, name = str(spec), ""
        paths.append(path)
        if name and name not in STYLES and "," not in name:
            raise UserError(f"--coplayer {spec}: unknown style {name!r}; named styles: {', '.join(STYLES)}")
        names.append(name)
    if not any(names):
        return paths, None
    table = []
    for name in dict.fromkeys(n or "default" for n in names):
        try:
            table.append(style_values(name, what="--coplayer"))
        except ValueError as e:
            raise UserError(str(e)) from None
    return list(dict.fromkeys(paths)), tuple(table)


def coplayer_env_config(env_config, coplayer_paths, user_set: set[str] = frozenset()):
    """The env config of a run: with partner checkpoints and no role flag set by the user
    (``ego_slots`` / ``ego_fraction`` in ``user_set`` or already > 0), one ego per world
    (``ego_slots=1``); unchanged otherwise (no ``--coplayer``: every controlled slot is an ego).
    ``PATH@STYLE`` specs set the partners' style table (``EnvConfig.partner_styles``,
    :func:`partner_styles`; docs/styles.md).

    Raises:
        UserError: an unknown style, or a style without ``--env.reward-conditioning``."""
    _, table = partner_styles(coplayer_paths or ())
    if table is not None:
        if not env_config.reward_conditioning:
            raise UserError("--coplayer PATH@STYLE needs --env.reward-conditioning (partner styles are reward "
                            "weights the partners observe)")
        env_config = env_config.replace(partner_styles=table)
    if not coplayer_paths or env_config.has_coplayers or {"ego_slots", "ego_fraction"} & set(user_set):
        return env_config
    return env_config.replace(ego_slots=1)


@dataclasses.dataclass
class Partner:
    """One frozen partner: ``label`` (file name and training step), ``path``, ``policy``
    (:class:`policy.ActorCritic`, frozen, eval mode, on the device)."""

    label: str
    path: str
    policy: torch.nn.Module


def partner_file(path: str) -> pathlib.Path:
    """The checkpoint file of ``--coplayer PATH``: the file, or ``checkpoint.pt`` of a run directory.

    Raises:
        UserError: neither exists (names the path).
    """
    p = resolve_path(path)
    if p.is_dir() and (p / "checkpoint.pt").is_file():
        p = p / "checkpoint.pt"
    if not p.is_file():
        raise UserError(f"--coplayer {path}: no such checkpoint file or run directory")
    return p


def load_partner(path: str, obs_layout, num_actions: int, continuous: bool, device,
                 reward_conditioning: bool | None = None) -> Partner:
    """Load one partner checkpoint, frozen and on ``device``.

    Args:
        path: checkpoint file of ``train/run.py`` or its run directory.
        obs_layout: the env's observation layout (the partner must read the same observation).
        num_actions, continuous: the env's action space.
        reward_conditioning: the env's ``reward_conditioning`` (None: unknown), to name a partner
            whose observations differ by it as such.

    Raises:
        UserError: missing file, a partner trained with reward conditioning for an env without it
            (or the reverse), or a checkpoint whose observation/action sizes do not match the env
            (message names the path and both sizes). CheckpointError: unreadable file.
    """
    from train.checkpoint import PolicyMismatch, load_checkpoint, load_policy

    p = partner_file(path)
    try:
        policy, ck = load_policy(p, device, obs_layout, num_actions, continuous)
    except PolicyMismatch as e:
        theirs = bool((load_checkpoint(p).get("env_config") or {}).get("reward_conditioning", False))
        if reward_conditioning is not None and theirs != bool(reward_conditioning):
            on = lambda x: "with" if x else "without"  # noqa: E731
            raise UserError(f"--coplayer {path}: the partner was trained {on(theirs)} reward conditioning and this "
                            f"env runs {on(reward_conditioning)} it (--env.reward-conditioning), so it reads other "
                            "observations; use a partner trained the same way") from None
        raise UserError(f"--coplayer {path}: {e.detail}; train the partner with the same "
                        "--env.num-partners/--env.num-roads and action space") from None
    label = f"{p.parent.name}/{p.name}@{int(ck.get('global_step', 0))}"
    return Partner(label=label, path=str(p), policy=policy)


class CoplayerPool:
    """Frozen partner policies driving the co-player slots of a :class:`gpusim.env.DriveEnv`.

    Args:
        partners: list of :class:`Partner` (>= 1).
        num_worlds, num_slots, horizon: the env's W, C and H.
        device: the env's device.
        seed: seed of the per-world partner draws.
        deterministic: partners take argmax (discrete) / mean (continuous) actions.

    Attributes:
        partner_of: [W] int64 partner index of each world in the current episode.
        last_logits: per partner, the logits of the last :meth:`act` (``None`` when unused), for tests.

    Use: :meth:`begin` at every episode start, :meth:`act` before every ``env.step``,
    :meth:`observe` after it.

    Raises:
        ValueError: an empty partner list.
    """

    def __init__(self, partners: list[Partner], num_worlds: int, num_slots: int, horizon: int, device,
                 seed: int = 0, deterministic: bool = True):
        if not partners:
            raise ValueError("CoplayerPool: at least one partner checkpoint is needed")
        self.partners = list(partners)
        self.W, self.C, self.H = int(num_worlds), int(num_slots), int(horizon)
        self.device = torch.device(device)
        self.deterministic = bool(deterministic)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed))
        self.partner_of = torch.zeros(self.W, dtype=torch.int64, device=self.device)
        self._index: list[torch.Tensor] = []
        self._actors: list = []  # per partner: a policy.actor.Actor over its co-player slots, or None
        self.last_logits: list = [None] * len(self.partners)

    @property
    def labels(self) -> list[str]:
        """Partner labels in pool order."""
        return [p.label for p in self.partners]

    def begin(self, env, generator_draw: bool = True) -> None:
        """A new episode starts: draw one partner per world (``generator_draw``; else keep
        :attr:`partner_of`, e.g. set by a test), list each partner's co-player slots (one host
        read) and give each partner a fresh cache of that many slots."""
        if generator_draw:
            self.partner_of = torch.randint(len(self.partners), (self.W,), generator=self.generator,
                                            device=self.device)
        from policy.actor import Actor

        state = env.state
        cop = (state.slot_active & ~state.ego).reshape(-1)
        owner = self.partner_of[:, None].expand(self.W, self.C).reshape(-1)
        self._index, self._actors = [], []
        for p, partner in enumerate(self.partners):
            idx = torch.nonzero(cop & (owner == p)).flatten()
            n = int(idx.numel())
            self._index.append(idx)
            self._actors.append(Actor(partner.policy, n, self.H, self.device, self.deterministic, reset_at_trial=True)
                                if n else None)
            self.last_logits[p] = None

    @torch.no_grad()
    def act(self, obs_flat: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Co-player actions merged into ``actions``.

        Args:
            obs_flat: [R, D] float32 observations of all R = W * C slots.
            actions: [R] int64 or [R, 2] float32 ego actions.

        Returns:
            A new tensor like ``actions`` whose co-player rows hold the partners' actions
            (continuous ones clamped to [-1, 1]); other rows unchanged.
        """
        out = actions
        for p, actor in enumerate(self._actors):
            if actor is None:
                continue
            idx = self._index[p]
            act = actor.act(obs_flat.index_select(0, idx))
            self.last_logits[p] = act.logits
            out = out.index_copy(0, idx, actor.env_action(act.action).to(out.dtype))
        return out

    def observe(self, result) -> None:
        """After ``env.step``: removed flags for the next step; caches cleared where the step
        ended a trial (``truncation``) or the episode (``terminal``)."""
        R = self.W * self.C
        removed, terminal, truncation = (x.reshape(R) for x in (result.removed, result.terminal, result.truncation))
        for p, actor in enumerate(self._actors):
            if actor is not None:
                idx = self._index[p]
                actor.observe(terminal.index_select(0, idx), removed.index_select(0, idx),
                              truncation.index_select(0, idx))


def make_pool(paths, env, device, seed: int, deterministic: bool = True) -> CoplayerPool | None:
    """The :class:`CoplayerPool` of ``paths`` for ``env`` (None when ``paths`` is empty).

    Raises:
        UserError: as :func:`load_partner`; partner paths given to an env without co-player slots.
    """
    if not paths:
        return None
    paths = partner_styles(paths)[0]  # PATH@STYLE: the style is the env's (coplayer_env_config)
    if not env.config.has_coplayers:
        raise UserError("--coplayer needs co-player slots: set --env.ego-slots N (or --env.ego-fraction F) "
                        "below the number of controlled agents")
    from gpusim.config import ActionSpace

    continuous = int(env.config.action_space) == int(ActionSpace.CONTINUOUS)
    partners = [load_partner(p, env.obs_layout, env.num_actions, continuous, device,
                             reward_conditioning=env.config.reward_conditioning) for p in paths]
    return CoplayerPool(partners, env.num_worlds, env.num_slots, env.horizon, device, seed=seed,
                        deterministic=deterministic)


def report_metrics(env, pool: CoplayerPool | None) -> dict[str, float]:
    """``ego/*`` and ``coplayer/*`` copies of the env's per-agent EMA metrics for a training report
    (empty without co-players: the plain keys are then the metrics of every controlled agent)."""
    if pool is None or not getattr(env.config, "has_coplayers", False):
        return {}
    out = {f"ego/{k}": float(v) for k, v in env.metrics().items()}
    out.update({f"coplayer/{k}": float(v) for k, v in env.metrics(role="coplayer").items()})
    return out


def describe(pool: CoplayerPool | None) -> str:
    """One console line naming the partners (empty without a pool)."""
    if pool is None:
        return ""
    return f"co-players: {len(pool.partners)} frozen partner(s): " + ", ".join(pool.labels)


def partner_name(pool: CoplayerPool | None, world: int) -> str:
    """Label of the partner driving ``world``'s co-players in the current episode (one host read)."""
    if pool is None:
        return ""
    return pool.labels[int(pool.partner_of[world])]


__all__ = ["CoplayerPool", "Partner", "coplayer_env_config", "describe", "load_partner", "make_pool",
           "partner_name", "report_metrics"]
