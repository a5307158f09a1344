"""Experience preprocessing hook: runs on the device between the rollout and the PPO update.

``hook.preprocess_unroll_experience(batch) -> (batch, effective_steps)`` receives the
:class:`~train.rollout.RolloutBatch` of one rollout (all tensors on the env's device) and returns a
(possibly modified) batch plus the number of steps that should train (a 0-dim int64 device tensor,
or an int). A hook may

* relabel rewards or flags per step (:class:`RewardRelabel`),
* annotate whole episodes after the fact (:class:`GoalEpisodeBonus`: a bonus on every valid step
  of the episodes that reached the goal — information only known at the episode's end),
* drop experience by setting ``loss_mask = 0`` (:class:`DropExperience`: by scenario id, agent
  type, or any predicate).

The trainer scales its number of optimizer steps by ``effective_steps / nominal_steps`` where
``nominal_steps`` is the number of ``loss_mask = 1`` steps the rollout produced (see
:func:`train.ppo.optimizer_steps` for the rounding), so dropped data is not trained on and a
half-sized batch gets half the steps. Hooks must keep every tensor on the batch's device and must
not read tensors to the host.

Command line: ``--experience NAME --experience-arg KEY=VALUE ...`` (names in :data:`HOOKS`).
"""

from __future__ import annotations

import importlib

import torch

from gpusim.config import ObjectType
from train.rollout import RolloutBatch


def _parse_kv(args, allowed: set[str], who: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for a in args or ():
        if "=" not in a:
            raise ValueError(f"{who}: experience argument {a!r} is not KEY=VALUE (allowed keys: {sorted(allowed)})")
        k, v = a.split("=", 1)
        k = k.strip().replace("-", "_")
        if k not in allowed:
            raise ValueError(f"{who}: unknown experience argument {k!r} (allowed keys: {sorted(allowed)})")
        out[k] = v.strip()
    return out


def episode_index(terminal: torch.Tensor) -> torch.Tensor:
    """[R, H] int64 index of the episode each step belongs to within its row (0 for the first
    episode; a new episode starts after each terminal)."""
    term = terminal.to(torch.int64)
    return torch.cumsum(term, dim=1) - term


class ExperienceHook:
    """Base class and identity hook: returns the batch unchanged and its valid-step count.

    Args:
        args: ``KEY=VALUE`` strings from ``--experience-arg`` (none for the identity).
        context: optional dict with ``scenario_ids`` (list of the pack's scenario ids).

    Raises:
        ValueError: for unknown or malformed arguments.
    """

    name = "identity"
    arg_keys: set[str] = set()

    def __init__(self, args=(), context: dict | None = None):
        self.args = _parse_kv(args, self.arg_keys, type(self).__name__)
        self.context = context or {}

    def preprocess_unroll_experience(self, batch: RolloutBatch) -> tuple[RolloutBatch, torch.Tensor]:
        """Return ``(batch, effective_steps)``; effective_steps is ``loss_mask.sum()`` (device)."""
        return batch, batch.loss_mask.sum()


class RewardRelabel(ExperienceHook):
    """Per-step reward relabelling: ``r' = scale * r + step * loss_mask``.

    Arguments: ``scale=FLOAT`` (default 1), ``step=FLOAT`` per-valid-step bonus (a negative value is
    a time penalty; default 0).
    """

    name = "relabel"
    arg_keys = {"scale", "step"}

    def __init__(self, args=(), context=None):
        super().__init__(args, context)
        self.scale = float(self.args.get("scale", 1.0))
        self.step = float(self.args.get("step", 0.0))

    def preprocess_unroll_experience(self, batch):
        rewards = self.scale * batch.rewards + self.step * batch.loss_mask.to(batch.rewards.dtype)
        return batch.replace(rewards=rewards), batch.loss_mask.sum()


class GoalEpisodeBonus(ExperienceHook):
    """Per-episode annotation: add ``bonus`` to the reward of every valid step of each episode
    (segment of a row between terminals) in which the agent reached its goal.

    Arguments: ``bonus=FLOAT`` (default 0.01).
    """

    name = "goal_bonus"
    arg_keys = {"bonus"}

    def __init__(self, args=(), context=None):
        super().__init__(args, context)
        self.bonus = float(self.args.get("bonus", 0.01))

    @staticmethod
    def successful_steps(batch: RolloutBatch) -> torch.Tensor:
        """[R, H] bool: step belongs to an episode whose agent reached its goal (any step)."""
        R, H = batch.rewards.shape
        ep = episode_index(batch.terminal)  # [R, H] in [0, H)
        flat = ep + torch.arange(R, device=ep.device)[:, None] * H
        success = torch.zeros(R * H, dtype=torch.int64, device=ep.device)
        success.scatter_reduce_(0, flat.reshape(-1), batch.goal_reached.reshape(-1).to(torch.int64), reduce="amax")
        return success[flat] > 0

    def preprocess_unroll_experience(self, batch):
        label = self.successful_steps(batch) & batch.loss_mask
        rewards = batch.rewards + self.bonus * label.to(batch.rewards.dtype)
        return batch.replace(rewards=rewards), batch.loss_mask.sum()


class DropExperience(ExperienceHook):
    """Selective dropping: ``loss_mask = 0`` on the selected steps (so they neither train the policy
    nor count as effective steps). The selections add up:

    * ``scenario=ID[,ID...]``: every row of these scenario ids (as in ``pack.scenario_ids``);
    * ``agent_type=NAME[,NAME...]``: rows whose agent has this type (vehicle, pedestrian, cyclist);
    * ``rows=EVEN|ODD``: every other row (deterministic, for experiments and tests);
    * ``predicate=MODULE:FUNCTION``: a function ``f(batch) -> [R, H] bool`` of steps to drop.

    Raises:
        ValueError: for unknown scenario ids or type names, or a predicate that cannot be imported.
    """

    name = "drop"
    arg_keys = {"scenario", "agent_type", "rows", "predicate"}

    def __init__(self, args=(), context=None):
        super().__init__(args, context)
        self.scenario_index: list[int] = []
        if "scenario" in self.args:
            ids = list(self.context.get("scenario_ids", []))
            for sid in self.args["scenario"].split(","):
                if sid not in ids:
                    raise ValueError(f"DropExperience: scenario id {sid!r} is not in the pack")
                self.scenario_index.append(ids.index(sid))
        self.types = [int(ObjectType.parse(t)) for t in self.args["agent_type"].split(",")] if "agent_type" in self.args else []
        self.rows = self.args.get("rows")
        if self.rows is not None and self.rows.lower() not in ("even", "odd"):
            raise ValueError(f"DropExperience: rows must be even or odd, got {self.rows!r}")
        self.predicate = None
        if "predicate" in self.args:
            mod, _, fn = self.args["predicate"].partition(":")
            try:
                self.predicate = getattr(importlib.import_module(mod), fn)
            except (ImportError, AttributeError) as e:
                raise ValueError(f"DropExperience: cannot import predicate {self.args['predicate']!r}: {e}") from e

    def drop_mask(self, batch: RolloutBatch) -> torch.Tensor:
        """[R, H] bool steps selected for dropping."""
        R, H = batch.rewards.shape
        dev = batch.device
        drop_rows = torch.zeros(R, dtype=torch.bool, device=dev)
        if self.scenario_index:
            drop_rows |= torch.isin(batch.scenario, torch.tensor(self.scenario_index, device=dev))
        if self.types:
            drop_rows |= torch.isin(batch.agent_type, torch.tensor(self.types, device=dev))
        if self.rows is not None:
            parity = 0 if self.rows.lower() == "even" else 1
            drop_rows |= (torch.arange(R, device=dev) % 2) == parity
        drop = drop_rows[:, None].expand(R, H)
        if self.predicate is not None:
            drop = drop | self.predicate(batch).to(torch.bool)
        return drop

    def preprocess_unroll_experience(self, batch):
        loss_mask = batch.loss_mask & ~self.drop_mask(batch)
        return batch.replace(loss_mask=loss_mask), loss_mask.sum()


class ProgressShaping(ExperienceHook):
    """Potential-based reward shaping toward the goal (Ng, Harada & Russell 1999, "Policy
    invariance under reward transformations"): with the potential ``Phi(s) = -weight * d(s)``,
    ``d`` the ego's distance to its goal in units of ``GOAL_SCALE`` (100 m, read from the
    observation's ``goal_dist/100`` feature), every valid non-final step gets

        F_t = gamma * Phi(s_{t+1}) - Phi(s_t) = weight * (d_t - gamma * d_{t+1})

    added to its reward. Over an episode the terms telescope to about ``weight * (d_0 - d_end)``:
    driving 50 m toward the goal earns ``0.5 * weight`` (1.5 at the default weight), next to the
    goal's ``reward_goal`` of 1.
    Shaping of this form leaves the optimal policy of the discounted problem unchanged (the
    theorem above); it only gives the sparse goal reward a dense gradient.

    No shaping on steps where ``s_{t+1}`` is not the same episode's next in-play observation: the
    last column of a row, terminal steps (goal, collision, offroad: a crash never earns the
    distance it "removes"), steps after which the agent is out of play, and masked steps.

    Arguments: ``weight=FLOAT`` (default 3: on the bundled sample, 2M steps, weight 1 gave goal
    0.854 / collision 0.073 / offroad 0.024 and weight 3 gave 0.902 / 0.049 / 0.000 in
    ``train/evaluate.py``, and weight 3 learnt faster; docs/training.md), ``gamma=FLOAT`` (default: the trainer's
    ``--ppo.gamma``, passed in ``context["gamma"]``, else 0.99), ``column=INT`` (index of the goal
    distance in the observation; default: the ego block's ``goal_dist/100`` feature).

    Shapes: ``batch.obs`` [R, H, D] float32; the rewards [R, H] float32 gain ``F`` [R, H].
    """

    name = "progress"
    arg_keys = {"weight", "gamma", "column"}

    def __init__(self, args=(), context=None):
        super().__init__(args, context)
        self.weight = float(self.args.get("weight", 3.0))
        self.gamma = float(self.args.get("gamma", self.context.get("gamma", 0.99)))
        self.column = int(self.args.get("column", _ego_column(self.context, "goal_dist/100")))
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"ProgressShaping: gamma must be in [0, 1], got {self.gamma}")

    def distance(self, batch: RolloutBatch) -> torch.Tensor:
        """[R, H] float32 ``d``: the goal distance feature (/ 100 m) of every observation."""
        return batch.obs[..., self.column]

    def shaping(self, batch: RolloutBatch) -> torch.Tensor:
        """[R, H] float32 shaping term ``F`` (0 where no shaping applies; see the class docstring)."""
        d = self.distance(batch)  # [R, H]
        f = torch.zeros_like(d)
        nxt_ok = (batch.loss_mask[:, :-1] & batch.loss_mask[:, 1:] & ~batch.terminal[:, :-1]
                  & ~batch.truncation[:, :-1] & ~batch.removed[:, 1:])
        f[:, :-1] = torch.where(nxt_ok, self.weight * (d[:, :-1] - self.gamma * d[:, 1:]), f[:, :-1])
        return f

    def preprocess_unroll_experience(self, batch):
        return batch.replace(rewards=batch.rewards + self.shaping(batch)), batch.loss_mask.sum()


#: Hook classes by ``--experience`` name.
class CandidateProgressShaping(ProgressShaping):
    """:class:`ProgressShaping` for the memory task (``EnvConfig.goal_candidates`` >= 2,
    docs/trial.md) with ``d`` = the distance to the *nearest* candidate goal (the candidate
    block's ``cand*_dist/100`` columns, ``context["candidate_dist_columns"]``). It rewards driving
    to some candidate, alike for all of them, so it never points at the true goal; which one is
    true is only learnt from the goal reward and the decoy stop. Same arguments as
    :class:`ProgressShaping` (``column`` is not used), and ``decoy_refund=FLOAT`` (default 0): at
    the step that reaches a decoy (the next observation's ``at_decoy`` turns on), take back this
    fraction of the shaping earned since the trial started, ``decoy_refund * weight * (d_t - d_s)``
    with ``d_s`` the distance at the trial's first step (``time_in_trial == 0``). With 1 a decoy
    earns no shaping in all, so driving again to the candidate that was wrong in trial 0 is worth
    nothing while the other one is worth its goal reward and its shaping; without it, the shaping
    alone pays about ``weight * d_s`` (0.9 for a 30 m candidate at weight 3) for the sure way back to
    the decoy. The refund follows the decoy stop, which the ego observes in the same step
    (``at_decoy``), so it never points at the true goal before an outcome the ego sees.

    Raises:
        ValueError: the context has no candidate columns (the env does not run the memory task);
            ``decoy_refund`` outside [0, 1].
    """

    name = "candidate_progress"
    arg_keys = ProgressShaping.arg_keys | {"decoy_refund"}

    def __init__(self, args=(), context=None):
        super().__init__(args, context)
        self.columns = list(self.context.get("candidate_dist_columns") or [])
        if not self.columns:
            raise ValueError("--experience candidate_progress needs the memory task (--env.goal-candidates 2 or more)")
        self.refund = float(self.args.get("decoy_refund", 0.0))
        if not 0.0 <= self.refund <= 1.0:
            raise ValueError(f"CandidateProgressShaping: decoy_refund must be in [0, 1], got {self.refund}")
        self.decoy_column = self.context.get("decoy_column")
        self.time_column = _ego_column(self.context, "time_in_trial")

    def shaping(self, batch: RolloutBatch) -> torch.Tensor:
        """[R, H] float32: :meth:`ProgressShaping.shaping` toward the nearest candidate, minus the
        refund at the steps that reach a decoy (class docstring)."""
        f = super().shaping(batch)
        if self.refund == 0.0:
            return f
        d = self.distance(batch)
        decoy = batch.obs[..., self.decoy_column] > 0.5  # [R, H]
        hit = batch.loss_mask[:, :-1] & ~decoy[:, :-1] & decoy[:, 1:]
        first = (batch.obs[..., self.time_column] == 0) & batch.loss_mask
        first[:, 0] = True  # a row starts an episode (rollout rows are whole episodes)
        H = d.shape[1]
        idx = torch.where(first, torch.arange(H, device=d.device), torch.zeros_like(first, dtype=torch.int64))
        d_start = d.gather(1, idx.cummax(dim=1).values)  # [R, H] the distance at the trial's first step
        f[:, :-1] = f[:, :-1] + torch.where(hit, self.refund * self.weight * (d[:, :-1] - d_start[:, :-1]),
                                            torch.zeros_like(d[:, :-1]))
        return f

    def distance(self, batch: RolloutBatch) -> torch.Tensor:
        """[R, H] float32: the nearest candidate's distance (/ 100 m) of every observation."""
        return batch.obs[..., self.columns].amin(dim=-1)


HOOKS: dict[str, type[ExperienceHook]] = {
    cls.name: cls for cls in (ExperienceHook, RewardRelabel, GoalEpisodeBonus, DropExperience, ProgressShaping,
                              CandidateProgressShaping)
}


def _ego_column(context: dict, feature: str) -> int:
    """Column of the ego feature ``feature`` in the env's observation (``context["obs_layout"]``,
    else the layout of the default blocks: the ego block comes first)."""
    from gpusim.kernels.obs_layout import obs_layout

    layout = context.get("obs_layout") or obs_layout(1, 1)
    return layout.column("ego", feature)


def hook_context(env, gamma: float) -> dict:
    """The ``context`` the trainer gives a hook: ``scenario_ids`` (the env pack's scenario ids, in
    pack order; empty without a pack), ``gamma`` (the PPO discount, read by
    :class:`ProgressShaping`), ``candidate_dist_columns`` (the observation columns of the
    candidate distances in the memory task, else empty) and ``decoy_column`` (the column of its
    ``at_decoy`` feature, else None; both for :class:`CandidateProgressShaping`) and ``obs_layout``
    (the env's ``ObsLayout``, where the hooks find the ego columns; None without one)."""
    layout = getattr(env, "obs_layout", None)
    cand = getattr(layout, "candidates", slice(0, 0))
    names = getattr(layout, "candidate_features", ())
    columns = [cand.start + i for i, n in enumerate(names) if n.endswith("_dist/100")]
    decoy = cand.start + names.index("at_decoy") if "at_decoy" in names else None
    return {"scenario_ids": list(getattr(getattr(env, "pack", None), "scenario_ids", [])), "gamma": float(gamma),
            "candidate_dist_columns": columns, "decoy_column": decoy,
            "obs_layout": layout if hasattr(layout, "column") else None}


def make_hook(name: str, args=(), context: dict | None = None) -> ExperienceHook:
    """Build the hook registered as ``name`` (or ``MODULE:CLASS`` for a user hook class).

    Raises:
        ValueError: for an unknown name or bad arguments.
    """
    if name in HOOKS:
        return HOOKS[name](args, context)
    if ":" in name:
        mod, _, cls = name.partition(":")
        try:
            hook_cls = getattr(importlib.import_module(mod), cls)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"cannot import experience hook {name!r}: {e}") from e
        return hook_cls(args, context)
    raise ValueError(f"unknown experience hook {name!r}; choose one of {sorted(HOOKS)} or MODULE:CLASS")
