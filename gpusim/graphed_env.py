"""A CUDA-graph-replayed :meth:`DriveEnv.step <gpusim.env.DriveEnv.step>` for your own loop.

On a GPU an env step is host-bound below a few thousand worlds: about 100 small kernels launched
from Python (docs/gpu.md, docs/performance.md). The trainer replays its whole rollout step from a
CUDA graph (train/graphed_rollout.py); :class:`GraphedEnv` does the same for the env step alone,
so a hand-written loop gets it too::

    from gpusim.graphed_env import GraphedEnv

    genv = GraphedEnv(env)           # env: a gpusim.env.DriveEnv on CUDA
    obs = genv.reset()               # env.reset()
    res = genv.step(actions)         # the StepResult of env.step(actions), values equal

How a step is replayed (by :class:`gpusim.cuda_graph.GraphEngine`, the engine the trainer's
graphed rollout uses too):

* A step that does not end the episode (``env.episode_step + 1 < env.horizon``) replays one
  captured graph of: the asynchronous action check (:meth:`DriveEnv.validate_actions`),
  :meth:`DriveEnv.advance` with ``episode_end=False``, the copy of the new state's fields into
  static state buffers (``env.state`` *is* that static state between steps) and of the
  :class:`~gpusim.env.StepResult` tensors into static result buffers. The actions are copied into
  a static input buffer first. The host clock ``env.episode_step`` is advanced outside the
  graph (:meth:`DriveEnv.commit`), as :meth:`DriveEnv.step` does.
* The episode-end step (auto-reset: host-side scenario draws, a streaming pool swap) runs
  eagerly through ``env.step``; before the next replay, what changed address (the new episode's
  state, its start state ``env.sim.start`` that trial restarts restore from, attributes pinned by
  the audit) is copied into the static buffers (:class:`gpusim.cuda_graph.PinnedAttributes`).
  So does anything the caller did eagerly in between (``env.reset``, ``env.step``).
* ``warmup`` eager calls of the same static step (on a side stream,
  :class:`gpusim.cuda_graph.CudaGraphCapture`), audited for reassigned attributes, the last one
  under :func:`gpusim.cuda_graph.host_syncs` on CUDA; then the capture. The env's seeded
  generator (NEW_GOAL samples inside the step) is registered with the graph.
* The graph is keyed on the scenario pack's tensors (:func:`gpusim.cuda_graph.pack_key`):
  ``env.use_pack`` or a pool swap makes the next steady step warm up and capture again.

Aliasing contract: the tensors of a :class:`~gpusim.env.StepResult` returned by a replayed step
are static buffers, overwritten by the next step (as the env's observation buffer already is by
every ``env.step``); clone what must outlive the step. The results of eager steps (episode end,
fallback) are the env's own tensors.

Fallback (eager ``env.step`` for good, with one warning naming the reason, kept in
:attr:`GraphedEnv.fallback_reason`): no CUDA device or ``GPUSIM_CUDA_GRAPHS=0``
(:func:`gpusim.cuda_graph.graph_decision`; ``GraphedEnv(env)`` on a CPU env is plain eager, no
error); ``check_actions`` resolving to ``"sync"`` (its per-step host read cannot be captured: use
``"async"``, CUDA's ``"auto"``); co-players (``EnvConfig.ego_slots`` / ``ego_fraction``); a
stage hook set on the env (``env.stage_hook``, e.g. profiling/timers.py); a host sync found in
the last warm-up step; a failed capture; an audit finding (a host value the step changes, a
tensor it reassigns to a new shape).

On the CPU, ``GraphedEnv(env, capture=FakeGraphCapture())`` runs exactly the static-buffer code
path (the fake replay re-runs the step on the static buffers; tests/test_graphed_env.py).
"""

from __future__ import annotations

import dataclasses
import warnings

import torch

from gpusim.cuda_graph import CudaGraphCapture, GraphEngine, graph_decision
from gpusim.env import DriveEnv, StepResult

_FIELDS = tuple(f.name for f in dataclasses.fields(StepResult) if f.name != "info")


def _warn(msg: str) -> None:
    warnings.warn(msg, RuntimeWarning, stacklevel=5)


class GraphedEnv:
    """:class:`~gpusim.env.DriveEnv` whose steady-state steps replay a CUDA graph (module docstring).

    Args:
        env: the :class:`~gpusim.env.DriveEnv` to drive (its state, clock and buffers are used in
            place: ``env.state`` is the static state between replayed steps).
        capture: capture backend (default :class:`gpusim.cuda_graph.CudaGraphCapture` on the env's
            device with the env's generator registered, when
            :func:`gpusim.cuda_graph.graph_decision` allows a graph; else eager).
            :class:`gpusim.cuda_graph.FakeGraphCapture` drives the same code path on the CPU.
        warmup: eager warm-up steps of the static step before each capture (>= 1).
        say: where the one fallback warning goes (default ``warnings.warn``, RuntimeWarning).

    Attributes:
        env: the wrapped env. engine: its :class:`gpusim.cuda_graph.GraphEngine`.
        fallback_reason: why every step runs eagerly now (None while graphs are used). stats:
        ``captures``, ``replays``, ``warm_steps``, ``eager_steps`` (steps completed; one that
        raised is not counted). captured (property): a graph is held for the current pack.
        Other attributes (``num_worlds``, ``metrics``, ``check_errors``, ``horizon``, ...) are
        read from the env.

    Raises:
        TypeError: ``env`` is not a DriveEnv. ValueError: ``warmup < 1``; a bad
        ``GPUSIM_CUDA_GRAPHS`` value.
    """

    def __init__(self, env: DriveEnv, capture=None, warmup: int = 2, say=None):
        if not isinstance(env, DriveEnv):
            raise TypeError(f"GraphedEnv wraps a gpusim.env.DriveEnv, got {type(env).__name__}")
        if warmup < 1:
            raise ValueError(f"GraphedEnv: warmup must be >= 1, got {warmup}")
        self.env = env
        self._actions = None  # static input buffer (the caller's shape and dtype)
        self._res = None      # name -> static result buffer ("info.<key>" for info entries)
        self._other_actions = False  # this step's actions differ in shape/dtype/device from the graph's
        reason = None
        if capture is None:
            enabled, reason = graph_decision("on", env.device, env.step_backend)
            if enabled:  # pragma: no cover  (needs a CUDA device)
                capture = CudaGraphCapture(env.device, (env.generator,))
        if reason is None and env.check_actions == "sync":
            reason = ("EnvConfig.check_actions resolves to 'sync', whose per-step host read cannot be captured "
                      "(use check_actions='async', CUDA's 'auto')")
        elif reason is None and env.config.has_coplayers:
            reason = "co-players (EnvConfig.ego_slots / ego_fraction) are not captured"
        self.engine = GraphEngine(env, self._body, lambda: {"env": self.env}, capture, warmup, say or _warn,
                                  "GraphedEnv steps eagerly", fallback=reason)

    def __getattr__(self, name):
        if name in ("env", "engine"):  # not set yet (during __init__): no recursion
            raise AttributeError(name)
        return getattr(self.env, name)

    @property
    def captured(self) -> bool:
        """True while a captured graph is held (replayed by the next steady step)."""
        return self.engine.captured

    @property
    def fallback_reason(self) -> str | None:
        """Why every step runs eagerly now (None while graphs are used)."""
        return self.engine.fallback_reason

    @property
    def capture(self):
        """The capture backend (None when eager from the start)."""
        return self.engine.capture

    @property
    def stats(self) -> dict:
        """``captures``, ``replays``, ``warm_steps``, ``eager_steps`` (the engine's counters)."""
        return self.engine.stats

    # ------------------------------------------------------------------ public
    def reset(self, seed: int | None = None, scenarios: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`DriveEnv.reset` (same arguments, errors and return: obs [W, C, D] float32, the env's
        observation buffer). The new state is copied into the static buffers at the next replay."""
        return self.env.reset(seed=seed, scenarios=scenarios)

    def step(self, actions: torch.Tensor) -> StepResult:
        """:meth:`DriveEnv.step`: same arguments, same values, same errors (wrong type, shape, dtype
        or device: ``ValueError`` at once; a bad value under the asynchronous check: recorded and
        raised at ``env.check_errors()`` / ``env.metrics()``).

        Returns:
            :class:`~gpusim.env.StepResult`; after a replayed step its tensors are static buffers
            overwritten by the next step (aliasing contract, module docstring).
        """
        env, engine = self.env, self.engine
        self._other_actions = False
        if engine.fallback_reason is None and env.stage_hook is not None:
            engine.fallback("a stage hook is set on the env (env.stage_hook runs Python around every stage)")
        if env.episode_step + 1 < env.horizon and self._graph_step(actions):
            return self._result()
        res = env.step(actions)
        engine.stats["eager_steps"] += 1
        if self._other_actions:  # valid actions of another dtype: warm up and capture again for them
            self._other_actions = False
            engine.drop()
        return res

    # ------------------------------------------------------------------ the graphed step
    def _graph_step(self, actions) -> bool:
        """One steady step through the engine (warm-up, capture or replay). False when the step is
        to run eagerly (fallback, actions unlike the captured ones, a capture that failed)."""
        engine = self.engine
        if engine.fallback_reason is not None or not isinstance(actions, torch.Tensor):
            return False  # (env.step raises the clear error for a non-tensor)
        sig = (tuple(actions.shape), actions.dtype, actions.device)
        key = engine.key(sig)
        if engine.captured and key != engine.graph_key and key[0] == engine.graph_key[0]:
            # actions unlike the captured ones: this step eagerly (it raises on bad ones and keeps
            # the graph; after valid ones the next steps capture again)
            self._other_actions = True
            return False
        if self._actions is None or (tuple(self._actions.shape), self._actions.dtype, self._actions.device) != sig:
            self._actions = torch.empty_like(actions)
        return engine.step(sig, [(self._actions, actions)])

    def _body(self) -> None:
        """The captured step: reads and writes static buffers only (module docstring)."""
        env, engine = self.env, self.engine
        new_state, res = env.advance(engine.state, env.validate_actions(self._actions), episode_end=False)
        leaves = {name: getattr(res, name) for name in _FIELDS}
        leaves.update({f"info.{k}": v for k, v in res.info.items()})
        if self._res is None:  # first warm-up (eager): allocate; the observation buffer is already static
            self._res = {k: v if v is env.sim.obs_buf else torch.empty_like(v) for k, v in leaves.items()}
        elif leaves.keys() != self._res.keys():
            raise RuntimeError(f"GraphedEnv: the step's results changed from {sorted(self._res)} to {sorted(leaves)}")
        dst, src = [], []
        for k, x in leaves.items():
            if x is not self._res[k]:
                dst.append(self._res[k])
                src.append(x)
        engine.finish(new_state, dst, src)

    def _result(self) -> StepResult:
        r = self._res
        info = {k[5:]: v for k, v in r.items() if k.startswith("info.")}
        return StepResult(**{name: r[name] for name in _FIELDS}, info=info)
