"""Capture a steady-state step (e.g. env step + policy ``forward_eval``) in a CUDA graph.

On a GPU a rollout step is launch-bound (~100 small kernels per env step; docs/performance.md):
replaying a captured ``torch.cuda.CUDAGraph`` issues them all with one launch. :class:`GraphedStep`
wraps a callable with static input and output buffers:

* calls ``1 .. warmup`` run the callable eagerly (on a side stream, as capture requires: lazy
  initialisation, Triton compilation and allocator warm-up happen here);
* the next call copies its inputs into static buffers and captures one call of the callable;
* every later call copies the new inputs into the static buffers and replays the graph. The
  returned tensors are the *static output buffers*: they are overwritten by the next call (clone
  what must outlive it), exactly like the env's observation buffer.

The callable must be capturable: no host sync (``.item()``, ``bool()``, ``nonzero``, ...), no
tensors built from Python data, no data-dependent shapes or Python branches on tensor values, and
any state it carries between calls kept in tensors it updates in place (a graph replays fixed
addresses: reassigning ``self.state = new_tensor`` inside the callable is not replayed).
Outputs: a tensor, or a (nested) tuple / list / dict of tensors; other leaves are returned as they
were at capture time.

Eager fallback: with ``enabled=False``, on a non-CUDA device, or when capture raises (the error is
kept in :attr:`GraphedStep.fallback_reason`), every call runs the callable directly.
:func:`cuda_graphs_enabled` gives the default: on where CUDA exists, unless
``GPUSIM_CUDA_GRAPHS=0``.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch

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


def _flatten(obj, leaves: list):
    """Structure of ``obj`` with tensors replaced by their index in ``leaves``."""
    if isinstance(obj, torch.Tensor):
        leaves.append(obj)
        return ("T", len(leaves) - 1)
    if isinstance(obj, (tuple, list)):
        return (type(obj).__name__, [_flatten(x, leaves) for x in obj])
    if isinstance(obj, dict):
        return ("dict", {k: _flatten(v, leaves) for k, v in obj.items()})
    return ("C", obj)


def _unflatten(spec, leaves: list):
    kind, body = spec
    if kind == "T":
        return leaves[body]
    if kind in ("tuple", "list"):
        items = [_unflatten(x, leaves) for x in body]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        return {k: _unflatten(v, leaves) for k, v in body.items()}
    return body


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


class GraphedStep:
    """A callable of tensors, run eagerly or replayed from a CUDA graph (module docstring).

    Args:
        fn: the step; called as ``fn(*inputs)`` with tensors only.
        enabled: capture a CUDA graph (default :func:`cuda_graphs_enabled` of the first input's
            device). Ignored (eager) when the inputs are not CUDA tensors.
        warmup: eager calls before the capture (>= 1; 3 is what PyTorch's documentation uses).

    Attributes:
        captured: True once a graph is captured and replayed on every call.
        fallback_reason: why the calls run eagerly (None while capturing is still possible or done).
        calls: number of calls so far.

    Raises (on call):
        ValueError: a captured step called with a different number of inputs, or an input whose
            shape, dtype or device differs from the captured one (a graph has fixed buffers).
        TypeError: a non-tensor input.
    """

    def __init__(self, fn: Callable[..., Any], enabled: bool | None = None, warmup: int = 3):
        if warmup < 1:
            raise ValueError(f"GraphedStep: warmup must be >= 1, got {warmup}")
        self.fn = fn
        self.enabled = enabled
        self.warmup = warmup
        self.calls = 0
        self.captured = False
        self.fallback_reason: str | None = None
        self._graph = None
        self._static_in: list[torch.Tensor] = []
        self._static_out: list[torch.Tensor] = []
        self._out_spec = None
        self._stream = None

    # ------------------------------------------------------------------ decisions
    def _want_graph(self, inputs) -> bool:
        if self.fallback_reason is not None:
            return False
        devices = {t.device.type for t in inputs}
        if devices != {"cuda"}:
            self.fallback_reason = f"inputs on {sorted(devices) or ['no tensors']}: CUDA graphs need CUDA tensors"
            return False
        enabled = cuda_graphs_enabled(inputs[0].device) if self.enabled is None else self.enabled
        if not enabled:
            self.fallback_reason = f"disabled ({ENV_FLAG}=0 or enabled=False)"
        return enabled

    def _check(self, inputs):
        if len(inputs) != len(self._static_in):
            raise ValueError(f"GraphedStep: captured with {len(self._static_in)} inputs, called with {len(inputs)}")
        for i, (x, s) in enumerate(zip(inputs, self._static_in)):
            if x.shape != s.shape or x.dtype != s.dtype or x.device != s.device:
                raise ValueError(f"GraphedStep: input {i} is {tuple(x.shape)} {x.dtype} on {x.device}, the graph "
                                 f"was captured with {tuple(s.shape)} {s.dtype} on {s.device}")

    # ------------------------------------------------------------------ calls
    def __call__(self, *inputs):
        for i, x in enumerate(inputs):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"GraphedStep: input {i} must be a tensor, got {type(x).__name__}")
        self.calls += 1
        if self.captured:
            self._check(inputs)
            for s, x in zip(self._static_in, inputs):
                s.copy_(x)
            self._graph.replay()
            return _unflatten(self._out_spec, self._static_out)
        if not self._want_graph(inputs):
            return self.fn(*inputs)
        if self.calls <= self.warmup:
            return self._warm(inputs)
        return self._capture(inputs)

    def _warm(self, inputs):  # pragma: no cover  (needs a CUDA device)
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=inputs[0].device)
        self._stream.wait_stream(torch.cuda.current_stream(inputs[0].device))
        with torch.cuda.stream(self._stream):
            out = self.fn(*inputs)
        torch.cuda.current_stream(inputs[0].device).wait_stream(self._stream)
        return out

    def _capture(self, inputs):  # pragma: no cover  (needs a CUDA device)
        self._static_in = [x.clone() for x in inputs]
        graph = torch.cuda.CUDAGraph()
        box: list = []
        try:
            torch.cuda.synchronize(inputs[0].device)
            capture_graph(graph, lambda: box.append(self.fn(*self._static_in)), inputs[0].device)
            out = box[0]
        except Exception as e:  # capture is best effort: fall back to eager, say why
            self.fallback_reason = f"capture failed: {type(e).__name__}: {e}"
            self._static_in = []
            torch.cuda.synchronize(inputs[0].device)
            return self.fn(*inputs)
        leaves: list[torch.Tensor] = []
        self._out_spec = _flatten(out, leaves)
        self._static_out = leaves
        self._graph = graph
        self.captured = True
        # the capture recorded the work but did not run it: run it once for this call's inputs
        for s, x in zip(self._static_in, inputs):
            s.copy_(x)
        graph.replay()
        return _unflatten(self._out_spec, self._static_out)


# ---------------------------------------------------------------------------- capture backends
# A capture backend runs a zero-argument step eagerly (``warm``) or records it (``capture``, which
# returns an object with ``replay()``). The CUDA-graph rollout (train/graphed_rollout.py) takes one
# as an argument so that the CPU tests drive the exact static-buffer code path with
# :class:`FakeGraphCapture`.


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
            cur = container[k] if isinstance(container, dict) else getattr(container, k)
            if cur is not v:
                if isinstance(container, dict):
                    container[k] = v
                else:
                    setattr(container, k, v)


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
        mode: ``"auto"`` (on when ``device`` is CUDA, the env runs the Triton backend and
            ``GPUSIM_CUDA_GRAPHS`` is not 0), ``"on"`` (wanted: the reason says why it cannot be
            used), ``"off"``.
        device: the env's device. backend: the env's kernel backend (``"triton"`` / ``"torch"``).

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
    if mode == "auto" and backend != "triton":
        return False, f"the env runs the {backend} backend (auto captures the Triton backend only)"
    return True, None


# ---------------------------------------------------------------------------- static-buffer helpers
# Shared by the CUDA-graph rollout (train/graphed_rollout.py) and the graphed env step
# (gpusim/graphed_env.py): both replay a step that reads and writes static buffers only.


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


def adopt_static_state(env, state, start, dst: list, src: list) -> tuple:
    """Keep ``env.state`` and ``env.sim.start`` (the episode's start state, trial restarts) in static
    buffers between graph replays. The first call clones them (``state`` / ``start`` None) and makes
    the clones the env's own; later calls append to ``dst`` / ``src`` the fields whose tensor the
    env replaced since (after an eager step or a reset), for one :func:`copy_all`, and point the env
    back at the static buffers. Returns the static ``(state, start)`` (``start`` None while the env
    has none)."""
    if state is None:
        state = env.state = env.state.clone()
    if env.sim.start is not None and start is None:
        start = env.sim.start = env.sim.start.clone()
    for static, cur in ((state, env.state), (start, env.sim.start)):
        if cur is not None and cur is not static:
            for name, s in static.tensors().items():
                x = getattr(cur, name)
                if x is not s:
                    dst.append(s)
                    src.append(x)
    if env.sim.start is not None:
        env.sim.start = start
    return state, start


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
    if isinstance(container, dict):
        container[k] = v
    else:
        setattr(container, k, v)


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
