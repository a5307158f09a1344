"""CUDA-graph capture of the steady-state rollout step (docs/design.md section 3).

On a GPU a rollout step is launch-bound: about 100 small env kernels plus the policy's
(docs/performance.md). :class:`GraphedRollout` collects the same rollout as
:func:`train.rollout.collect_rollout` (same buffers, same values), but replays every step that
does not end the episode from one captured graph: the actor's act (:class:`policy.actor.Actor`:
policy ``forward_eval`` on the KV cache, action sampling), the log-probability, the env step
(:meth:`gpusim.env.DriveEnv.advance`), the writes into the :class:`~train.rollout.RolloutBatch`
and the actor's observe (removed flags, cache reset of terminal slots). Warm-up, audit, static
env state, capture, replay and fallback are :class:`gpusim.cuda_graph.GraphEngine`'s; this module
is its client (the body of the step and the eager steps around it).

How the step is made replayable (a graph replays fixed addresses and no Python):

* **Static buffers.** The captured step reads the observation, the actor's ``removed`` flags, the env
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

from gpusim.cuda_graph import CudaGraphCapture, GraphEngine, graph_decision
from policy.actor import Actor
from train.rollout import RolloutBatch, begin_rollout, collect_rollout, record_action, record_result, rollout_step


def make_rollout(mode: str, env, policy, buffer: RolloutBatch, cache, say=None):
    """The trainer's rollout function for ``TrainConfig.cuda_graph`` (``"auto"`` / ``"on"`` / ``"off"``).

    Returns a callable ``rollout(obs, coplayers=None, trial_log=None) -> (next_obs, buffer)``:
    a :class:`GraphedRollout` when :func:`gpusim.cuda_graph.graph_decision` says so, else
    :func:`train.rollout.collect_rollout` bound to the same arguments. With ``"on"`` and no graph
    possible, ``say`` (default ``warnings.warn``) gets one line with the reason.
    """
    from gpusim.env import DriveEnv

    if isinstance(env, DriveEnv):
        enabled, reason = graph_decision(mode, env.device, env.step_backend)
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
        actor: the :class:`policy.actor.Actor` acting on ``cache``. engine: the
        :class:`gpusim.cuda_graph.GraphEngine`. fallback_reason: why the rollout runs eagerly now
        (None while graphs are used). stats: ``captures``, ``replays``, ``warm_steps``,
        ``eager_steps`` counted over all calls.

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
        W, C, dev = env.num_worlds, env.num_slots, env.device
        self.actor = Actor(policy, device=dev, deterministic=deterministic, cache=cache)
        self._obs = torch.zeros(W, C, env.obs_dim, device=dev)
        self._ego = torch.zeros(W * C, dtype=torch.bool, device=dev)
        self._col = torch.zeros(1, dtype=torch.int64, device=dev)
        self._trial_log = None
        self._has_ego = False
        capture = capture if capture is not None else CudaGraphCapture(env.device, (env.generator,))
        self.engine = GraphEngine(env, self._body, self._roots, capture, warmup, say or _warn,
                                  "the rollout runs eagerly")

    @property
    def fallback_reason(self) -> str | None:
        """Why the rollout runs eagerly now (None while graphs are used)."""
        return self.engine.fallback_reason

    @property
    def stats(self) -> dict:
        """``captures``, ``replays``, ``warm_steps``, ``eager_steps`` (the engine's counters)."""
        return self.engine.stats

    # ------------------------------------------------------------------ public
    def __call__(self, obs: torch.Tensor, coplayers=None, trial_log=None):
        engine = self.engine
        if engine.fallback_reason is None and coplayers is not None:
            engine.fallback("co-players drive some slots (their partner policies are not captured)")
        if engine.fallback_reason is None and self.env.device.type == "cuda" and self.env.check_actions == "sync":
            engine.fallback("EnvConfig.check_actions='sync' reads the actions on the host every step (use 'auto')")
        if engine.fallback_reason is not None:
            return collect_rollout(self.env, self.policy, obs, self.buffer, self.cache, self.actor.deterministic,
                                   coplayers=coplayers, trial_log=trial_log)
        with torch.no_grad():
            return self._collect(obs, trial_log)

    # ------------------------------------------------------------------ the rollout
    def _collect(self, obs, trial_log):
        env, buf = self.env, self.buffer
        ego = begin_rollout(env, self.actor, buf)
        self._col.zero_()
        if ego is not None:
            self._ego.copy_(ego)
        self._trial_log, self._has_ego = trial_log, ego is not None
        H = buf.horizon
        for t in range(H):
            steady = env.episode_step + 1 < env.horizon and env.stage_hook is None
            if steady and self.engine.step((id(trial_log), ego is not None), [(self._obs, obs)]):
                obs = self._obs
                continue
            obs = rollout_step(env, self.actor, t, obs, buf, ego, None, trial_log)
            self.engine.stats["eager_steps"] += 1
            if t + 1 < H:
                self._col.fill_(t + 1)
        return obs, buf

    def _body(self) -> None:
        """The captured step: reads and writes static buffers only (module docstring)."""
        env, actor, buf, engine = self.env, self.actor, self.buffer, self.engine
        W, C = env.num_worlds, env.num_slots
        col = self._col
        o = self._obs.reshape(W * C, -1)
        act = actor.act(o)

        def put(name: str, value: torch.Tensor) -> None:
            _put(getattr(buf, name), col, value)
        record_action(put, actor, o, act, act.action)  # the same column writes as the eager step
        env_action = actor.env_action(act.action.reshape(W, C, *act.action.shape[1:]))
        new_state, res = env.advance(engine.state, env.validate_actions(env_action), episode_end=False)
        record_result(put, actor, res, self._ego if self._has_ego else None)
        if self._trial_log is not None and "trial_end" in res.info:
            # the static state still holds the values before this step (engine.finish copies below)
            self._trial_log.step(engine.state, res.info["trial_end"])
        dst, src = [], []
        if res.obs is not self._obs:
            dst.append(self._obs)
            src.append(res.obs)
        col.add_(1)
        engine.finish(new_state, dst, src)

    def _roots(self) -> dict:
        """What the engine's audit watches: the env, the actor (its cache and removed flags), the
        buffer and the trial log."""
        return {"env": self.env, "actor": self.actor, "buffer": self.buffer, "trial_log": self._trial_log}


def _put(dst: torch.Tensor, col: torch.Tensor, x: torch.Tensor) -> None:
    """``dst[:, col] = x`` with ``col`` a [1] int64 device tensor (no host value: graph-safe)."""
    dst.index_copy_(1, col, x.unsqueeze(1).to(dst.dtype))
