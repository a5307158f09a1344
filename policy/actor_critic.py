"""Actor-critic with episodic memory: observation encoder -> causal transformer -> policy/value heads.

docs/design.md section 11. The policy sees, at every step, all earlier steps of the current episode (an
episode may hold several trials in trial mode, so the memory spans trials) except steps taken while
the agent was removed (limbo), which are hidden from every other step.

Heads:

* discrete actions: a categorical distribution over ``num_actions`` (91 = 7 x 13) logits;
* continuous actions: a diagonal Gaussian with mean from the token and a state-independent,
  learned log standard deviation (one per action dimension, as in CleanRL's / PPO's continuous
  policy); actions are sampled unbounded and the env clips them to [-1, 1].

The value head is a linear layer on the same token.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn

from gpusim.config import ActionSpace, check_finite
from gpusim.kernels.dynamics import NUM_ACCEL, NUM_STEER
from gpusim.sim.actions import NO_ACTION
from gpusim.kernels.episode_mask import episode_mask
from policy.encoders import ObsDims, ObsEncoder
from policy.transformer import CausalTransformer, KVCache


#: Values of ``PolicyConfig.memory``.
MEMORY_SPANS = ("episode", "trial")


@dataclass(frozen=True)
class PolicyConfig:
    """Sizes of the policy.

    Attributes:
        d_model: token width of the transformer (default 128; smaller is faster on CPU).
        n_layers: transformer blocks.
        n_heads: attention heads (must divide ``d_model``).
        hidden: width of the ego / partner / road encoder MLPs.
        max_roads: road slots used (nearest first); ``None`` = all of the observation's slots.
        init_log_std: initial log standard deviation of the Gaussian head (continuous actions).
        action_factors: for a discrete joint action space that is a grid (7 accelerations x 13
            steering values, joint index ``i * 13 + j``), the joint logits are
            ``logit[i * 13 + j] = joint[i * 13 + j] + accel[i] + steer[j]``: still one 91-way
            categorical, but the per-factor terms share what is learnt about one factor across all
            values of the other (e.g. "steer straight" whatever the acceleration), which speeds up
            early learning a lot. Ignored when the product differs from the number of actions;
            ``()`` = a plain joint head.
        memory: how long the KV-cache memory lasts: ``"episode"`` (default: kept across the trials
            of a trial-mode episode, cleared at the episode end) or ``"trial"`` (the memoryless
            control of the memory task, docs/trial.md: cleared at every trial start too, when
            acting (:class:`policy.actor.Actor`) and in the PPO update's forward).

    Raises:
        ValueError: an unknown ``memory``; a non-finite ``init_log_std``
            (:func:`gpusim.config.check_finite`).
    """

    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    hidden: int = 64
    max_roads: int | None = None
    init_log_std: float = -0.5
    action_factors: tuple[int, ...] = (7, 13)
    memory: str = "episode"

    def __post_init__(self):
        check_finite(self)
        if self.memory not in MEMORY_SPANS:
            raise ValueError(f"PolicyConfig.memory must be one of {', '.join(MEMORY_SPANS)} "
                             f"(--policy.memory), got {self.memory!r}")


class ActorCritic(nn.Module):
    """Transformer actor-critic.

    Args:
        dims: :class:`~policy.encoders.ObsDims` (or any object with the five layout integers, e.g.
            ``env.obs_layout``).
        num_actions: number of discrete actions (91) or, with ``continuous=True``, the action
            dimension (2).
        continuous: Gaussian head instead of categorical.
        config: :class:`PolicyConfig`.

    Raises:
        ValueError: for inconsistent sizes (see :class:`ObsEncoder`, :class:`CausalTransformer`).
    """

    #: :meth:`forward` on the CPU runs the encoder and the per-token layers on the non-removed steps
    #: only (:meth:`_forward_kept`; same outputs there); ``False`` computes every step (tests).
    pack_removed: bool = True

    def __init__(self, dims, num_actions: int, continuous: bool = False, config: PolicyConfig = PolicyConfig()):
        super().__init__()
        if not isinstance(dims, ObsDims):
            dims = ObsDims.from_layout(dims)
        if num_actions < 1:
            raise ValueError(f"ActorCritic: num_actions must be >= 1, got {num_actions}")
        self.dims, self.num_actions, self.continuous, self.config = dims, int(num_actions), bool(continuous), config
        self.encoder = ObsEncoder(dims, config.d_model, config.hidden, config.max_roads)
        self.transformer = CausalTransformer(config.d_model, config.n_layers, config.n_heads)
        self.actor = nn.Linear(config.d_model, num_actions)
        factors = tuple(int(f) for f in config.action_factors)
        self.factored = (not continuous) and len(factors) > 1 and math.prod(factors) == num_actions
        if self.factored:
            self.actor_factors = nn.ModuleList(nn.Linear(config.d_model, f) for f in factors)
            # index of each joint action in each factor (row-major joint index)
            idx, stride = [], num_actions
            for f in factors:
                stride //= f
                idx.append((torch.arange(num_actions) // stride) % f)
            self.register_buffer("factor_index", torch.stack(idx), persistent=False)
            for lin in self.actor_factors:
                nn.init.orthogonal_(lin.weight, gain=0.01)
                nn.init.zeros_(lin.bias)
        self.critic = nn.Linear(config.d_model, 1)
        if continuous:
            self.log_std = nn.Parameter(torch.full((num_actions,), float(config.init_log_std)))
        # small policy init (near-uniform initial policy), unit value init, as in common PPO setups
        nn.init.orthogonal_(self.actor.weight, gain=0.01)
        nn.init.zeros_(self.actor.bias)
        nn.init.orthogonal_(self.critic.weight, gain=1.0)
        nn.init.zeros_(self.critic.bias)

    @classmethod
    def for_env(cls, env, config: PolicyConfig = PolicyConfig(), env_config=None) -> "ActorCritic":
        """A new policy (weights from torch's current RNG, on the CPU) for ``env``: its observation
        layout (``env.obs_layout``), action count (``env.num_actions``: 91 joint discrete actions,
        or the action dimension 2) and action space (``env.config.action_space``, else
        ``env_config``'s for an env without a config: ``ActionSpace.CONTINUOUS`` gives the Gaussian
        head). The one construction of the trainer (``train/setup.py``), behaviour cloning and the
        profiling scripts.

        Raises:
            ValueError: as the constructor.
        """
        space = getattr(env, "config", env_config).action_space
        continuous = int(space) == int(ActionSpace.CONTINUOUS)
        return cls(ObsDims.from_layout(env.obs_layout), env.num_actions, continuous, config)

    #: The first layer of the ego MLP: its input columns are the blocks of
    #: :meth:`policy.encoders.ObsEncoder.ego_columns`.
    EGO_INPUT = "encoder.ego.0.weight"

    @torch.no_grad()
    def init_from(self, source: "ActorCritic", unseen: tuple = ()) -> dict:
        """Start this policy from ``source``'s weights when the two read other observation layouts
        only in the blocks the ego MLP reads besides ``ego`` (the style and candidate blocks: the
        memory task's policy from a goal-setting driver). In place.

        Every tensor of the same name and shape is copied. In the ego MLP's first layer
        (:attr:`EGO_INPUT`, [hidden, ego-MLP input]) each block's columns are copied from
        ``source``'s columns of the same block; the columns of a block ``source`` does not read
        are set to 0, so the new policy computes exactly ``source``'s function until training
        moves them (a function-preserving widening, as in Net2Net, Chen et al. 2016,
        arXiv 1511.05641); a block only ``source`` reads is dropped.

        ``unseen``: names of ``ego`` block columns that were always 0 while ``source`` trained (the
        trial clock outside trial mode, :func:`train.human.init_policy`). Their weights never
        received a gradient and still hold their random initialisation, which would feed noise
        into ``source``'s function once the columns carry values; they are set to 0 as well.

        Returns:
            ``{"fresh": [block, ...], "dropped": [block, ...]}``: the blocks whose input columns
            start at 0, and those of ``source`` this policy does not read.

        Raises:
            ValueError: one line naming what differs: the policy sizes (``PolicyConfig``), the action
                count or space, a block both read with other widths, or a tensor of another name or
                shape (another layout outside the ego MLP's blocks, e.g. no signal block).
                A name in ``unseen`` that is not an ``ego`` column. Nothing is changed when it raises.
        """
        if self.config != source.config:
            raise ValueError(f"its policy {asdict(source.config)} differs from this run's {asdict(self.config)}; "
                             "pass the same --policy.* flags as the checkpoint")
        if (self.num_actions, self.continuous) != (source.num_actions, source.continuous):
            raise ValueError(f"it acts with {source.num_actions} {'continuous' if source.continuous else 'discrete'} "
                             f"actions, this run with {self.num_actions} "
                             f"{'continuous' if self.continuous else 'discrete'}")
        mine, theirs = self.encoder.ego_columns(), source.encoder.ego_columns()
        unseen_at = self.ego_input_columns(unseen)
        for name in mine.keys() & theirs.keys():
            if mine[name].stop - mine[name].start != theirs[name].stop - theirs[name].start:
                raise ValueError(f"its observation block {name} has {theirs[name].stop - theirs[name].start} "
                                 f"columns, this run's {mine[name].stop - mine[name].start}")
        own, src = self.state_dict(), source.state_dict()
        for name in [*own, *(n for n in src if n not in own)]:  # the first difference in the policy's order
            if name == self.EGO_INPUT:
                continue
            if name not in own or name not in src or own[name].shape != src[name].shape:
                dims = {k: (v, source.dims.describe().get(k)) for k, v in self.dims.describe().items()
                        if source.dims.describe().get(k) != v}
                shape = lambda d: list(d[name].shape) if name in d else "absent"  # noqa: E731
                raise ValueError(f"tensor {name} is {shape(src)} in it, {shape(own)} in this run's policy: the "
                                 f"observation sizes differ outside the ego MLP's blocks (this run, it: {dims})")
        for name, value in src.items():
            if name != self.EGO_INPUT:
                own[name].copy_(value)
        weight, source_weight = own[self.EGO_INPUT], src[self.EGO_INPUT]
        weight.zero_()
        for name, cols in mine.items():
            if name in theirs:
                weight[:, cols] = source_weight[:, theirs[name]]
        weight[:, unseen_at] = 0.0
        return {"fresh": [n for n in mine if n not in theirs], "dropped": [n for n in theirs if n not in mine]}

    def ego_input_columns(self, names) -> list[int]:
        """Where the ``ego`` block's features ``names`` (e.g. ``("trial_index",)``) sit among the
        columns of the ego MLP's first layer (:attr:`EGO_INPUT`, [hidden, ego-MLP input]).

        Raises:
            ValueError: a name that is not an ``ego`` feature (the message lists them).
        """
        layout, ego = self.encoder.layouts[False], self.encoder.ego_columns()["ego"]
        return [ego.start + layout.column("ego", n) - layout.block("ego").start for n in names]

    def describe(self) -> dict:
        """Constructor arguments as plain data (saved in checkpoints)."""
        config = asdict(self.config)
        config["action_factors"] = list(config["action_factors"])
        return {
            "dims": self.dims.describe(),
            "num_actions": self.num_actions,
            "continuous": self.continuous,
            "config": config,
        }

    @classmethod
    def from_description(cls, desc: dict) -> "ActorCritic":
        """Inverse of :meth:`describe`."""
        config = dict(desc["config"])
        config["action_factors"] = tuple(config.get("action_factors", ()))
        return cls(ObsDims(**desc["dims"]), desc["num_actions"], desc["continuous"], PolicyConfig(**config))

    # ------------------------------------------------------------------ rollout (KV cache)
    def init_cache(self, num_slots: int, horizon: int, device=None) -> KVCache:
        """Empty memory for ``num_slots`` agent slots and episodes of up to ``horizon`` steps."""
        return self.transformer.init_cache(num_slots, horizon, device)

    @staticmethod
    def reset_cache(cache: KVCache, terminal: torch.Tensor | None = None) -> KVCache:
        """Clear the memory of the slots where ``terminal`` [N] bool is set (all if ``None``);
        other slots keep theirs (a truncation is not a reset). In place; returns ``cache``."""
        return cache.reset(terminal)

    def forward_eval(self, obs_t: torch.Tensor, cache: KVCache, removed_t: torch.Tensor | None = None):
        """One step for N agent slots.

        Args:
            obs_t: [N, D] float32 observations.
            cache: :class:`KVCache` from :meth:`init_cache` (updated in place).
            removed_t: [N] bool, the agent is out of play at this step (its token is hidden from
                later steps and its observation is ignored: replaced by zeros, so NaN there is
                harmless); ``None`` = none removed.

        Returns:
            ``(logits, value, cache)``: logits [N, num_actions] (the Gaussian mean for continuous
            actions), value [N] float32, and the updated cache.
        """
        if removed_t is not None:  # compact copy with removed rows cleared (cheaper than clearing all D)
            tokens = self.encoder(self.prepare_obs(obs_t, removed_t), compact=True)
        else:
            tokens = self.encoder(obs_t)
        h = self.transformer.step(tokens, cache, removed_t)
        return self._logits(h), self.critic(h)[..., 0], cache

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.actor(h)
        if self.factored:
            for lin, idx in zip(self.actor_factors, self.factor_index):
                logits = logits + lin(h).index_select(-1, idx)
        return logits

    # ------------------------------------------------------------------ training (whole rows)
    def prepare_obs(self, obs: torch.Tensor, removed: torch.Tensor) -> torch.Tensor:
        """The encoder's input for whole rows, computed once per PPO update (not per minibatch).

        Args:
            obs: [..., D] float32. removed: [...] bool.

        Returns:
            [..., D'] float32 (D' = ``encoder.compact_dim``): the road slots beyond ``max_roads``
            dropped and removed steps set to zeros (NaN/inf there vanish). Feed it (indexed by rows)
            to :meth:`forward` with ``prepared=True``; the outputs are the same as from ``obs``.
        """
        out = self.encoder.compact(obs)
        rm = removed.to(torch.bool)[..., None]
        return out.masked_fill_(rm, 0.0) if out is not obs else out.masked_fill(rm, 0.0)

    def forward(self, obs: torch.Tensor, terminal: torch.Tensor, removed: torch.Tensor, prepared: bool = False,
                rows: torch.Tensor | None = None, pack: bool | None = None, kept: int | None = None):
        """Whole rollout rows.

        Args:
            obs: [B, T, D] float32, or with ``prepared=True`` [B, T, D'] from :meth:`prepare_obs`.
            terminal: [B, T] bool (memory cleared after these steps).
            removed: [B, T] bool (out-of-play steps, hidden from every other step).
            prepared: ``obs`` comes from :meth:`prepare_obs` (already compact and cleared).
            rows: optional [B] int64: ``obs`` holds more rows ([R, T, ...]) and these are the
                ones to use, in order (the same as passing ``obs[rows]``, without copying the
                rows' removed steps; the PPO update's minibatches).
            pack: compute the encoder and the per-token layers on the non-removed steps only
                (:meth:`_forward_kept`): ``None`` (default) packs on the CPU when
                :attr:`pack_removed` is set; ``True`` packs on every device (on CUDA it reads the
                kept-step count to the host: one synchronisation per call, which the rollout's
                CUDA graph could not hold, so only the PPO update asks for it,
                ``PPOConfig.pack_removed``); ``False`` computes every step.
            kept: the number of non-removed steps of the rows, when the caller knows it (a host
                int; ``train.ppo.ppo_update`` counts every minibatch's at once, one read per
                update): packing then reads nothing from the device (:func:`kept_index`).
                ``None``: packing reads the count.

        Returns:
            ``(logits [B, T, num_actions], values [B, T])``. At every non-removed step these equal
            what :meth:`forward_eval` returns when fed the row step by step (to float32
            rounding); no output depends on the contents of removed steps (they are replaced by
            zeros before the encoder, with ``torch.where`` / ``masked_fill``, so even NaN/inf there
            cannot reach the attention, where a masked 0 weight times NaN would still give NaN).
            The outputs *at* removed steps are placeholders that nothing trains on (on the CPU,
            where only the kept steps are computed, :meth:`_forward_kept`: logits 0, value 0).

        Raises:
            ValueError: for mismatched shapes.
        """
        _check_rows("forward", obs, terminal, removed, rows)
        removed = removed.to(torch.bool)
        if pack is None:
            pack = self.pack_removed and obs.device.type == "cpu"
        if pack and (removed.any() if kept is None else int(kept) < removed.numel()):  # kept None: a host read
            allowed, position = episode_mask(terminal.to(torch.bool), removed)
            return self._forward_kept(obs, removed, allowed, position, prepared, rows, kept)
        h = self._hidden(obs, terminal, removed, prepared, rows)
        return self._logits(h), self.critic(h)[..., 0]

    def hidden(self, obs: torch.Tensor, terminal: torch.Tensor, removed: torch.Tensor, prepared: bool = False,
               rows: torch.Tensor | None = None) -> torch.Tensor:
        """The transformer's output [B, T, d_model] float32 over whole rows, every step computed: what
        :meth:`forward` feeds its actor and critic heads (arguments as there). Probes of what the
        memory holds read it (``profiling/memory_path_probe.py``).

        Raises:
            ValueError: for mismatched shapes.
        """
        _check_rows("hidden", obs, terminal, removed, rows)
        return self._hidden(obs, terminal, removed.to(torch.bool), prepared, rows)

    def _hidden(self, obs, terminal, removed, prepared, rows):
        """:meth:`hidden` on checked inputs (``removed`` bool): :meth:`forward`'s dense path."""
        allowed, position = episode_mask(terminal.to(torch.bool), removed)
        if rows is not None:
            obs = obs.index_select(0, rows)
        tokens = self.encoder(obs, compact=True) if prepared else self.encoder(_clear_removed(obs, removed))
        return self.transformer(tokens, allowed, position)

    def _forward_kept(self, obs, removed, allowed, position, prepared, rows=None, kept=None):
        """:meth:`forward` computed on the non-removed steps only (CPU). A removed step is hidden
        from every other step and never trained on (its ``loss_mask`` is 0), so only the attention
        needs the whole [B, T] grid; the encoder, the per-token transformer layers and the heads
        run on the kept steps (half of a default training minibatch's steps are removed: agents
        out after a collision or at the goal). Removed steps get logits 0 and value 0. ``kept``:
        the number of kept steps when known (no host read), else ``None``."""
        B, T = removed.shape
        flat = ~removed.reshape(-1)
        index = torch.nonzero(flat).flatten() if kept is None else kept_index(flat, int(kept))  # [M]
        source = index if rows is None else rows.index_select(0, index // T) * T + index % T
        kept = obs.reshape(-1, obs.shape[-1]).index_select(0, source)
        h = self.transformer.forward_packed(self.encoder(kept, compact=prepared), index, allowed, position)
        logits, values = self._logits(h), self.critic(h)[..., 0]
        logits = torch.zeros(B * T, logits.shape[-1], dtype=logits.dtype, device=logits.device).index_copy(
            0, index, logits)
        values = torch.zeros(B * T, dtype=values.dtype, device=values.device).index_copy(0, index, values)
        return logits.view(B, T, -1), values.view(B, T)

    # ------------------------------------------------------------------ distributions
    def _std(self) -> torch.Tensor:
        return self.log_std.exp()

    def sample(self, logits: torch.Tensor, deterministic: bool | str = False, temperature: float = 1.0) -> torch.Tensor:
        """Draw actions: [...] int64 indices (discrete) or [..., A] float32 (continuous).

        ``deterministic``: ``False`` samples; ``True`` / ``"argmax"`` takes the joint argmax
        (discrete) or the mean (continuous); ``"mean"`` (discrete) takes, per action dimension, the
        expected grid index under the policy, rounded: acceleration over its 7 values and steering
        over its 13 (``gpusim.kernels.dynamics``: joint index ``accel * 13 + steer``). With a broad
        distribution (entropy still far from 0, as at the end of the 2M-step CPU run) the joint
        argmax is one cell of a flat 7 x 13 table and can sit far from the distribution's centre;
        the expected value is the analogue of a continuous policy's mean (docs/evaluation.md).

        ``temperature`` T > 0 (sampling only; 1 = the policy's own distribution): a discrete draw
        from softmax(logits / T), a continuous one with the standard deviation times T. Below 1 the
        draws concentrate on the likelier actions (T -> 0 tends to the argmax), above 1 they spread.

        NaN or infinite logits are an error, not an action: where a row's logits are not all
        finite the action is :data:`gpusim.sim.actions.NO_ACTION` (discrete) or NaN (continuous),
        which the env's action check refuses (at the step in sync mode; recorded on the device
        and raised at the next host read in async mode, ``gpusim/sim/actions.py``). No host read.

        Raises:
            ValueError: ``deterministic`` not one of the values above; ``temperature`` not a finite
                number > 0.
        """
        if deterministic not in (False, True, "argmax", "mean"):
            raise ValueError(f"sample: deterministic must be False, True, 'argmax' or 'mean', got {deterministic!r}")
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"sample: temperature must be a finite number > 0, got {temperature!r}")
        finite = torch.isfinite(logits).all(dim=-1)  # [...]
        if self.continuous:
            action = logits if deterministic else logits + (self._std() * temperature) * torch.randn_like(logits)
            return torch.where(finite[..., None], action, torch.full_like(action, float("nan")))
        if deterministic == "mean":
            p = torch.softmax(logits.float(), dim=-1).unflatten(-1, (NUM_ACCEL, NUM_STEER))
            accel = (p.sum(-1) * torch.arange(NUM_ACCEL, device=p.device)).sum(-1).round().long()
            steer = (p.sum(-2) * torch.arange(NUM_STEER, device=p.device)).sum(-1).round().long()
            action = accel * NUM_STEER + steer
        elif deterministic:
            action = logits.argmax(dim=-1)
        else:  # Gumbel-max sampling: argmax(logits + Gumbel noise) is a draw from softmax(logits)
            u = torch.rand_like(logits).clamp_(1e-12, 1.0)
            scaled = logits if temperature == 1.0 else logits / temperature
            action = (scaled - torch.log(-torch.log(u))).argmax(dim=-1)
        return torch.where(finite, action, torch.full_like(action, NO_ACTION))

    def log_prob(self, logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Log-probability [...] of ``actions`` under the head's distribution (a discrete index
        outside ``[0, num_actions)``, such as :data:`~gpusim.sim.actions.NO_ACTION`, reads the
        nearest valid one, so that no out-of-range index reaches the device)."""
        if self.continuous:
            log_std = self.log_std
            z = (actions - logits) / log_std.exp()
            return (-0.5 * z * z - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        logp = torch.log_softmax(logits, dim=-1)
        return logp.gather(-1, actions.long().clamp(0, logp.shape[-1] - 1)[..., None])[..., 0]

    def entropy(self, logits: torch.Tensor) -> torch.Tensor:
        """Entropy [...] (nats) of the head's distribution."""
        if self.continuous:
            ent = (0.5 + 0.5 * math.log(2 * math.pi) + self.log_std).sum()
            return ent.expand(logits.shape[:-1])
        logp = torch.log_softmax(logits, dim=-1)
        return -(logp.exp() * logp).sum(-1)


def kept_index(keep: torch.Tensor, count: int) -> torch.Tensor:
    """The positions of the True entries of ``keep`` [N] bool, in order: [count] int64, what
    ``torch.nonzero(keep).flatten()`` gives, without its host read of the size (the caller knows
    ``count``, the number of True entries). A stable partition: a kept entry goes to its running
    count of kept entries (``cumsum - 1``), the others after them in order (``count`` + their running
    count), every place written once; the first ``count`` places are the kept positions. Cost: two
    cumsums and a scatter over N entries, all on the device."""
    place = torch.where(keep, torch.cumsum(keep, 0) - 1, torch.cumsum(~keep, 0) - 1 + count)
    out = torch.empty(keep.numel(), dtype=torch.int64, device=keep.device)
    return out.scatter_(0, place, torch.arange(keep.numel(), device=keep.device))[:count]


def _check_rows(name: str, obs: torch.Tensor, terminal: torch.Tensor, removed: torch.Tensor, rows) -> None:
    """Raise ValueError unless ``obs`` is [B, T, D] (or [R, T, D] with ``rows`` [B]) and
    ``terminal`` / ``removed`` are [B, T]."""
    n_rows = obs.shape[0] if rows is None else rows.shape[0]
    if obs.dim() != 3 or terminal.shape != (n_rows, obs.shape[1]) or removed.shape != terminal.shape:
        raise ValueError(
            f"ActorCritic.{name}: obs [B, T, D], terminal and removed [B, T] expected; got "
            f"{tuple(obs.shape)}, {tuple(terminal.shape)}, {tuple(removed.shape)}"
        )


def _clear_removed(obs: torch.Tensor, removed: torch.Tensor) -> torch.Tensor:
    """``obs`` [..., D] with the rows where ``removed`` [...] bool is set replaced by zeros
    (``torch.where`` selects values, so NaN/inf there vanish and their gradient is exactly 0)."""
    return torch.where(removed.to(torch.bool)[..., None], torch.zeros((), dtype=obs.dtype, device=obs.device), obs)
