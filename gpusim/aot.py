"""Ahead-of-time compilation of gpusim's Triton kernels for real GPU targets, on any machine.

Triton's CPU interpreter (how the kernels are tested without a GPU) is more lenient than the
compiler: a plain module-level float inside ``@triton.jit`` code, for instance, runs under the
interpreter and fails to compile. Triton 3.9 can lower a kernel to PTX and run its bundled
``ptxas`` for an explicit target with no GPU present, so CI can check what a GPU would compile.
``tests/test_aot_compile.py`` uses the three pieces of this module:

1. :func:`jit_functions` / :func:`kernels`: every ``@triton.jit`` function defined in the gpusim
   package (found by walking its source files, so a new kernel is picked up automatically), and
   which of them are launchable kernels (no ``return`` of a value) rather than device helpers.
2. :func:`record_specs`: a ``with`` block that records, for every Triton launch inside it, the
   argument types, alignment attributes, constexpr values and launch options exactly as Triton's
   own launcher would specialise them (:class:`Spec`, JSON-serialisable). Run the public
   dispatchers inside it with ``GPUSIM_BACKEND=triton`` (interpreter on CPU tensors), ideally
   inside :func:`gpusim.backend.gpu_launch_sizes` so launchers pick their GPU block sizes.
3. :func:`compile_specs`: compiles specs for ``GPUTarget("cuda", cap, 32)`` to cubin in a
   subprocess without ``TRITON_INTERPRET`` (``python -m gpusim.aot``), parsing ``ptxas -v`` for
   register and spill counts. The compiled-metadata ``n_spills`` of a launched kernel comes from
   the CUDA driver (local memory size / 4), which needs a device; without one the ``ptxas``
   report of spill stores/loads is the equivalent check.

The subprocess is needed because under ``TRITON_INTERPRET=1`` ``@triton.jit`` returns interpreter
objects whose callees (``trimath.atan``, ...) the compiler cannot use.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import inspect
import io
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import textwrap
import time

#: The GPU targets the test suite compiles for (compute capabilities, 32-thread warps).
CAPABILITIES = (80, 90)
#: Launch keyword arguments that are compile options, not kernel arguments.
OPTION_NAMES = ("num_warps", "num_stages", "num_ctas", "maxnreg")
PACKAGE_ROOT = pathlib.Path(__file__).resolve().parent


# ----------------------------------------------------------------------------- discovery
def jit_classes() -> tuple:
    """Triton's ``JITFunction`` and, when present, the interpreter's ``InterpretedFunction``."""
    from triton.runtime.jit import JITFunction

    classes = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:  # pragma: no cover
        pass
    return tuple(classes)


def kernel_name(fn) -> str:
    """``"module:function"`` of a ``@triton.jit`` object (JIT or interpreted)."""
    return f"{fn.fn.__module__}:{fn.fn.__qualname__}"


def jit_functions(root: pathlib.Path = PACKAGE_ROOT, package: str = "gpusim") -> dict:
    """Every ``@triton.jit`` function defined at module level under ``root``.

    Walks the ``.py`` files of the package (subpackages included), imports those whose source
    mentions ``triton.jit`` and collects their JIT objects (a re-export counts once, under the
    module that defines it).

    Returns:
        ``{"module:function": jit_object}``, sorted by name.

    Raises:
        ImportError: a module that mentions ``triton.jit`` fails to import.
    """
    classes = jit_classes()
    found = {}
    for path in sorted(root.rglob("*.py")):
        if "triton.jit" not in path.read_text(encoding="utf-8", errors="replace"):
            continue
        rel = path.relative_to(root).with_suffix("")
        parts = [package, *rel.parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mod = importlib.import_module(".".join(parts))
        for value in vars(mod).values():
            if isinstance(value, classes) and value.fn.__module__ == mod.__name__:
                found[kernel_name(value)] = value
    return dict(sorted(found.items()))


def is_kernel(fn) -> bool:
    """True for a launchable kernel, False for a device helper (a function that returns a value:
    Triton kernels cannot return values)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn.fn)))
    func = tree.body[0]
    todo = list(func.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Return) and node.value is not None:
            return False
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        todo.extend(ast.iter_child_nodes(node))
    return True


def kernels(root: pathlib.Path = PACKAGE_ROOT, package: str = "gpusim") -> dict:
    """The launchable kernels among :func:`jit_functions` (same keys)."""
    return {k: v for k, v in jit_functions(root, package).items() if is_kernel(v)}


# ----------------------------------------------------------------------------- recording
@dataclasses.dataclass(frozen=True)
class Spec:
    """One specialisation of a kernel, as Triton's launcher would compile it.

    Attributes:
        kernel: ``"module:function"``.
        signature: ``{argument: type}`` (``"*fp32"``, ``"i32"``, ``"fp32"``, ``"u1"``, ...;
            ``"constexpr"`` for constexpr parameters and for values Triton specialises away,
            e.g. an int equal to 1 or ``None``).
        constexprs: ``{argument: value}`` for the ``"constexpr"`` entries (JSON values; a Triton
            dtype is stored as ``{"dtype": "fp32"}``).
        attrs: ``{argument: key}``: Triton's specialisation key (``"D"`` = divisible by 16).
        options: launch options given at the call (``num_warps``, ``num_stages``, ...).
    """

    kernel: str
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict

    def key(self) -> str:
        """A canonical string: equal keys compile to the same binary."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @staticmethod
    def from_dict(d: dict) -> "Spec":
        """Inverse of ``dataclasses.asdict``."""
        return Spec(**d)


def _jit_params(fn):
    """Triton's parameter descriptions (constexpr, do_not_specialize, ...) of a JIT object."""
    from triton.runtime.jit import JITFunction

    if isinstance(fn, JITFunction):
        return fn, fn.params
    cached = getattr(fn, "_gpusim_aot_jit", None)
    if cached is None:  # an interpreted function: build the compiler's view of the same function
        cached = JITFunction(fn.fn, **{k: v for k, v in fn.kwargs.items() if v is not None})
        fn._gpusim_aot_jit = cached
    return cached, cached.params


def _to_json(value):
    if hasattr(value, "value") and type(value).__name__ == "constexpr":
        value = value.value
    if type(value).__name__ in ("dtype", "pointer_type"):
        return {"dtype": str(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot record constexpr value {value!r} of type {type(value).__name__}")


def specialise(fn, args: tuple, kwargs: dict) -> Spec:
    """The :class:`Spec` that Triton's launcher builds for ``fn[grid](*args, **kwargs)``.

    Uses Triton's own specialisation rule (``native_specialize_impl``: pointer dtype, 16-byte
    alignment, ints equal to 1 or divisible by 16, int32/int64 range) with the parameters'
    ``do_not_specialize`` settings.

    Raises:
        TypeError: a missing argument, or a constexpr value that cannot be stored as JSON.
    """
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    jit, params = _jit_params(fn)
    backend = make_backend(GPUTarget("cuda", CAPABILITIES[-1], 32))
    bound = jit.signature.bind(*args, **{k: v for k, v in kwargs.items() if k in jit.arg_names})
    bound.apply_defaults()
    signature, constexprs, attrs = {}, {}, {}
    for p in params:
        value = bound.arguments[p.name]
        if p.is_constexpr:
            signature[p.name] = "constexpr"
            constexprs[p.name] = _to_json(value)
            continue
        ty, key = native_specialize_impl(backend, value, p.is_const, not p.do_not_specialize,
                                         not p.do_not_specialize_on_alignment)
        if p.annotation_type and isinstance(p.annotation_type, str) and ty != "constexpr":
            ty = p.annotation_type
        signature[p.name] = ty
        if ty == "constexpr":
            constexprs[p.name] = _to_json(key)
        elif isinstance(key, str):
            attrs[p.name] = key
    options = {k: kwargs[k] for k in OPTION_NAMES if k in kwargs}
    return Spec(kernel_name(fn), signature, constexprs, attrs, options)


@contextlib.contextmanager
def on_launch(callback):
    """Call ``callback(jit_object, args, kwargs)`` before every Triton launch (compiled or
    interpreted) inside the ``with`` block; warm-up calls are not reported. The patched ``run``
    methods are restored on exit, also when the block raises."""
    saved = []
    for cls in jit_classes():
        orig = cls.run

        def run(self, *args, __orig=orig, **kwargs):
            if not kwargs.get("warmup", False):
                callback(self, args, kwargs)
            return __orig(self, *args, **kwargs)

        cls.run = run
        saved.append((cls, orig))
    try:
        yield
    finally:
        for cls, orig in saved:
            cls.run = orig


@contextlib.contextmanager
def record_specs():
    """Yield a list that receives the :class:`Spec` of every Triton launch in the block, in order
    (duplicates included; see :func:`unique_specs`)."""
    log: list[Spec] = []
    with on_launch(lambda fn, args, kwargs: log.append(specialise(fn, args, kwargs))):
        yield log


def unique_specs(specs) -> list[Spec]:
    """``specs`` without repeats, first occurrence first."""
    seen, out = set(), []
    for s in specs:
        if s.key() not in seen:
            seen.add(s.key())
            out.append(s)
    return out


# ----------------------------------------------------------------------------- compiling
_PTXAS_FUNC = re.compile(r"Compiling entry function '([^']+)'")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")


def parse_ptxas_log(log: str) -> dict:
    """``{"registers", "stack_bytes", "spill_store_bytes", "spill_load_bytes"}`` from ``ptxas -v``
    output (the last entry function reported); missing numbers are None."""
    out = dict(registers=None, stack_bytes=None, spill_store_bytes=None, spill_load_bytes=None)
    for m in _PTXAS_SPILL.finditer(log):
        out.update(stack_bytes=int(m[1]), spill_store_bytes=int(m[2]), spill_load_bytes=int(m[3]))
    for m in _PTXAS_REGS.finditer(log):
        out["registers"] = int(m[1])
    return out


def _decode(value):
    import triton.language as tl

    if isinstance(value, dict) and set(value) == {"dtype"}:
        return tl.str_to_ty(value["dtype"], None)
    return value


def compile_spec(spec: Spec, capability: int) -> dict:
    """Compile one spec for ``GPUTarget("cuda", capability, 32)`` to cubin (in this process; the
    kernel's module must have been imported without ``TRITON_INTERPRET``).

    Returns:
        ``{"kernel", "capability", "ok", "error", "seconds", "cubin_bytes", "registers",
        "stack_bytes", "spill_store_bytes", "spill_load_bytes", "spills"}``; ``spills`` is
        ``(spill stores + spill loads) / 4``, the register words moved to local memory.
        A compile error gives ``ok=False`` and the error text (first 4000 characters).
    """
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    module, name = spec.kernel.split(":")
    fn = getattr(importlib.import_module(module), name)
    target = GPUTarget("cuda", capability, 32)
    backend = make_backend(target)
    index = {n: i for i, n in enumerate(fn.arg_names)}
    constexprs = {(index[k],): _decode(v) for k, v in spec.constexprs.items()}
    attrs = {(index[k],): backend.parse_attr(v) for k, v in spec.attrs.items()}
    res = dict(kernel=spec.kernel, capability=capability, ok=False, error=None, seconds=0.0, cubin_bytes=0)
    knobs.nvidia.dump_ptxas_log = True
    buf = io.StringIO()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(buf):
            compiled = triton.compile(ASTSource(fn, dict(spec.signature), constexprs, attrs), target=target,
                                      options=dict(spec.options))
        res["ok"] = True
        res["cubin_bytes"] = len(compiled.asm["cubin"])
    except Exception as e:  # compile errors of every kind are the result, not a crash
        res["error"] = f"{type(e).__name__}: {e}"[:4000]
    res["seconds"] = time.perf_counter() - t0
    res.update(parse_ptxas_log(buf.getvalue()))
    if res["ok"] and res["spill_store_bytes"] is None:
        res.update(ok=False, error="no ptxas report (a cached kernel?): run with an empty TRITON_CACHE_DIR")
    spilled = (res["spill_store_bytes"] or 0) + (res["spill_load_bytes"] or 0)
    res["spills"] = spilled // 4
    return res


def _module_roots(specs) -> list[str]:
    """Directories to put on ``sys.path`` so the subprocess imports every spec's module."""
    roots = []
    for s in specs:
        module = s.kernel.split(":")[0]
        mod = sys.modules.get(module)
        if mod is None or not getattr(mod, "__file__", None):
            continue
        root = pathlib.Path(mod.__file__).resolve().parent
        for _ in module.split(".")[1:]:
            root = root.parent
        if str(root) not in roots:
            roots.append(str(root))
    return roots


def compile_specs(specs, capabilities=CAPABILITIES, timeout: float = 600.0, jobs: int | None = None) -> list[dict]:
    """Compile ``specs`` for every capability in fresh subprocesses (``python -m gpusim.aot``)
    without ``TRITON_INTERPRET`` and with an empty Triton cache (so ``ptxas`` always runs).

    Args:
        jobs: parallel subprocesses, each compiling an interleaved share of the specs
            (default ``min(2, cpu count)``).

    Returns:
        one :func:`compile_spec` result per (spec, capability), specs in order.

    Raises:
        RuntimeError: a subprocess failed (its stderr tail is in the message).
    """
    specs = list(specs)
    jobs = max(1, min(jobs or min(2, os.cpu_count() or 1), len(specs) or 1))
    with tempfile.TemporaryDirectory(prefix="gpusim-aot-") as tmp:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated (silences its warning)
        roots = _module_roots(specs) + [str(PACKAGE_ROOT.parent)]
        env["PYTHONPATH"] = os.pathsep.join(roots + [p for p in [env.get("PYTHONPATH")] if p])
        procs = []
        for j in range(jobs):
            src = pathlib.Path(tmp) / f"specs{j}.json"
            dst = pathlib.Path(tmp) / f"results{j}.json"
            src.write_text(json.dumps([dataclasses.asdict(s) for s in specs[j::jobs]]))
            cmd = [sys.executable, "-m", "gpusim.aot", str(src), str(dst), "--capabilities", *map(str, capabilities)]
            penv = dict(env, TRITON_CACHE_DIR=str(pathlib.Path(tmp) / f"cache{j}"))
            procs.append((cmd, dst, subprocess.Popen(cmd, env=penv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                     text=True)))
        parts = []
        for cmd, dst, proc in procs:
            try:
                _, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if proc.returncode != 0 or not dst.exists():
                raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{(err or '')[-4000:]}")
            parts.append(json.loads(dst.read_text()))
    n = len(capabilities)
    out = []
    for i in range(len(specs)):  # back to spec order: spec i is the (i // jobs)-th of part i % jobs
        k = i // jobs
        out.extend(parts[i % jobs][k * n:(k + 1) * n])
    return out


def main(argv=None) -> int:
    """``python -m gpusim.aot SPECS.json RESULTS.json [--capabilities 80 90]``: compile every spec
    of the JSON list for every capability and write the results (a JSON list)."""
    import argparse

    ap = argparse.ArgumentParser(description="compile recorded Triton kernel specs to cubin (no GPU needed)")
    ap.add_argument("specs")
    ap.add_argument("results")
    ap.add_argument("--capabilities", type=int, nargs="+", default=list(CAPABILITIES))
    args = ap.parse_args(argv)
    specs = [Spec.from_dict(d) for d in json.loads(pathlib.Path(args.specs).read_text())]
    results = [compile_spec(s, cap) for s in specs for cap in args.capabilities]
    from gpusim.fileio import write_text

    write_text(args.results, json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
