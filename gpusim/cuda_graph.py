"""The CUDA-graph engine: one steady-state env step (plus, for the trainer, the policy's act)
replayed from a captured ``torch.cuda.CUDAGraph``.

On a GPU a rollout step is launch-bound (~100 small kernels per env step; docs/performance.md):
replaying a captured graph issues them all with one launch. :class:`GraphEngine` is the one piece
that does it, for two thin clients: :class:`gpusim.graphed_env.GraphedEnv` (the env step alone,
for a loop of your own) and the trainer's :class:`train.graphed_rollout.GraphedRollout` (policy
act + env step + rollout-buffer writes). The engine owns

* the warm-up (``warmup`` eager calls of the client's static step, on a side stream as a capture
  requires: lazy initialisation, Triton compilation, allocator warm-up), the last one run under
  :func:`host_syncs` on CUDA so a host sync is named before a capture would fail on it;
* the audit of rebinding (:class:`PinnedAttributes`): a tensor attribute the step reassigns is
  pinned to a static tensor, anything a replay could not reproduce turns into a fallback reason;
* the static buffers of the env: :attr:`GraphEngine.state` is ``env.state`` between replayed steps,
  the episode's start state (trial restarts) is kept static too, and what eager work replaced is
  copied back in before the next replay;
* the capture (:meth:`PinnedAttributes.capture_and_replay`), keyed on the scenario pack's tensors
  (:func:`pack_key`) and on the client's own key: a new key warms up and captures again;
* the replay, and the host side of a step (:meth:`gpusim.env.DriveEnv.commit`: clock + state);
* the fallback: one line naming the reason (``fallback_reason``), after which the client steps
  eagerly for good.

The captured step must be capturable: no host sync (``.item()``, ``bool()``, ``nonzero``, ...), no
tensors built from Python data, no data-dependent shapes or Python branches on tensor values, and
state carried between calls in tensors updated in place (a replay runs no Python).
:func:`cuda_graphs_enabled` / :func:`graph_decision` say whether graphs are used at all (on where
CUDA exists, unless ``GPUSIM_CUDA_GRAPHS=0``). :class:`CudaGraphCapture` captures on a GPU;
:class:`FakeGraphCapture` drives the same static-buffer code path on the CPU (tests).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch

from gpusim.backend import GPU_BACKENDS

ENV_FLAG = "GPUSIM_CUDA_GRAPHS"


def cuda_graphs_enabled(device: torch.device | str | None = None) -> bool:
    """Default for the CUDA-graph flag: True when ``device`` (default: the current default device
    type, i.e. CUDA if available) is a CUDA device and ``GPUSIM_CUDA_GRAPHS`` is not ``0``/``false``/``off``.

    Raises:
        ValueError: ``GPUSIM_CUDA_GRAPHS`` holds something other than 0/1/true/false/on/off.
    """
    flag = os.environ.get(ENV_FLAG, "").strip().lower()
    if flag not in ("", "0", "1", "true", "false", "on", "off"):
        raise ValueError(f"{ENV_FLAG}={flag!r}: expected 0 or 1")
    if flag in ("0", "false", "off"):
        return False
    if device is None:
        return torch.cuda.is_available()
    return torch.device(device).type == "cuda" and torch.cuda.is_available()


def capture_graph(graph, fn: Callable[[], Any], device, generators=()) -> None:  # pragma: no cover  (CUDA)
    """Record one call of ``fn()`` into ``graph`` (a ``torch.cuda.CUDAGraph``) on ``device``.

    ``generators`` (CUDA generators) must already be registered with ``graph``. A
    capture that fails (a host sync invalidates it, say) is ended inside torch before the
    generators leave capture mode, after which every eager draw from them raises "Offset increment
    outside graph capture encountered unexpectedly" (seen on an H100 with torch 2.11: the trainer's
    eager fallback died at its first ``torch.rand_like``). So the states of the device's default
    generator and of ``generators`` are cloned first (``Generator.clone_state``) and put back
    (``graphsafe_set_state``) when the capture raises; the error is re-raised.

    Raises:
        whatever the capture raised (RuntimeError from torch for a non-capturable ``fn``).
    """
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    gens = (torch.cuda.default_generators[index],) + tuple(generators)
    saved = [g.clone_state() for g in gens]
    try:
        with torch.cuda.graph(graph):
            fn()
    except BaseException:
        for g, state in zip(gens, saved):
            g.graphsafe_set_state(state)
        raise


def host_syncs(call: Callable[[], Any]) -> list[str]:  # pragma: no cover  (needs a CUDA device)
    """Run ``call()`` with ``torch.cuda.set_sync_debug_mode("warn")`` and return where it synchronised
    with the host: for each synchronising op (``.item()``, a blocking copy, ``nonzero``, ...) the
    innermost frame of the project's code (``gpusim``, ``train``, ``policy``, ``profiling``) on
    the Python stack at that moment, as ``"path:line"`` relative to the repository (with the
    library frame that issued it after ``via`` when that is not the project's), in order,
    deduplicated. Such an op invalidates a CUDA-graph capture (torch then reports only
    ``cudaErrorStreamCaptureInvalidated``, not where), so the CUDA-graph rollout runs its last
    warm-up step through this and names the place in its fallback reason. The call runs to the
    end (warnings, not errors); the previous debug mode and warning settings are restored.
    """
    import pathlib
    import traceback
    import warnings

    root = str(pathlib.Path(__file__).resolve().parents[1]) + "/"
    ours = tuple(root + d + "/" for d in ("gpusim", "train", "policy", "profiling"))
    where: list[str] = []

    def record(message, category, filename, lineno, file=None, line=None):
        if "called a synchronizing cuda operation" not in str(message).lower():
            return  # torch's sync-debug warning (c10 warn_or_error_on_sync); not other warnings
        stack = [f for f in traceback.extract_stack() if not f.filename.endswith("warnings.py")]
        mine = [f for f in stack if f.filename.startswith(ours) and f.filename != __file__]
        loc = f"{mine[-1].filename[len(root):]}:{mine[-1].lineno}" if mine else f"{filename}:{lineno}"
        if mine and not filename.startswith(ours):
            loc += f" via {pathlib.Path(filename).name}:{lineno}"
        if loc not in where:
            where.append(loc)

    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return where


# ---------------------------------------------------------------------------- capture backends
# ``warm(fn)`` runs a zero-argument step eagerly, ``capture(fn, roots)`` records it (``.replay()``).


class CudaGraphCapture:
    """Capture backend on a CUDA device (``torch.cuda.CUDAGraph``).

    Args:
        device: the CUDA device of the captured work.
        generators: non-default CUDA generators the step draws from (e.g. the env's seeded
            generator): each is registered with every captured graph
            (``CUDAGraph.register_generator_state``), so a replay advances its Philox offset like
            an eager call would; the default CUDA generator (``torch.rand_like`` in action
            sampling) is registered by ``torch.cuda.graph`` itself. Without registration a draw
            from a user generator during capture raises, and the caller falls back to eager.

    Methods:
        ``warm(fn)``: run ``fn()`` on a side stream (lazy initialisation, Triton compilation and
        allocator warm-up must happen before a capture). ``capture(fn)``: record one call of
        ``fn()`` (the work is *not* run) and return the ``CUDAGraph`` (``.replay()``); ``roots`` is
        for :class:`FakeGraphCapture` and ignored here.

    Raises:
        RuntimeError (from torch): a non-capturable step (host sync, unregistered generator, ...);
        the caller turns it into an eager fallback. The default and registered generators are
        left as they were before the failed capture, so eager draws go on working.
    """

    name = "cuda"

    def __init__(self, device, generators=()):  # pragma: no cover  (needs a CUDA device)
        self.device = torch.device(device)
        self.generators = tuple(g for g in generators if g is not None and g.device.type == "cuda")
        self._stream = None

    def warm(self, fn: Callable[[], Any]) -> None:  # pragma: no cover  (needs a CUDA device)
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)
        current = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream):
            fn()
        current.wait_stream(self._stream)

    def capture(self, fn: Callable[[], Any], roots=None):  # pragma: no cover  (needs a CUDA device)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(self.device):  # as torch's own cudagraph trees register generators
            for g in self.generators:
                register = getattr(graph, "register_generator_state", None)
                if register is None:
                    raise RuntimeError("this torch cannot register a user CUDA generator with a graph "
                                       "(CUDAGraph.register_generator_state is missing)")
                register(g)
        capture_graph(graph, fn, self.device, self.generators)
        return graph


class _FakeGraph:
    def __init__(self, fn, owner, roots):
        self.fn, self.owner, self.roots = fn, owner, roots

    def replay(self) -> None:
        self.owner.replays += 1
        before = reachable_values(self.roots) if self.roots else {}
        self.fn()
        for container, k, v in before.values():  # a replay runs no Python: undo what fn rebound
            if _get(container, k) is not v:
                _set(container, k, v)


class FakeGraphCapture:
    """CPU stand-in for :class:`CudaGraphCapture` (tests, launch counts): ``warm(fn)`` calls
    ``fn()``; ``capture(fn, roots)`` records ``fn`` without running it (as a real capture records
    work without running it); ``replay()`` re-runs ``fn()``, which reads and writes only the
    static buffers the caller set up, so the code path is the graphed one. A real replay runs no
    Python, so it rebinds no attribute: after each fake replay, every tensor and host value
    reachable from ``roots`` (:func:`reachable_values`) that ``fn`` rebound is put back to the
    object it had before the call (the new values are lost, as on a GPU; a step that carries state
    by rebinding attributes fails the same way here).

    Attributes: ``captures``, ``replays`` (counts).
    """

    name = "fake"

    def __init__(self):
        self.captures = 0
        self.replays = 0

    def warm(self, fn: Callable[[], Any]) -> None:
        fn()

    def capture(self, fn: Callable[[], Any], roots=None) -> _FakeGraph:
        self.captures += 1
        return _FakeGraph(fn, self, roots)


_HOST_TYPES = (int, float, bool, str)


def reachable_values(roots: dict, depth: int = 4) -> dict[str, tuple]:
    """``path -> (container, key, value)`` for every tensor and host value (int, float, bool, str,
    None) reachable from ``roots`` (``{name: object}``) through attributes and dicts of the
    project's own objects (modules ``gpusim``, ``train``, ``policy``), at most ``depth`` levels
    down; not through ``nn.Module`` (parameters are updated in place), ``gpusim.data`` objects
    (scenario packs and pools: swaps are handled by the caller) or other libraries' objects.
    Used to audit what a step rebinds (train/graphed_rollout.py) and by :class:`FakeGraphCapture`.
    """
    out: dict[str, tuple] = {}
    seen: set[int] = set()

    def ours(v) -> bool:
        mod = type(v).__module__ or ""
        return (mod.split(".")[0] in ("gpusim", "train", "policy") and not mod.startswith("gpusim.data")
                and not isinstance(v, torch.nn.Module))

    def visit(obj, path: str, level: int) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        items = obj.items() if isinstance(obj, dict) else getattr(obj, "__dict__", {}).items()
        for k, v in list(items):
            p = f"{path}.{k}"
            if isinstance(v, torch.Tensor) or v is None or isinstance(v, _HOST_TYPES):
                out[p] = (obj, k, v)
            elif level < depth and (isinstance(v, dict) or ours(v)):
                visit(v, p, level + 1)

    for name, root in roots.items():
        if root is not None:
            visit(root, name, 0)
    return out


def graph_decision(mode: str, device, backend: str) -> tuple[bool, str | None]:
    """Whether to capture the rollout step in a CUDA graph (``TrainConfig.cuda_graph``).

    Args:
        mode: ``"auto"`` (on when ``device`` is CUDA, the env runs a GPU kernel backend,
            ``gpusim.backend.GPU_BACKENDS``: Triton or CuPy, and ``GPUSIM_CUDA_GRAPHS`` is not 0),
            ``"on"`` (wanted: the reason says why it cannot be used), ``"off"``.
        device: the env's device. backend: the env's step backend (``DriveEnv.step_backend``).

    Returns:
        ``(enabled, reason)``: ``reason`` says why it is off (None when enabled). With ``"on"``
        the caller warns with the reason; ``"auto"`` and ``"off"`` are silent.

    Raises:
        ValueError: an unknown ``mode`` or a bad ``GPUSIM_CUDA_GRAPHS`` value.
    """
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"cuda_graph must be 'auto', 'on' or 'off', got {mode!r}")
    if mode == "off":
        return False, "cuda_graph='off'"
    device = torch.device(device)
    if not cuda_graphs_enabled(device):
        if os.environ.get(ENV_FLAG, "").strip().lower() in ("0", "false", "off"):
            return False, f"{ENV_FLAG}=0"
        return False, f"needs a CUDA device (the env runs on {device.type})"
    if mode == "auto" and backend not in GPU_BACKENDS:
        return False, f"the env runs the {backend} backend (auto captures {' and '.join(GPU_BACKENDS)} only)"
    return True, None


# ---------------------------------------------------------------------------- static buffers


def copy_all(dst: list, src: list) -> None:
    """``d.copy_(s)`` for each pair of tensors, in one ``torch._foreach_copy_`` (one launch on a
    GPU); a source that shares memory with a destination is cloned first (the copies would
    otherwise read overwritten values). Graph-safe: no host read. Empty lists do nothing.

    Raises:
        RuntimeError (from torch): a pair whose shapes do not broadcast.
    """
    if not dst:
        return
    ptrs = {d.untyped_storage().data_ptr() for d in dst}
    src = [s.clone() if s.untyped_storage().data_ptr() in ptrs else s for s in src]
    torch._foreach_copy_(dst, src)


def pack_key(pack) -> tuple:
    """Key of the scenario pack a captured step reads: ``(num_scenarios, (field, data_ptr, shape,
    dtype), ...)`` over the pack's tensor attributes. A graph replays fixed addresses, so a step
    captured on one pack must be captured again when this key changes (``DriveEnv.use_pack``, a
    streaming pool swap)."""
    fields = vars(pack) if hasattr(pack, "__dict__") else {}
    return (pack.num_scenarios,) + tuple(
        (k, v.data_ptr(), tuple(v.shape), v.dtype) for k, v in sorted(fields.items()) if isinstance(v, torch.Tensor))


def _get(container, k):
    return container[k] if isinstance(container, dict) else getattr(container, k)


def _set(container, k, v) -> None:
    container.__setitem__(k, v) if isinstance(container, dict) else setattr(container, k, v)


class PinnedAttributes:
    """Tensor attributes that a captured step *reassigns* (e.g. the observation stage's
    ``obs_written``, the async action check's error record), pinned to static tensors.

    A replay runs no Python, so an attribute the step rebinds to a new tensor would keep pointing
    at the old one. :meth:`audit` runs the step on a warm-up call and compares every tensor and host
    value reachable from ``roots`` (:func:`reachable_values`) before and after: a tensor attribute
    reassigned with the same shape, dtype and device is pinned (the object it held after the call
    becomes its static tensor); anything a replay could not reproduce is returned as a reason.
    Inside the captured step, :meth:`restore` copies each new value into its static tensor and
    rebinds the attribute to it; outside the graph, :meth:`sync_inputs` does the same for values
    reassigned by eager work (an eager episode-end step).

    Attributes: ``pins``: ``path -> (container, key, static tensor)``; ``path in pinned`` and
    iteration give the pinned paths (e.g. ``"env.sim.obs_written"``).
    """

    def __init__(self):
        self.pins: dict[str, tuple] = {}

    def __contains__(self, path: str) -> bool:
        return path in self.pins

    def __iter__(self):
        return iter(self.pins)

    def __len__(self) -> int:
        return len(self.pins)

    def capture_and_replay(self, backend, body: Callable[[], Any], roots: dict, device) -> tuple:
        """Capture ``body`` with ``backend`` (:class:`CudaGraphCapture` / :class:`FakeGraphCapture`)
        under :meth:`audit`, then replay it once, audited too: a capture records the step, it does
        not run it. Returns ``(graph, reason)``:

        * ``(None, reason)``: the capture raised (CUDA synchronised afterwards) or its audit found
          something; nothing ran, the caller runs the step eagerly;
        * ``(graph, None)``: captured, and this step ran through the replay;
        * ``(graph, reason)``: captured and ran, but the replay's audit found something a later
          replay could not reproduce (the caller stops replaying).
        """
        box: list = []
        try:
            problem = self.audit(lambda: box.append(backend.capture(body, roots)), roots, capturing=True)
        except Exception as e:  # capture is best effort: say why
            if torch.device(device).type == "cuda":  # pragma: no cover  (needs a CUDA device)
                torch.cuda.synchronize(device)
            return None, f"capture failed: {type(e).__name__}: {e}"
        if problem:
            return None, problem
        return box[0], self.audit(box[0].replay, roots, capturing=False)

    def audit(self, call: Callable[[], Any], roots: dict, capturing: bool) -> str | None:
        """Run ``call()`` and compare what is reachable from ``roots`` before and after.

        Pins tensors reassigned with the same shape, dtype and device (not while ``capturing``:
        too late, the capture has recorded the old addresses). Returns a one-line reason for
        anything a replay could not reproduce (a host value changed, a tensor reassigned to a new
        shape or during the capture, a tensor created during the capture), else None. Whatever
        ``call`` raises propagates."""
        before = reachable_values(roots)
        call()
        after = reachable_values(roots)
        for path, (container, k, new) in after.items():
            old = before.get(path, (None, None, None))[2]
            if new is old or path in self.pins:
                continue
            if isinstance(new, torch.Tensor) and isinstance(old, torch.Tensor):
                same = new.shape == old.shape and new.dtype == old.dtype and new.device == old.device
                if same and not capturing:
                    self.pins[path] = (container, k, new)
                    continue
                why = "during the capture" if capturing else f"to a new shape {tuple(new.shape)}"
                return f"the step reassigns {path} {why}: a replay would not update it"
            if isinstance(new, torch.Tensor) and old is None:
                if capturing:
                    return f"the step creates {path} during the capture"
                continue  # lazily created on the first call; audited again on the next
            if isinstance(old, _HOST_TYPES + (type(None),)) and old != new:
                return f"the step changes the host value {path} ({old!r} -> {new!r}): a replay runs no Python"
        return None

    def sync_inputs(self, dst: list, src: list) -> None:
        """Outside the graph: for each pinned attribute that eager work rebound, append
        ``(static, current)`` to ``dst`` / ``src`` (for :func:`copy_all`) and rebind it to its static
        tensor."""
        for container, k, static in self.pins.values():
            cur = _get(container, k)
            if cur is not static:
                dst.append(static)
                src.append(cur)
                _set(container, k, static)

    def restore(self) -> None:
        """Inside the captured step, at its end: copy each rebound attribute's new value into its
        static tensor and rebind the attribute to it."""
        for container, k, static in self.pins.values():
            cur = _get(container, k)
            if cur is not static:
                static.copy_(cur)
                _set(container, k, static)


# ---------------------------------------------------------------------------- the engine
class GraphEngine:
    """Warm-up, audit, static buffers, capture, replay and fallback of one steady-state env step
    (module docstring); :class:`gpusim.graphed_env.GraphedEnv` and
    :class:`train.graphed_rollout.GraphedRollout` are its clients.

    The client writes the *body*: a zero-argument step that reads and writes static buffers only
    (:attr:`state`, its own input and output buffers), runs ``env.advance(engine.state, ...,
    episode_end=False)`` and ends with :meth:`finish`. Per steady step (``env.episode_step + 1 <
    env.horizon``, no stage hook) the client calls :meth:`step`; where it returns False it runs the
    step eagerly itself (``env.step``).

    Args:
        env: the :class:`gpusim.env.DriveEnv` stepped (its ``state`` is :attr:`state` between
            replayed steps). body: the client's step.
        roots: ``roots() -> {name: object}``, what the audit watches (the env and the client's
            objects: KV cache, rollout buffer, ...).
        capture: :class:`CudaGraphCapture` / :class:`FakeGraphCapture`; None only together with a
            ``fallback`` reason.
        warmup: eager warm-up calls before each capture (>= 1).
        say: where the one fallback line goes. eager_note: the end of that line (what happens
            instead, e.g. ``"the rollout runs eagerly"``).
        fallback: a reason known at construction (no CUDA, co-players, ...): never capture.

    Attributes:
        fallback_reason: why the client steps eagerly (None while graphs are used).
        stats: ``captures``, ``replays``, ``warm_steps``; ``eager_steps`` is the client's to count.
        state: the static :class:`~gpusim.state.EnvState` (None before the first graphed step).
        graph_key: the :meth:`key` of the graph held or being warmed up (None: none yet).
        captured (property): a graph is held for ``graph_key``.

    Raises:
        ValueError: ``warmup < 1``; ``capture`` None without a ``fallback`` reason.
    """

    def __init__(self, env, body: Callable[[], None], roots: Callable[[], dict], capture, warmup: int = 2,
                 say: Callable[[str], None] = print, eager_note: str = "eager steps",
                 fallback: str | None = None):
        if int(warmup) < 1:
            raise ValueError(f"warmup must be >= 1, got {warmup}")
        if capture is None and fallback is None:
            raise ValueError("GraphEngine: a capture backend is needed (or a fallback reason)")
        self.env, self.body, self.roots, self.capture = env, body, roots, capture
        self.warmup, self.say, self.eager_note = int(warmup), say, eager_note
        self.fallback_reason: str | None = None
        self.stats = {"captures": 0, "replays": 0, "warm_steps": 0, "eager_steps": 0}
        self.state = None   # static EnvState (built at the first graphed step)
        self._start = None  # static copy of the episode's start state (trial restarts restore it)
        self.pins = PinnedAttributes()
        self._graph = self.graph_key = self._pack = self._pack_key = None
        self._warm = 0
        if fallback is not None:
            self.fallback(fallback)

    @property
    def captured(self) -> bool:
        """True while a captured graph is held (replayed by the next steady step)."""
        return self._graph is not None

    def key(self, client_key) -> tuple:
        """The graph's key for the client's ``client_key``: ``(pack key, client_key)`` (the pack
        key is recomputed only when the env's pack object changes)."""
        pack = self.env.pack
        if pack is not self._pack:
            self._pack_key, self._pack = pack_key(pack), pack
        return self._pack_key, client_key

    def drop(self) -> None:
        """Forget the graph and the key: the next step warms up and captures again."""
        self._graph, self.graph_key, self._warm = None, None, 0

    def fallback(self, reason: str) -> None:
        """Step eagerly for good from now on; says ``reason`` once."""
        self.fallback_reason = reason
        self._graph = None
        self.say(f"CUDA graph off: {reason}; {self.eager_note}")

    # ------------------------------------------------------------------ one step
    def step(self, key, inputs=()) -> bool:
        """One steady step through the graph: copy ``inputs`` (``(static, value)`` pairs; nothing where
        ``value`` is ``static``) and whatever eager work replaced into the static buffers, then
        replay, warm up or capture, then commit the step on the env (:meth:`gpusim.env.DriveEnv.commit`). Returns False when nothing ran
        (fallback, failed capture): the client runs this step eagerly."""
        if self.fallback_reason is not None:
            return False
        key = self.key(key)
        if key != self.graph_key:
            self._graph, self.graph_key, self._warm = None, key, 0
        self._sync_inputs(inputs)
        if self._graph is not None:
            self._graph.replay()
            self.stats["replays"] += 1
        elif self._warm < self.warmup:
            self._warm_step()
        elif not self._capture_step():
            return False
        self.env.commit(self.state)
        return True

    def finish(self, new_state, dst: list, src: list) -> None:
        """The end of the client's body: copy ``new_state``'s fields that are not the static ones,
        with the client's own ``dst`` / ``src`` pairs, in one :func:`copy_all`; put back the pinned
        attributes (:meth:`PinnedAttributes.restore`)."""
        for name, s in self.state.tensors().items():
            x = getattr(new_state, name)
            if x is not s:
                dst.append(s)
                src.append(x)
        copy_all(dst, src)
        self.pins.restore()

    def _warm_step(self) -> None:
        syncs: list[str] = []
        if self.capture.name == "cuda" and self._warm == self.warmup - 1:  # pragma: no cover  (CUDA)
            # the last warm-up step (lazy one-time set-up is done by then): name the host syncs a
            # capture would fail on
            warm = lambda: syncs.extend(host_syncs(lambda: self.capture.warm(self.body)))  # noqa: E731
        else:
            warm = lambda: self.capture.warm(self.body)  # noqa: E731
        problem = self.pins.audit(warm, self.roots(), capturing=False)
        if not problem and syncs:
            problem = f"the step synchronises with the host at {', '.join(syncs[:3])}"
        self._warm += 1
        self.stats["warm_steps"] += 1
        if problem:  # this step ran (eagerly, correctly); later ones cannot be graphed
            self.fallback(problem)

    def _capture_step(self) -> bool:
        graph, problem = self.pins.capture_and_replay(self.capture, self.body, self.roots(), self.env.device)
        if graph is None:  # nothing ran: the client steps eagerly
            self.fallback(problem)
            return False
        self._graph = graph
        self.stats["captures"] += 1
        self.stats["replays"] += 1
        if problem:
            self.fallback(problem)
        return True

    def _sync_inputs(self, inputs) -> None:
        """Outside the graph: copy into the static buffers what is not already there (the client's
        inputs; the state and start state after an eager step or a reset: the first call clones
        them and makes the clones the env's own; pinned attributes reassigned eagerly)."""
        env = self.env
        dst = [s for s, x in inputs if x is not s]
        src = [x for s, x in inputs if x is not s]
        if self.state is None:
            self.state = env.state = env.state.clone()
        start = env.sim.start
        if start is not None and self._start is None:
            self._start = env.sim.start = start.clone()
        for static, cur in ((self.state, env.state), (self._start, env.sim.start)):
            if cur is not None and cur is not static:
                for name, s in static.tensors().items():
                    x = getattr(cur, name)
                    if x is not s:
                        dst.append(s)
                        src.append(x)
        if env.sim.start is not None:
            env.sim.start = self._start
        self.pins.sync_inputs(dst, src)
        copy_all(dst, src)
        env.state = self.state
