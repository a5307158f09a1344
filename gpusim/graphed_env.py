"""A CUDA-graph-replayed :meth:`DriveEnv.step <gpusim.env.DriveEnv.step>` for your own loop.

On a GPU an env step is host-bound below a few thousand worlds: about 100 small kernels launched
from Python (docs/gpu.md, docs/performance.md). The trainer replays its whole rollout step from a
CUDA graph (train/graphed_rollout.py); :class:`GraphedEnv` does the same for the env step alone,
so a hand-written loop gets it too::

    from gpusim.graphed_env import GraphedEnv

    genv = GraphedEnv(env)           # env: a gpusim.env.DriveEnv on CUDA
    obs = genv.reset()               # env.reset()
    res = genv.step(actions)         # the StepResult of env.step(actions), values equal

How a step is replayed (the pieces are those of the trainer's graphed rollout, module docstring
of train/graphed_rollout.py, from :mod:`gpusim.cuda_graph`):

* A step that does not end the episode (``env.episode_step + 1 < env.horizon``) replays one
  captured graph of: the asynchronous action check (:meth:`DriveEnv.validate_actions`),
  :meth:`DriveEnv.advance` with ``episode_end=False``, the copy of the new state's fields into
  static state buffers (``env.state`` *is* that static state between steps) and of the
  :class:`~gpusim.env.StepResult` tensors into static result buffers. The actions are copied into
  a static input buffer first. The host clock ``env.sim.t`` is advanced outside the graph, as
  :meth:`DriveEnv.step` does.
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

from gpusim.backend import backend_for
from gpusim.cuda_graph import (CudaGraphCapture, PinnedAttributes, adopt_static_state, copy_all, graph_decision,
                               host_syncs, pack_key)
from gpusim.env import DriveEnv, StepResult

_FIELDS = tuple(f.name for f in dataclasses.fields(StepResult) if f.name != "info")


def _warn(msg: str) -> None:
    warnings.warn(msg, RuntimeWarning, stacklevel=4)


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
        env: the wrapped env. fallback_reason: why every step runs eagerly now (None while
        graphs are used). stats: ``captures``, ``replays``, ``warm_steps``, ``eager_steps`` (steps
        completed; one that raised is not counted).
        captured (property): a graph is held for the current pack.
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
        self.env, self.warmup = env, int(warmup)
        self._say = say or _warn
        self.fallback_reason: str | None = None
        self.stats = {"captures": 0, "replays": 0, "warm_steps": 0, "eager_steps": 0}
        self._state = None    # EnvState of static buffers (built at the first graphed step)
        self._start = None    # static copy of env.sim.start (trial restore reads it)
        self._actions = None  # static input buffer (the caller's shape and dtype)
        self._res = None      # name -> static result buffer ("info.<key>" for info entries)
        self._pins = PinnedAttributes()
        self._graph = self._key = self._pack = self._pack_key = None
        self._warm = 0
        self._other_actions = False  # this step's actions differ in shape/dtype/device from the graph's
        self.capture = capture
        if capture is None:
            enabled, reason = graph_decision("on", env.device, backend_for(env.state.pos))
            if enabled:  # pragma: no cover  (needs a CUDA device)
                self.capture = CudaGraphCapture(env.device, (env.generator,))
            else:
                self._fallback(reason)
                return
        if env.check_actions == "sync":
            self._fallback("EnvConfig.check_actions resolves to 'sync', whose per-step host read cannot be "
                           "captured (use check_actions='async', CUDA's 'auto')")
        elif env.config.has_coplayers:
            self._fallback("co-players (EnvConfig.ego_slots / ego_fraction) are not captured")

    def __getattr__(self, name):
        if name == "env":  # not set yet (during __init__): no recursion
            raise AttributeError(name)
        return getattr(self.env, name)

    @property
    def captured(self) -> bool:
        """True while a captured graph is held (replayed by the next steady step)."""
        return self._graph is not None

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
        env = self.env
        self._other_actions = False
        if self.fallback_reason is None and env.stage_hook is not None:
            self._fallback("a stage hook is set on the env (env.stage_hook runs Python around every stage)")
        if self.fallback_reason is None and env.sim.t + 1 < env.horizon and self._graph_step(actions):
            env.sim.t += 1
            env.state = self._state
            return self._result()
        res = env.step(actions)
        self.stats["eager_steps"] += 1
        if self._other_actions:  # valid actions of another dtype: warm up and capture again for them
            self._other_actions = False
            self._graph, self._key, self._warm = None, None, 0
        return res

    # ------------------------------------------------------------------ the graphed step
    def _graph_step(self, actions) -> bool:
        """One steady step through the graph (warm-up, capture or replay). False when the step is
        to run eagerly (actions unlike the captured ones, a capture that failed)."""
        if not isinstance(actions, torch.Tensor):
            return False  # env.step raises the clear error
        sig = (tuple(actions.shape), actions.dtype, actions.device)
        key = (self._pack_id(), sig)
        if key != self._key:
            if self._graph is not None and key[0] == self._key[0]:
                # actions unlike the captured ones: this step eagerly (it raises on bad ones and
                # keeps the graph; after valid ones the next steps capture again)
                self._other_actions = True
                return False
            self._graph, self._key, self._warm = None, key, 0
            self._actions = torch.empty_like(actions)
        self._sync_inputs(actions)
        if self._graph is not None:
            self._graph.replay()
            self.stats["replays"] += 1
        elif self._warm < self.warmup:
            self._warm_step()
        else:
            return self._capture_step()
        return True

    def _warm_step(self) -> None:
        syncs: list[str] = []
        if self.capture.name == "cuda" and self._warm == self.warmup - 1:  # pragma: no cover  (CUDA)
            # the last warm-up step (lazy one-time set-up is done by then): name the host syncs
            # a capture would fail on
            warm = lambda: syncs.extend(host_syncs(lambda: self.capture.warm(self._body)))  # noqa: E731
        else:
            warm = lambda: self.capture.warm(self._body)  # noqa: E731
        problem = self._pins.audit(warm, self._roots(), capturing=False)
        if not problem and syncs:
            problem = f"the step synchronises with the host at {', '.join(syncs[:3])}"
        self._warm += 1
        self.stats["warm_steps"] += 1
        if problem:  # this step ran (eagerly, correctly); later ones cannot be graphed
            self._fallback(problem)

    def _capture_step(self) -> bool:
        graph, problem = self._pins.capture_and_replay(self.capture, self._body, self._roots(), self.env.device)
        if graph is None:  # nothing ran: the caller steps eagerly
            self._fallback(problem)
            return False
        self._graph = graph
        self.stats["captures"] += 1
        self.stats["replays"] += 1
        if problem:
            self._fallback(problem)
        return True

    def _body(self) -> None:
        """The captured step: reads and writes static buffers only (module docstring)."""
        env = self.env
        new_state, res = env.advance(self._state, env.validate_actions(self._actions), episode_end=False)
        leaves = {name: getattr(res, name) for name in _FIELDS}
        leaves.update({f"info.{k}": v for k, v in res.info.items()})
        if self._res is None:  # first warm-up (eager): allocate; the observation buffer is already static
            self._res = {k: v if v is env.sim.obs_buf else torch.empty_like(v) for k, v in leaves.items()}
        elif leaves.keys() != self._res.keys():
            raise RuntimeError(f"GraphedEnv: the step's results changed from {sorted(self._res)} to {sorted(leaves)}")
        dst, src = [], []
        for name, s in self._state.tensors().items():
            x = getattr(new_state, name)
            if x is not s:
                dst.append(s)
                src.append(x)
        for k, x in leaves.items():
            if x is not self._res[k]:
                dst.append(self._res[k])
                src.append(x)
        copy_all(dst, src)
        self._pins.restore()

    def _result(self) -> StepResult:
        r = self._res
        info = {k[5:]: v for k, v in r.items() if k.startswith("info.")}
        return StepResult(**{name: r[name] for name in _FIELDS}, info=info)

    # ------------------------------------------------------------------ static buffers
    def _sync_inputs(self, actions: torch.Tensor) -> None:
        """Outside the graph: copy into the static buffers what is not already there (the actions;
        the state and start state after an eager step or a reset; pinned attributes reassigned
        eagerly). Between replayed steps only the actions are copied."""
        env = self.env
        dst, src = [self._actions], [actions]
        self._state, self._start = adopt_static_state(env, self._state, self._start, dst, src)
        self._pins.sync_inputs(dst, src)
        copy_all(dst, src)
        env.state = self._state

    def _pack_id(self):
        """Key of the scenario pack the graph reads (recomputed when ``env.sim.pack`` changes)."""
        pack = self.env.sim.pack
        if pack is not self._pack:
            self._pack_key, self._pack = pack_key(pack), pack
        return self._pack_key

    def _roots(self) -> dict:
        return {"env": self.env}

    def _fallback(self, reason: str) -> None:
        self.fallback_reason = reason
        self._graph = None
        self._say(f"CUDA graph off: {reason}; GraphedEnv steps eagerly")
