"""``python train/bc.py --data DIR --out PATH.pt``: behaviour cloning (BC) of the transformer policy
from the logs.

The whole algorithm, top to bottom:

1. **Collect the dataset once** (:func:`collect`): every scenario of ``--data`` runs one episode in
   which every controlled object follows its log: its action at each step is the env's inverse
   dynamics toward the next logged pose (:meth:`gpusim.env.DriveEnv.expert_actions`, discrete or
   continuous as ``--env.action-space``), and the observation it gets is recorded. Collisions and
   offroad events are ignored while collecting (logged boxes may touch; the log must not be cut
   short). A target is kept only where the next logged pose is valid and the agent, after the
   step, lies within :data:`TRACK_TOLERANCE` of it (else the log asked for more than the action
   range gives: "out of range"); both masked kinds are counted and printed.
2. **Train epochs over it** (:func:`train_bc`): minibatches of whole episodes (the rows of
   ``--minibatch-worlds`` worlds), teacher forcing through the policy's sequence forward, the same
   :class:`policy.ActorCritic`, observation and forward that the PPO update uses
   (:mod:`train.ppo`), so the memory (KV cache) spans the whole episode. Loss: the negative
   log-likelihood of the target actions, averaged over the kept steps.
3. **Report per epoch**: the training loss, the held-out (``--eval-data``) action NLL and
   accuracy (discrete: argmax equals the target; continuous: the mean absolute error of the
   Gaussian mean, in action units), and the speed in agent-steps per second. Once, before the
   epochs: the accuracy of always predicting the training targets' most common action
   (:func:`majority_baseline`), the floor to read the accuracy against.
4. **DAgger rounds** (optional, ``--dagger-rounds R``; Ross, Gordon & Bagnell 2011, "A reduction
   of imitation learning and structured prediction to no-regret online learning"): a policy
   trained on the log alone drifts off it in closed loop (its own errors compound) into states
   the log never shows. Each round runs the training scenarios once more with the agents driving
   by the policy's sampled actions (``--dagger-expert-share``: the share of agent-steps that take
   the expert's instead), labels every visited step with the expert action from where the agent
   is (the inverse dynamics toward its next logged pose, clamped to the action range: the
   correction back to the log), adds those steps to the dataset and trains ``--dagger-epochs``
   more epochs over all of it. The held-out NLL stays that of the log's own states.
5. **Save a normal checkpoint** (:func:`train.checkpoint.save_checkpoint`): ``train/evaluate.py
   --policy``, ``load_policy``, ``--coplayer`` and ``train/run.py --init-policy`` /
   ``--ppo.human-policy`` accept it.

Examples::

    python train/bc.py --data data/womd_sample --out runs/bc/checkpoint.pt --epochs 20
    python train/bc.py --data TRAIN --eval-data VAL --out bc.pt --setting sim_agent
    python train/bc.py --data TRAIN --out bc.pt --setting sim_agent --dagger-rounds 2
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import sys
import time
from dataclasses import dataclass, field

if __package__ in (None, ""):  # `python train/bc.py` from a checkout without `pip install -e .`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch

from gpusim.config import EnvConfig
from policy.actor_critic import ActorCritic, PolicyConfig
from train.config import USER_ERRORS, TrainConfig, UserError, check_device, default_device, one_line

#: A target is "out of range" when the agent, after the expert action, is farther than this from
#: the logged pose it aimed at (m). The tracker reaches a reachable pose exactly (continuous) or to
#: the grid's rounding (discrete: a few cm); farther means the log needs more than the action
#: range (|accel| <= 4 m/s^2, |steer| <= 1 rad), e.g. a jump or reversing in the log.
TRACK_TOLERANCE = 0.5

#: How the policy may pick its actions while it drives a DAgger round (``--dagger-decode``).
DAGGER_DECODES = ("sample", "argmax")


@dataclass
class BCConfig:
    """Arguments of ``train/bc.py``.

    Attributes:
        data: training scenarios (as ``train/run.py --data``: WOMD JSON directory or saved pack).
        eval_data: held-out scenarios for the per-epoch NLL / accuracy (None: none).
        out: the checkpoint file to write.
        epochs: passes over the dataset. learning_rate, adam_eps, max_grad_norm: Adam and the
            gradient-norm clip. minibatch_worlds: worlds (each all its controlled agents' whole
            episodes) per minibatch.
        anneal_lr: the learning rate falls linearly from ``learning_rate`` to 0 over all the
            epochs, DAgger epochs included (:func:`annealed_lr`; as ``train/run.py``'s anneal, here
            counted in epochs). False: constant.
        num_worlds: worlds simulated at a time while collecting.
        average_epochs: stochastic weight averaging (Izmailov et al. 2018, "Averaging weights leads
            to wider optima and better generalization"): ``out`` holds the mean of the weights at
            the end of each of the last ``average_epochs`` epochs (counted over all epochs, DAgger
            epochs included; :class:`torch.optim.swa_utils.AveragedModel`), and ``last.pt`` beside
            it the last epoch's own weights, so one run gives both. The DAgger rounds collect with
            the trained (not the averaged) weights. 0 (default): ``out`` is the last epoch's.
        keep_best: also write ``best.pt`` beside ``out`` at every epoch whose held-out NLL is the
            lowest so far (a tie keeps the earlier); needs ``eval_data``. Its ``extra["best"]``:
            ``{"entry": "eval_nll", "value", "epoch"}``.
        dagger_rounds: DAgger rounds after the ``epochs`` on the log (module docstring, step 4):
            each collects the training scenarios once more with the policy driving, adds those
            steps (labelled with the expert's actions) to the dataset and trains
            ``dagger_epochs`` more epochs over all of it. 0: plain behaviour cloning.
        dagger_expert_share: in a DAgger round, the probability that an agent-step takes the
            expert's action instead of the policy's (the mixture policy of Ross et al. 2011;
            0: the policy alone).
        dagger_decode: how the policy picks its actions while it drives a DAgger round:
            ``"sample"`` (default: drawn from its distribution) or ``"argmax"`` (its most likely
            action, the evaluator's default decoding, so the round visits the states the
            evaluated driver reaches).
        dagger_temperature: the sampling temperature of a ``"sample"`` round (> 0; 1, the default:
            the policy's own distribution; above 1 the rounds visit more varied states, as the
            injected noise of DART, Laskey et al. 2017). Another value with ``"argmax"`` is refused.
        setting: a named setting (``train/run.py --setting``, :data:`train.settings.SETTINGS`:
            ``goal``, ``sim_agent``) whose fields become the ``--env.*`` defaults.
        env, policy: the env setting and the policy sizes (``--env.*`` / ``--policy.*`` as
            ``train/run.py`` takes them; defaults: its CPU defaults).
        device, seed, num_threads, quiet, debug: as ``train/run.py``.
    """

    data: str = "data/womd_sample"
    eval_data: str | None = None
    out: str = "runs/bc/checkpoint.pt"
    epochs: int = 10
    learning_rate: float = 1e-3
    anneal_lr: bool = False
    average_epochs: int = 0
    adam_eps: float = 1e-5
    max_grad_norm: float = 0.5
    minibatch_worlds: int = 4
    num_worlds: int = 32
    keep_best: bool = False
    dagger_rounds: int = 0
    dagger_epochs: int = 5
    dagger_expert_share: float = 0.0
    dagger_decode: str = "sample"
    dagger_temperature: float = 1.0
    setting: str | None = None
    env: EnvConfig = field(default_factory=lambda: TrainConfig().env)
    policy: PolicyConfig = field(default_factory=lambda: TrainConfig().policy)
    device: str = field(default_factory=default_device)
    seed: int = 1
    num_threads: int = 0
    quiet: bool = False
    debug: bool = False


@dataclass
class BCData:
    """Teacher-forcing data of whole episodes, on the device (N rows = agents, T steps).

    Attributes:
        obs: [N, T, D'] float32, ``policy.prepare_obs`` of the observations (removed steps zeroed).
        actions: [N, T] int64 (discrete) or [N, T, 2] float32 (continuous): the expert actions.
        removed: [N, T] bool, the agent was out of play when the observation was taken.
        terminal: [N, T] bool, all False (one episode per row).
        mask: [N, T] bool, the target is kept (in play, valid log, in range).
        world: [N] int64, the collection world of the row (minibatches group rows by world).
        counts: ``agent_steps`` (in play), ``invalid_log``, ``out_of_range``, ``valid`` (ints).
    """

    obs: torch.Tensor
    actions: torch.Tensor
    removed: torch.Tensor
    terminal: torch.Tensor
    mask: torch.Tensor
    world: torch.Tensor
    counts: dict


def make_bc_env(cfg: BCConfig, data: str, say=print):
    """The env of the collection: ``cfg.env`` with contacts ignored, on ``data``
    (:func:`train.setup.make_env`: pack conversion, settings reconciled with a saved pack).

    Returns:
        ``(env, env_config)``: the :class:`gpusim.env.DriveEnv` and the setting (``cfg.env`` as
        reconciled with the pack, contacts as given) that the checkpoint records.
    """
    from train.setup import make_env

    # never mirrored (EnvConfig.mirror, gpusim/data/mirror.py): the log is cloned as driven, on the right
    collect_cfg = cfg.env.replace(collision_behavior="ignore", offroad_behavior="ignore", mirror=False)
    tcfg = dataclasses.replace(TrainConfig(), data=data, env=collect_cfg, num_worlds=cfg.num_worlds,
                               device=cfg.device, seed=cfg.seed)
    env = make_env(tcfg, collect_cfg, user_set=_user_set(cfg), say=say)
    setting = env.config.replace(collision_behavior=cfg.env.collision_behavior,
                                 offroad_behavior=cfg.env.offroad_behavior)
    return env, setting


def _user_set(cfg: BCConfig) -> set:
    """The ``--env.*`` fields ``cfg`` sets (differ from the defaults)."""
    default = BCConfig().env
    return {f.name for f in dataclasses.fields(EnvConfig) if getattr(cfg.env, f.name) != getattr(default, f.name)}


@torch.no_grad()
def collect(env, policy: ActorCritic, driver: ActorCritic | None = None, expert_share: float = 0.0,
            world_offset: int = 0, decode: str = "sample", temperature: float = 1.0) -> BCData:
    """Run every scenario of ``env``'s pack once (module docstring, step 1) and record, at every
    step, the observation and the expert action (the target).

    Args:
        env: a :class:`gpusim.env.DriveEnv` (W worlds, C slots, horizon T).
        policy: the policy whose :meth:`~policy.ActorCritic.prepare_obs` compacts the observations.
        driver: None: every controlled agent takes the expert action (the log is followed). A policy:
            the agents drive with actions sampled from it (its memory over the episode; a DAgger
            round, step 4), each agent-step taking the expert action instead with probability
            ``expert_share`` (torch's global generator).
        world_offset: added to the recorded ``world`` ids (rounds of one dataset stay apart).
        decode: the driver's actions: ``"sample"`` (drawn) or ``"argmax"`` (its most likely one).
        temperature: the sampling temperature of ``"sample"`` (:class:`policy.actor.Actor`).

    Returns:
        :class:`BCData` of the active slots (rows of padding worlds left out). Where the expert
        drives, a target out of the action range is masked and counted (``out_of_range``); where
        the driver drives, the agent is off its log by its own doing, and the expert action (the
        dynamics' inverse toward the next logged pose, clamped to the action range) is the
        correction it is trained on: only an invalid next logged pose masks it.

    Raises:
        ValueError: ``decode`` is neither ``"sample"`` nor ``"argmax"``.
    """
    from gpusim.sim.motion import expert_targets
    from policy.actor import Actor

    W, C, T = env.num_worlds, env.num_slots, env.horizon
    S = env.pack.num_scenarios
    dev = env.device
    parts = {k: [] for k in ("obs", "actions", "removed", "mask", "world")}
    counts = {"agent_steps": 0, "invalid_log": 0, "out_of_range": 0, "valid": 0}
    if decode not in DAGGER_DECODES:
        raise ValueError(f"decode must be 'sample' or 'argmax', got {decode!r}")
    actor = None if driver is None else Actor(driver, W * C, T, device=dev,
                                               deterministic="argmax" if decode == "argmax" else False,
                                               temperature=temperature)
    for start in range(0, S, W):
        n = min(W, S - start)
        scen = torch.arange(start, start + W, device=dev).clamp(max=S - 1)  # padding worlds repeat the last
        obs = env.reset(scenarios=scen)
        active = env.state.slot_active.clone()  # [W, C]
        active[n:] = False
        removed = torch.zeros(W, C, dtype=torch.bool, device=dev)
        if actor is not None:
            actor.begin()
        rows = {k: [] for k in ("obs", "actions", "removed", "keep", "valid", "reach")}
        for _ in range(T):
            target = expert_targets(env.sim, env.state)
            expert = env.expert_actions()
            rows["obs"].append(policy.prepare_obs(obs, removed))
            rows["removed"].append(removed)
            rows["actions"].append(expert)
            action = expert
            if actor is not None:
                drawn = actor.env_action(actor.act(obs.reshape(W * C, -1)).action).reshape(expert.shape)
                take = torch.rand(W, C, device=dev) < expert_share
                action = torch.where(take.reshape(W, C, *([1] * (expert.dim() - 2))), expert, drawn)
            state, res = env.advance(env.state, env.validate_actions(action), episode_end=False)
            env.commit(state)  # no auto-reset: the last step's pose is compared below
            if actor is None:  # the expert drove: did it reach the logged pose it aimed at?
                reach = torch.linalg.vector_norm(env.state.pos[:, :C] - target["pos"], dim=-1) <= TRACK_TOLERANCE
            else:  # the driver drove: its label is the correction, never out of range
                reach = torch.ones_like(target["valid"])
            rows["keep"].append(res.loss_mask & active)
            rows["valid"].append(target["valid"])
            rows["reach"].append(reach)
            obs, removed = res.obs, res.removed
            if actor is not None:
                actor.observe(res.terminal.reshape(-1), res.removed.reshape(-1))
        st = {k: torch.stack(v, dim=2) for k, v in rows.items()}  # [W, C, T, ...]
        keep, valid, reach = st["keep"], st["valid"], st["reach"]
        mask = keep & valid & reach
        counts["agent_steps"] += int(keep.sum())
        counts["invalid_log"] += int((keep & ~valid).sum())
        counts["out_of_range"] += int((keep & valid & ~reach).sum())
        counts["valid"] += int(mask.sum())
        sel = active.reshape(-1)
        parts["obs"].append(st["obs"].reshape(W * C, T, -1)[sel])
        parts["actions"].append(st["actions"].reshape(W * C, T, *st["actions"].shape[3:])[sel])
        parts["removed"].append(st["removed"].reshape(W * C, T)[sel])
        parts["mask"].append(mask.reshape(W * C, T)[sel])
        world = (torch.arange(W, device=dev) + start + world_offset)[:, None].expand(W, C)
        parts["world"].append(world.reshape(-1)[sel])
    out = {k: torch.cat(v) for k, v in parts.items()}
    return BCData(obs=out["obs"], actions=out["actions"], removed=out["removed"],
                  terminal=torch.zeros_like(out["removed"]), mask=out["mask"], world=out["world"], counts=counts)


class BCBuffer:
    """The DAgger dataset, grown round by round in buffers allocated once.

    Appending by concatenation holds the old dataset, the new round and the result at once: about
    twice the dataset at its peak, which ran a 2-trial DAgger run of the 175 train scenes out of a
    24 GiB machine. The buffer is allocated for every round up front (``capacity`` rows), each round
    is copied into its place, and :meth:`view` is the filled rows without a copy.

    Args:
        data: the first rows (the log's dataset); copied in, so the caller may drop it.
        capacity: the rows to allocate (e.g. the log's rows x (1 + DAgger rounds)); a later append
            beyond it still works, by concatenation.

    Each field keeps :class:`BCData`'s dtype and per-row shape ([T, D'] observations, [T] masks...),
    on ``data``'s device; nothing is raised (rows of another T or width fail in the copy).
    """

    def __init__(self, data: BCData, capacity: int):
        n = data.obs.shape[0]
        capacity = max(int(capacity), n)
        self.counts = data.counts
        self.fields = [f.name for f in dataclasses.fields(BCData) if f.name != "counts"]
        self.buf = {}
        for name in self.fields:
            t = getattr(data, name)
            self.buf[name] = t.new_empty((capacity, *t.shape[1:]))
            self.buf[name][:n] = t
        self.n = n

    def append(self, more: BCData) -> None:
        """Copy ``more``'s rows after the filled ones (same env and policy: same T and widths);
        ``counts`` stay the first data's (the log's)."""
        m = more.obs.shape[0]
        for name in self.fields:
            t = getattr(more, name)
            if self.n + m > self.buf[name].shape[0]:  # beyond the reserve: grow (rare)
                self.buf[name] = torch.cat([self.buf[name][: self.n], t])
            else:
                self.buf[name][self.n: self.n + m] = t
        self.n += m

    def view(self) -> BCData:
        """The filled rows as :class:`BCData` (views into the buffers)."""
        return BCData(**{name: self.buf[name][: self.n] for name in self.fields}, counts=self.counts)


def check_targets(data: BCData, flag: str) -> None:
    """Refuse a dataset without a kept target.

    Raises:
        UserError: one line with the counts of :attr:`BCData.counts`.
    """
    c = data.counts
    if c["valid"] == 0:
        raise UserError(f"{flag}: no valid BC target: {c['agent_steps']} controlled agent-steps, "
                        f"{c['invalid_log']} with an invalid log, {c['out_of_range']} out of the action range; "
                        "use other scenarios or another --env setting")


def bc_loss(policy: ActorCritic, data: BCData, rows: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Negative log-likelihood of the expert actions on ``rows`` [B] int64 of ``data``.

    Returns:
        ``(loss, stats)``: the scalar NLL (nats per kept step; 0 without a kept step) and detached
        scalar tensors ``nll``, ``accuracy`` (discrete: argmax == target; continuous: mean absolute
        error of the mean, action units), ``steps`` (kept steps).
    """
    from train.ppo import masked_mean

    mask = data.mask[rows]
    logits, _ = policy(data.obs[rows], data.terminal[rows], data.removed[rows], prepared=True)
    actions = data.actions[rows]
    nll = masked_mean(-policy.log_prob(logits, actions), mask)
    with torch.no_grad():
        if policy.continuous:
            hit = (logits - actions).abs().mean(-1)
        else:
            hit = (logits.argmax(-1) == actions).float()
        stats = {"nll": nll.detach(), "accuracy": masked_mean(hit, mask), "steps": mask.sum().float()}
    return nll, stats


def majority_baseline(train: BCData, held: BCData) -> tuple[int, float] | None:
    """The most common kept target of ``train`` (discrete actions: the joint index) and its share
    of ``held``'s kept targets: the held-out accuracy of a policy that always predicts it, the floor
    a BC policy's accuracy is read against. None for continuous actions or no kept target."""
    if train.actions.dtype != torch.int64 or not bool(train.mask.any()) or not bool(held.mask.any()):
        return None
    mode = int(torch.mode(train.actions[train.mask]).values)
    return mode, float((held.actions[held.mask] == mode).float().mean())


@torch.no_grad()
def evaluate_bc(policy: ActorCritic, data: BCData, rows_per_batch: int) -> dict:
    """Held-out NLL and accuracy (:func:`bc_loss`'s, weighted by kept steps) over all of ``data``."""
    policy.eval()
    tot = {"nll": 0.0, "accuracy": 0.0, "steps": 0.0}
    n = data.obs.shape[0]
    for i in range(0, n, rows_per_batch):
        _, s = bc_loss(policy, data, torch.arange(i, min(n, i + rows_per_batch), device=data.obs.device))
        k = float(s["steps"])
        tot["nll"] += float(s["nll"]) * k
        tot["accuracy"] += float(s["accuracy"]) * k
        tot["steps"] += k
    k = max(tot["steps"], 1.0)
    return {"nll": tot["nll"] / k, "accuracy": tot["accuracy"] / k, "steps": int(tot["steps"])}


def annealed_lr(base: float, epoch: int, step: int, steps_in_epoch: int, total_epochs: int) -> float:
    """The learning rate of ``--anneal-lr`` at minibatch ``step`` (0-based) of ``epoch`` (1-based):
    ``base * (1 - progress)`` with ``progress = (epoch - 1 + step / steps_in_epoch) / total_epochs``,
    so the first step of the run uses ``base`` and the last one ``base / (total_epochs *
    steps_in_epoch)`` above 0. Epochs weigh the same whatever their number of minibatches (a DAgger
    epoch runs over a larger dataset). The anneal itself is :func:`train.ppo.linear_lr`, the
    trainer's."""
    from train.ppo import linear_lr

    return linear_lr(base, (epoch - 1 + step / max(steps_in_epoch, 1)) / max(total_epochs, 1))


def train_bc(cfg: BCConfig, say=print) -> dict:
    """Collect, train, evaluate and save (module docstring).

    Returns:
        ``{"checkpoint", "counts", "eval_counts", "epochs": [{"epoch", "round", "loss", "eval_nll",
        "eval_accuracy", "steps_per_s"}], "collect_s", "majority", "best", "dagger"}``
        (``majority``: :func:`majority_baseline`, None without ``--eval-data``; ``best``: the
        ``--keep-best`` record, else None; ``dagger``: per DAgger round, its :attr:`BCData.counts`
        with ``round`` and ``collect_s``; ``average``: with ``--average-epochs``, ``{"epochs", "last"}``
        and the averaged weights' ``eval_nll`` / ``eval_accuracy`` on ``--eval-data``, else None).

    Raises:
        UserError: bad numbers (e.g. ``--average-epochs`` outside [0, all epochs], a
            ``--dagger-temperature`` with ``--dagger-decode argmax``), a dataset without a kept
            target, a missing ``--eval-data`` (also ``--keep-best`` without one); as
            :func:`train.setup.make_env`. gpusim.fileio.OutputError: ``--out`` cannot be written
            (checked before the work).
    """
    from gpusim.fileio import check_output_path
    from train.checkpoint import save_checkpoint
    from train.config import resolve_path
    from train.ppo import make_optimizer

    for name, value in (("--epochs", cfg.epochs), ("--minibatch-worlds", cfg.minibatch_worlds),
                        ("--num-worlds", cfg.num_worlds), ("--dagger-epochs", cfg.dagger_epochs)):
        if value < 1:
            raise UserError(f"{name} must be >= 1, got {value}")
    if cfg.dagger_rounds < 0:
        raise UserError(f"--dagger-rounds must be >= 0, got {cfg.dagger_rounds}")
    if not 0.0 <= cfg.dagger_expert_share <= 1.0:
        raise UserError(f"--dagger-expert-share must be in [0, 1], got {cfg.dagger_expert_share}")
    if cfg.dagger_decode not in DAGGER_DECODES:
        raise UserError(f"--dagger-decode must be sample or argmax, got {cfg.dagger_decode!r}")
    if not cfg.dagger_temperature > 0:
        raise UserError(f"--dagger-temperature must be > 0, got {cfg.dagger_temperature}")
    if cfg.dagger_decode == "argmax" and cfg.dagger_temperature != 1.0:
        raise UserError("--dagger-temperature applies to sampled rounds: it does nothing with --dagger-decode argmax")
    total_epochs = cfg.epochs + cfg.dagger_rounds * cfg.dagger_epochs
    if not 0 <= cfg.average_epochs <= total_epochs:
        raise UserError(f"--average-epochs must be in [0, {total_epochs}] (the run's epochs, DAgger epochs "
                        f"included), got {cfg.average_epochs}")
    if cfg.keep_best and not cfg.eval_data:
        raise UserError("--keep-best chooses the epoch by the held-out NLL: give --eval-data DIR (e.g. the validation split)")
    check_output_path(cfg.out, "--out")  # before the work: a finished run is never lost to its output
    if cfg.eval_data and not resolve_path(cfg.eval_data).exists():
        raise UserError(f"--eval-data {cfg.eval_data}: no such file or directory (also tried "
                        f"{resolve_path(cfg.eval_data)})")
    device = check_device(cfg.device)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(cfg.seed)
    env, setting = make_bc_env(cfg, cfg.data, say)
    policy = ActorCritic.for_env(env, cfg.policy).to(device)
    continuous = policy.continuous
    t0 = time.perf_counter()
    data = collect(env, policy)
    collect_s = time.perf_counter() - t0
    c = data.counts
    say(f"bc data {cfg.data}: {env.pack.num_scenarios} scenarios, {data.obs.shape[0]} agents x {env.horizon} steps; "
        f"{c['agent_steps']} controlled agent-steps: {c['valid']} targets kept, {c['invalid_log']} invalid log, "
        f"{c['out_of_range']} out of range ({collect_s:.1f} s)")
    check_targets(data, f"--data {cfg.data}")
    held = majority = None
    if cfg.eval_data:
        eval_env, _ = make_bc_env(cfg, cfg.eval_data, say)
        held = collect(eval_env, policy)
        e = held.counts
        say(f"bc eval data {cfg.eval_data}: {e['valid']} targets kept of {e['agent_steps']} agent-steps "
            f"({e['invalid_log']} invalid log, {e['out_of_range']} out of range)")
        majority = majority_baseline(data, held)
        if majority is not None:
            say(f"bc eval data: the training targets' most common action ({majority[0]}) is {majority[1]:.3f} of "
                "these targets, the accuracy of always predicting it")
        del eval_env
    optimizer = make_optimizer(policy.parameters(), cfg.learning_rate, cfg.adam_eps)
    generator = torch.Generator(device=device)
    generator.manual_seed(cfg.seed)
    worlds = torch.unique(data.world)
    rows_per_world = data.obs.shape[0] / max(worlds.numel(), 1)
    eval_rows = max(1, int(math.ceil(cfg.minibatch_worlds * rows_per_world)))
    tcfg = dataclasses.replace(TrainConfig(), data=cfg.data, env=setting, policy=cfg.policy,
                               num_worlds=cfg.num_worlds, device=cfg.device, seed=cfg.seed,
                               learning_rate=cfg.learning_rate, anneal_lr=cfg.anneal_lr)
    config = tcfg.to_dict()
    history, trained, best, rounds = [], 0, None, []

    def save(path: pathlib.Path, epochs_done: int, model: ActorCritic | None = None,
             averaged: int = 0) -> pathlib.Path:
        extra = {"bc": {"data": cfg.data, "eval_data": cfg.eval_data, "epochs": epochs_done, "counts": c,
                        "averaged_epochs": averaged,
                        "history": list(history), "track_tolerance": TRACK_TOLERANCE,
                        "majority_accuracy": None if majority is None else majority[1],
                        "dagger": {"rounds": cfg.dagger_rounds, "epochs": cfg.dagger_epochs,
                                   "expert_share": cfg.dagger_expert_share, "decode": cfg.dagger_decode,
                                   "temperature": cfg.dagger_temperature,
                                   "collected": list(rounds)}}}
        if best is not None:
            extra["best"] = dict(best)
        return save_checkpoint(path, policy=policy if model is None else model, optimizer=optimizer,
                               global_step=trained, update=epochs_done, config=config, env_config=config["env"],
                               extra=extra)

    best_path = pathlib.Path(cfg.out).with_name("best.pt")
    last_path = pathlib.Path(cfg.out).with_name("last.pt")
    if cfg.keep_best:
        check_output_path(best_path, "--keep-best")
    averaged = None
    if cfg.average_epochs:
        check_output_path(last_path, "--average-epochs")
        averaged = torch.optim.swa_utils.AveragedModel(policy)
    schedule = [(0, cfg.epochs)] + [(r, cfg.dagger_epochs) for r in range(1, cfg.dagger_rounds + 1)]
    epoch = 0
    if cfg.dagger_rounds:  # every round collects the same scenarios: as many rows as the log's
        buffer = BCBuffer(data, capacity=data.obs.shape[0] * (1 + cfg.dagger_rounds))
        data = buffer.view()
    for round_no, round_epochs in schedule:
        if round_no > 0:  # DAgger: the policy drives, the expert labels, the dataset grows
            policy.eval()
            t0 = time.perf_counter()
            more = collect(env, policy, driver=policy, expert_share=cfg.dagger_expert_share, decode=cfg.dagger_decode,
                           temperature=cfg.dagger_temperature,
                           world_offset=round_no * env.pack.num_scenarios)
            m = more.counts
            rounds.append(dict(m, round=round_no, collect_s=time.perf_counter() - t0))
            buffer.append(more)
            del more
            data = buffer.view()
            how = "argmax" if cfg.dagger_decode == "argmax" else f"sample at temperature {cfg.dagger_temperature:g}"
            say(f"dagger round {round_no}/{cfg.dagger_rounds}: {m['valid']} targets of {m['agent_steps']} agent-steps "
                f"driven by the policy ({how}; {m['invalid_log']} invalid log; expert share "
                f"{cfg.dagger_expert_share:g}); {int(data.mask.sum())} targets in all "
                f"({rounds[-1]['collect_s']:.1f} s)")
            worlds = torch.unique(data.world)
        for _ in range(round_epochs):
            epoch += 1
            policy.train()
            t0 = time.perf_counter()
            total, steps = 0.0, 0.0
            order = worlds[torch.randperm(worlds.numel(), generator=generator, device=device)]
            starts = range(0, order.numel(), cfg.minibatch_worlds)
            for step, i in enumerate(starts):
                if cfg.anneal_lr:
                    for g in optimizer.param_groups:
                        g["lr"] = annealed_lr(cfg.learning_rate, epoch, step, len(starts), total_epochs)
                pick = order[i: i + cfg.minibatch_worlds]
                rows = torch.nonzero(torch.isin(data.world, pick)).flatten()
                loss, stats = bc_loss(policy, data, rows)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
                optimizer.step()
                k = float(stats["steps"])
                total, steps = total + float(stats["nll"]) * k, steps + k
            seconds = time.perf_counter() - t0
            trained += int(steps)
            rec = {"epoch": epoch, "round": round_no, "loss": total / max(steps, 1.0),
                   "steps_per_s": steps / max(seconds, 1e-9)}
            line = (f"epoch {epoch}/{total_epochs}: train nll {rec['loss']:.4f}, "
                    f"{rec['steps_per_s']:,.0f} agent-steps/s")
            if held is not None:
                ev = evaluate_bc(policy, held, eval_rows)
                rec.update(eval_nll=ev["nll"], eval_accuracy=ev["accuracy"])
                line += f"; held-out nll {ev['nll']:.4f}, {'mae' if continuous else 'accuracy'} {ev['accuracy']:.3f}"
            history.append(rec)
            if averaged is not None and epoch > total_epochs - cfg.average_epochs:
                averaged.update_parameters(policy)
                line += f"; averaged {int(averaged.n_averaged)}"
            if cfg.keep_best and (best is None or rec["eval_nll"] < best["value"]):
                best = {"entry": "eval_nll", "value": rec["eval_nll"], "epoch": epoch}
                save(best_path, epoch)
                line += "; best.pt"
            if not cfg.quiet:
                say(line)
    average = None
    if averaged is None:
        path = save(pathlib.Path(cfg.out), total_epochs)
    else:
        save(last_path, total_epochs)
        path = save(pathlib.Path(cfg.out), total_epochs, model=averaged.module, averaged=cfg.average_epochs)
        average = {"epochs": cfg.average_epochs, "last": str(last_path)}
        if held is not None:
            ev = evaluate_bc(averaged.module, held, eval_rows)
            average.update(eval_nll=ev["nll"], eval_accuracy=ev["accuracy"])
            say(f"average of the last {cfg.average_epochs} epochs: held-out nll {ev['nll']:.4f}, "
                f"{'mae' if continuous else 'accuracy'} {ev['accuracy']:.3f}")
    say(f"bc checkpoint {path}" + (f" (the average of the last {cfg.average_epochs} epochs; the last epoch's own "
                                    f"weights: {last_path})" if averaged is not None else "")
        + (f"; best.pt: epoch {best['epoch']}, held-out nll {best['value']:.4f}" if best else ""))
    return {"checkpoint": str(path), "counts": c, "eval_counts": held.counts if held is not None else None,
            "epochs": history, "collect_s": collect_s, "majority": majority, "best": best, "dagger": rounds,
            "average": average}


def parse_args(argv=None) -> BCConfig:
    """The command line as a :class:`BCConfig` (tyro; enums by lower-case name).

    Raises:
        SystemExit: unknown or invalid flags (exit code 2).
    """
    import tyro

    from train.config import cli_registry

    from train.settings import setting_config

    parse = lambda default: tyro.cli(BCConfig, args=argv, registry=cli_registry(),  # noqa: E731
                                     description=__doc__.split("\n\n")[0], default=default)
    cfg = parse(None)
    if cfg.setting is None:
        return cfg
    return parse(dataclasses.replace(BCConfig(), env=setting_config(BCConfig().env, cfg.setting)[0]))


def main(argv=None) -> int:
    """CLI entry point: 0 on success, 2 on a user error (one line on stderr; ``--debug`` re-raises)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = parse_args(argv)
        train_bc(cfg)
    except USER_ERRORS as e:
        if "--debug" in argv:
            raise
        print(f"error: {one_line(e)}  (--debug shows the traceback)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from train.config import one_line_warnings

    one_line_warnings("--debug" in sys.argv)  # here, not in main(): the format is process-wide
    sys.exit(main())
