"""CUDA-graph capture of the steady-state rollout step (issue 14 item 4; DESIGN.md section 2).

On a GPU a rollout step is launch-bound: about 100 small env kernels plus the policy's
(docs/performance.md). :class:`GraphedRollout` collects the same rollout as
:func:`train.rollout.collect_rollout` (same buffers, same values), but replays every step that
does not end the episode from one captured graph: policy ``forward_eval`` on the KV cache, action
sampling, log-probability, the env step (:meth:`gpusim.env.DriveEnv.advance`), the writes into
the :class:`~train.rollout.RolloutBatch` and the cache reset of terminal slots.

How the step is made replayable (a graph replays fixed addresses and no Python):

* **Static buffers.** The captured step reads the observation, the ``removed`` flags, the env
  state and the episode's start state (trial restore) from static buffers, and copies the new
  state's fields (the stages return new tensors through ``state.replace``) back into them at its
  end; ``env.state`` *is* the static state between steps. Outside the graph, before a replay,
  only what changed address is copied in (``torch._foreach_copy_``): after the eager
  episode-end step, the new episode's state and start state, once per rollout.
* **Device indices.** The buffer column is a device counter (``index_copy_`` at it, then ``+1``
  in the graph); the KV cache's write position is already a device tensor
  (``KVCache.position``), so one graph serves every step index.
* **Host-side branches stay outside.** The episode-end step (auto-reset: a host branch on the
  host clock, scenario draws, a streaming pool swap) runs eagerly through
  :func:`train.rollout.rollout_step`; so does any step while a stage hook is set. The host clock
  ``env.episode_step`` is advanced outside the graph.
* **Addresses that change.** The graph is keyed on the scenario pack's tensors (address, shape)
  and on the trial log / ego roles it was captured with: a pool swap or ``use_pack`` makes the
  next step warm up and capture again (the old graph is dropped).
* **Attributes reassigned by a step.** The step is audited on its warm-up calls: a tensor
  attribute of the env, the cache, the buffer or the trial log that the step *reassigns* (e.g.
  the observation stage's ``obs_written``, the async action check's error record) is *pinned*: a
  static tensor is kept, the graphed step copies the new value into it and puts it back. A host
  value (int, float, bool, str) the step changes, or a tensor attribute that changes shape, makes
  the rollout fall back to eager with that reason (a replay would not change it).
* **Randomness.** Action sampling draws from the default CUDA generator (``torch.rand_like`` /
  ``randn_like``), which ``torch.cuda.graph`` registers itself; the env's seeded generator
  (NEW_GOAL samples inside the step) is registered with every graph
  (``CUDAGraph.register_generator_state``). A registered generator's Philox offset advances by
  the graph's total on each replay, so replays draw fresh numbers; the scenario draws of the
  auto-reset run in the eager episode-end step.
* **Fallback.** A host sync seen in the last warm-up step (run under
  ``torch.cuda.set_sync_debug_mode("warn")``, :func:`gpusim.cuda_graph.host_syncs`: the reason
  names the file and line), capture failure (an unregistered generator, anything torch
  rejects), an audit finding, or co-players (their partner policies are not captured) switch
  the rollout to eager for good, with one warning naming the reason
  (:attr:`GraphedRollout.fallback_reason`).

Aliasing (documented contract): the observation returned by a call is the static observation
buffer; it is overwritten by the next call (as the env's own observation buffer is by the next
``step``). Clone what must outlive it.

The capture mechanism is an argument (``capture``): :class:`gpusim.cuda_graph.CudaGraphCapture`
on CUDA, :class:`gpusim.cuda_graph.FakeGraphCapture` on the CPU, where replay re-runs the same
static-buffer step (tests/test_cuda_graph_rollout.py).
"""

from __future__ import annotations

import warnings

import torch

from gpusim.cuda_graph import (CudaGraphCapture, PinnedAttributes, adopt_static_state, copy_all, graph_decision,
                               host_syncs, pack_key)
from train.rollout import RolloutBatch, begin_rollout, collect_rollout, rollout_step


def make_rollout(mode: str, env, policy, buffer: RolloutBatch, cache, say=None):
    """The trainer's rollout function for ``TrainConfig.cuda_graph`` (``"auto"`` / ``"on"`` / ``"off"``).

    Returns a callable ``rollout(obs, coplayers=None, trial_log=None) -> (next_obs, buffer)``:
    a :class:`GraphedRollout` when :func:`gpusim.cuda_graph.graph_decision` says so, else
    :func:`train.rollout.collect_rollout` bound to the same arguments. With ``"on"`` and no graph
    possible, ``say`` (default ``warnings.warn``) gets one line with the reason.
    """
    from gpusim.backend import backend_for
    from gpusim.env import DriveEnv

    if isinstance(env, DriveEnv):
        enabled, reason = graph_decision(mode, env.device, backend_for(env.state.pos))
    else:
        enabled, reason = False, f"the env is a {type(env).__name__}, not a DriveEnv"
    if enabled:
        return GraphedRollout(env, policy, buffer, cache, say=say)
    if mode == "on":
        (say or _warn)(f"cuda_graph='on' but {reason}: the rollout runs eagerly")

    def rollout(obs, coplayers=None, trial_log=None):
        return collect_rollout(env, policy, obs, buffer, cache, coplayers=coplayers, trial_log=trial_log)

    return rollout


def _warn(msg: str) -> None:
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


class GraphedRollout:
    """:func:`train.rollout.collect_rollout` with its steady-state steps replayed from a graph
    (module docstring).

    Args:
        env: a :class:`gpusim.env.DriveEnv`. policy: :class:`policy.ActorCritic`.
        buffer: the :class:`RolloutBatch` every call fills (fixed: the graph writes into it).
        cache: the policy's KV cache for W * C slots (fixed).
        capture: capture backend (default :class:`gpusim.cuda_graph.CudaGraphCapture` on the env's
            device, with the env's generator registered).
        warmup: eager warm-up calls of the static step before each capture (>= 1).
        deterministic: argmax / mean actions (evaluation).
        say: where the fallback warning goes (default ``warnings.warn``).

    Attributes:
        fallback_reason: why the rollout runs eagerly now (None while graphs are used).
        stats: ``captures``, ``replays``, ``warm_steps``, ``eager_steps`` counted over all calls.

    Call: ``rollout(obs, coplayers=None, trial_log=None) -> (next_obs [W, C, D], buffer)``, as
    :func:`collect_rollout` (the same errors; bad actions under ``check_actions="async"`` are
    raised at the env's next host read, as eagerly).

    Raises:
        ValueError: ``warmup < 1``.
    """

    def __init__(self, env, policy, buffer: RolloutBatch, cache, capture=None, warmup: int = 2,
                 deterministic: bool = False, say=None):
        if warmup < 1:
            raise ValueError(f"GraphedRollout: warmup must be >= 1, got {warmup}")
        self.env, self.policy, self.buffer, self.cache = env, policy, buffer, cache
        self.capture = capture if capture is not None else CudaGraphCapture(env.device, (env.generator,))
        self.warmup, self.deterministic = int(warmup), bool(deterministic)
        self._say = say or _warn
        self.fallback_reason: str | None = None
        self.stats = {"captures": 0, "replays": 0, "warm_steps": 0, "eager_steps": 0}
        W, C, dev = env.num_worlds, env.num_slots, env.device
        self._obs = torch.zeros(W, C, env.obs_dim, device=dev)
        self._removed = torch.zeros(W * C, dtype=torch.bool, device=dev)
        self._ego = torch.zeros(W * C, dtype=torch.bool, device=dev)
        self._col = torch.zeros(1, dtype=torch.int64, device=dev)
        self._state = None   # EnvState of static buffers (built at the first graphed step)
        self._start = None   # static copy of env.sim.start (trial restore reads it)
        self._pins = PinnedAttributes()  # tensor attributes the step reassigns (gpusim.cuda_graph)
        self._graph = None
        self._key = None
        self._pack = None
        self._pack_key = None
        self._warm = 0
        self._trial_log = None
        self._has_ego = False

    # ------------------------------------------------------------------ public
    def __call__(self, obs: torch.Tensor, coplayers=None, trial_log=None):
        if self.fallback_reason is None and coplayers is not None:
            self._fallback("co-players drive some slots (their partner policies are not captured)")
        if self.fallback_reason is None and self.env.device.type == "cuda" and self.env.check_actions == "sync":
            self._fallback("EnvConfig.check_actions='sync' reads the actions on the host every step (use 'auto')")
        if self.fallback_reason is not None:
            return collect_rollout(self.env, self.policy, obs, self.buffer, self.cache, self.deterministic,
                                   coplayers=coplayers, trial_log=trial_log)
        with torch.no_grad():
            return self._collect(obs, trial_log)

    # ------------------------------------------------------------------ the rollout
    def _collect(self, obs, trial_log):
        env, buf = self.env, self.buffer
        ego = begin_rollout(env, self.policy, buf, self.cache, None, trial_log)
        self._removed.zero_()
        self._col.zero_()
        if ego is not None:
            self._ego.copy_(ego)
        H = buf.horizon
        for t in range(H):
            steady = env.sim.t + 1 < env.horizon and env.stage_hook is None
            if steady and self.fallback_reason is None and self._graph_step(obs, trial_log, ego is not None):
                obs = self._obs
                continue
            obs, removed = rollout_step(env, self.policy, t, obs, self._removed, buf, self.cache, ego,
                                        self.deterministic, None, trial_log)
            self._removed.copy_(removed)
            self.stats["eager_steps"] += 1
            if t + 1 < H:
                self._col.fill_(t + 1)
        return obs, buf

    def _graph_step(self, obs, trial_log, has_ego: bool) -> bool:
        """One steady-state step through the graph (warm-up, capture or replay). False when the
        step was not taken (capture failed: the caller runs it eagerly)."""
        env = self.env
        key = (self._pack_id(), id(trial_log), has_ego)
        if key != self._key:
            self._graph, self._key, self._warm = None, key, 0
        self._trial_log, self._has_ego = trial_log, has_ego
        self._sync_inputs(obs)
        if self._graph is not None:
            self._graph.replay()
            self.stats["replays"] += 1
        elif self._warm < self.warmup:
            syncs: list[str] = []
            if self.capture.name == "cuda" and self._warm == self.warmup - 1:
                # the last warm-up step (lazy one-time set-up is done by then): name the host
                # syncs a capture would fail on
                warm = lambda: syncs.extend(host_syncs(lambda: self.capture.warm(self._body)))  # noqa: E731
            else:
                warm = lambda: self.capture.warm(self._body)  # noqa: E731
            problem = self._audited(warm, capturing=False)
            if not problem and syncs:
                problem = f"the step synchronises with the host at {', '.join(syncs[:3])}"
            self._warm += 1
            self.stats["warm_steps"] += 1
            if problem:  # this step ran (eagerly); later ones cannot be graphed
                self._fallback(problem)
        else:
            graph, problem = self._pins.capture_and_replay(self.capture, self._body, self._roots(), env.device)
            if graph is None:  # nothing ran: the caller steps eagerly
                self._fallback(problem)
                return False
            self._graph = graph
            self.stats["captures"] += 1
            self.stats["replays"] += 1
            if problem:
                self._fallback(problem)
        env.sim.t += 1
        env.state = self._state
        return True

    def _fallback(self, reason: str) -> None:
        self.fallback_reason = reason
        self._graph = None
        self._say(f"CUDA graph off: {reason}; the rollout runs eagerly")

    def _pack_id(self):
        """Key of the scenario pack the graph reads (:func:`gpusim.cuda_graph.pack_key`, recomputed
        when ``env.sim.pack`` changes)."""
        pack = self.env.sim.pack
        if pack is not self._pack:
            self._pack_key, self._pack = pack_key(pack), pack
        return self._pack_key

    # ------------------------------------------------------------------ static buffers
    def _sync_inputs(self, obs) -> None:
        """Outside the graph: copy into the static buffers whatever is not already there (the state
        after an eager step or a reset, the episode's start state, the observation, pinned
        attributes reassigned eagerly). Nothing to copy between graphed steps."""
        env = self.env
        dst, src = [], []
        self._state, self._start = adopt_static_state(env, self._state, self._start, dst, src)
        if obs is not self._obs:
            dst.append(self._obs)
            src.append(obs)
        self._pins.sync_inputs(dst, src)
        copy_all(dst, src)
        env.state = self._state

    def _body(self) -> None:
        """The captured step: reads and writes static buffers only (module docstring)."""
        env, policy, buf, cache = self.env, self.policy, self.buffer, self.cache
        W, C = env.num_worlds, env.num_slots
        R = W * C
        col = self._col
        o = self._obs.reshape(R, -1)
        removed = self._removed
        logits, value, _ = policy.forward_eval(o, cache, removed)
        action = policy.sample(logits, self.deterministic)
        _put(buf.obs, col, o)
        _put(buf.removed, col, removed)
        _put(buf.values, col, value)
        _put(buf.actions, col, action)
        _put(buf.logprobs, col, policy.log_prob(logits, action))
        env_action = action.reshape(W, C, *action.shape[1:])
        if policy.continuous:  # the Gaussian is unbounded; the env takes [-1, 1]
            env_action = env_action.clamp(-1.0, 1.0)
        new_state, res = env.advance(self._state, env.validate_actions(env_action), episode_end=False)
        _put(buf.rewards, col, res.reward.reshape(R))
        _put(buf.terminal, col, res.terminal.reshape(R))
        _put(buf.truncation, col, res.truncation.reshape(R))
        loss_mask = res.loss_mask.reshape(R)
        _put(buf.loss_mask, col, loss_mask & self._ego if self._has_ego else loss_mask)
        if "goal_reached" in res.info:
            _put(buf.goal_reached, col, res.info["goal_reached"].reshape(R))
        policy.reset_cache(cache, res.terminal.reshape(R))
        if self._trial_log is not None and "trial_end" in res.info:
            # world_done of the static state is still the value before this step (copied back below)
            self._trial_log.step(self._state.world_done, res.info["trial_end"])
        dst, src = [self._removed], [res.removed.reshape(R)]
        if res.obs is not self._obs:
            dst.append(self._obs)
            src.append(res.obs)
        for name, s in self._state.tensors().items():
            x = getattr(new_state, name)
            if x is not s:
                dst.append(s)
                src.append(x)
        copy_all(dst, src)
        col.add_(1)
        self._pins.restore()

    # ------------------------------------------------------------------ audit
    def _roots(self) -> dict:
        return {"env": self.env, "cache": self.cache, "buffer": self.buffer, "trial_log": self._trial_log}

    def _audited(self, call, capturing: bool) -> str | None:
        """Run ``call`` under :meth:`gpusim.cuda_graph.PinnedAttributes.audit` of the env, the
        cache, the buffer and the trial log (pins reassigned tensors; returns a reason string for
        anything a replay could not reproduce, else None)."""
        return self._pins.audit(call, self._roots(), capturing)


def _put(dst: torch.Tensor, col: torch.Tensor, x: torch.Tensor) -> None:
    """``dst[:, col] = x`` with ``col`` a [1] int64 device tensor (no host value: graph-safe)."""
    dst.index_copy_(1, col, x.unsqueeze(1).to(dst.dtype))
