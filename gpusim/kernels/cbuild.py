"""Build, cache and load the hand-written C kernels of the CPU path (ctypes), shared by every
``*.c`` kernel: one source per op next to the op's module (``collision.c``, ``offroad.c``,
``replay.c``, ``events.c``, ``signals.c``, ``motion.c``, ``accounting.c``, ``observations/cpu.c``),
all including the one shared header ``cpu_common.h`` (:data:`HEADER`), plus the argument checks
their Python wrappers share (:func:`c_tensor`, :func:`bool_out`, :func:`heading_trig_of`).

A :class:`CLibrary` compiles its source at first use with the system C compiler (``$CC``, else
``cc``; ``CC`` may carry arguments, e.g. ``"ccache gcc"``) and :data:`CFLAGS` plus ``-fopenmp``
(then without it if that fails; the kernels are then single-threaded), about 0.3-1 s. The shared
library is cached under :func:`cache_dir`, named ``<name>-<hash>.so`` by a hash of the source, the
flags and the compiler, and written through a temporary file and an atomic rename, so concurrent
processes (parallel test workers, torchrun ranks) never load a half-written file. No
``-march=native``: a cached library runs on any machine of the same architecture. Where no
compiler exists or the build fails, :meth:`CLibrary.load` returns None and warns once
(``RuntimeWarning`` naming the reason); callers then run their torch reference.

Each source exports ``int <prefix>_abi(void)`` (checked against the expected version, so a stale
cached library with another argument list is never called) and ``int <prefix>_has_openmp(void)``
(the header's ``GPUSIM_EXPORT_ABI`` macro). Libraries that share a ``label`` (the step's op kernels:
:data:`STEP_LABEL`) warn once together, so a machine without a compiler sees one warning.

OpenMP: loaded after torch, a library binds to the ``libgomp.so.1`` torch already loaded, so it
shares torch's thread pool.
"""

from __future__ import annotations

import ctypes
import hashlib
import keyword
import os
import re
import shlex
import shutil
import struct
import subprocess
import tempfile
import warnings
import weakref
from pathlib import Path
from typing import Callable

import torch

#: Compiler flags (plus ``-fopenmp`` when it works). ``-ffp-contract=off`` keeps every float32
#: multiply and add separately rounded, as torch's eager ops are, so results match bit for bit.
CFLAGS = ("-std=c99", "-O3", "-fPIC", "-shared", "-ffp-contract=off")

#: The header every kernel source includes (its directory is on the include path; its bytes are in
#: each library's cache key).
HEADER = Path(__file__).with_name("cpu_common.h")

#: The ``label`` of the step's op kernels (one warning for all of them).
STEP_LABEL = "C step kernels"

#: Every :class:`CLibrary` created, by name (:func:`libraries`).
_LIBRARIES: dict = {}
#: Labels that have warned since their libraries were last forgotten.
_WARNED: set = set()


def cache_dir() -> Path:
    """Where built libraries live: ``$XDG_CACHE_HOME/gpusim``, else ``~/.cache/gpusim``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpusim"


#: File name of the header :class:`CLibrary` generates for a source from Python tables (its
#: ``generated`` text: constants such as the observation layout's widths, the argument structs of
#: :class:`CStruct`), put on the include path of that source's build only.
GENERATED_HEADER = "gpusim_generated.h"


def define_lines(prefix: str, constants: dict) -> str:
    """``#define <prefix><NAME> <value>`` lines of ``constants`` (ints or floats; a float is
    written with ``repr`` and an ``f`` suffix), for a :class:`CLibrary`'s ``generated`` header."""
    out = []
    for name, value in constants.items():
        text = f"{float(value)!r}f" if isinstance(value, float) else str(int(value))
        out.append(f"#define {prefix}{name} {text}")
    return "\n".join(out) + "\n"


def compile_shared(cc: list, flags: tuple, source: Path, dest: Path, generated: str = "") -> str | None:
    """Compile ``source`` to the shared library ``dest`` (temporary file + atomic rename), with
    ``generated`` as :data:`GENERATED_HEADER` on its include path.

    Returns:
        None on success, else the error text (compiler output tail, or the OS error).
    """
    tmp = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=dest.stem + ".", suffix=".tmp", dir=dest.parent)
        os.close(fd)
        with tempfile.TemporaryDirectory(prefix=dest.stem + ".", dir=dest.parent) as gen_dir:
            Path(gen_dir, GENERATED_HEADER).write_text(generated)
            res = subprocess.run([*cc, *flags, f"-I{HEADER.parent}", f"-I{gen_dir}", "-o", tmp, str(source), "-lm"],
                                 capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            return (res.stderr or res.stdout).strip()[-400:] or f"exit code {res.returncode}"
        os.replace(tmp, dest)
        return None
    except (OSError, subprocess.SubprocessError) as exc:  # unwritable cache, compiler crash, timeout
        return f"{type(exc).__name__}: {exc}"
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


#: C scalar types a :class:`CStruct` field may have, and their ctypes twins (any pointer is ``c_void_p``).
C_SCALARS = {"int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32, "int": ctypes.c_int, "float": ctypes.c_float,
             "double": ctypes.c_double, "uint8_t": ctypes.c_uint8}

#: Entry points called through :class:`CStruct` since the last :func:`reset_call_counts`, by struct name
#: (``profiling/golden.py`` records them, so a run on the C backend shows that the C kernels ran).
CALL_COUNTS: dict = {}


def reset_call_counts() -> dict:
    """Clear :data:`CALL_COUNTS`; returns its previous contents."""
    old = dict(CALL_COUNTS)
    CALL_COUNTS.clear()
    return old


class CStruct:
    """The argument struct of one C entry point, declared once, in Python, as a C parameter list:
    the ctypes ``Structure`` (:attr:`ctype`) and its C twin (:meth:`c_declaration`, written into the
    library's generated header by :class:`CLibrary`) both come from it, so the two cannot disagree.
    The C function takes ``const <name> *args`` and opens with ``GPUSIM_UNPACK_<name>(args)``, which
    declares one local per field (same name and type as the parameter it replaced).

    Args:
        name: the C type name (e.g. ``"EventsArgs"``).
        params: comma-separated C declarations ``"<type> <name>"`` (``const float *pos, int64_t W``);
            a pointer is any type with a ``*``, a scalar one of :data:`C_SCALARS`.

    Calling it (``ARGS(pos=tensor, W=4, ...)``) packs the fields, named by keyword, into the bytes
    the C function reads: a tensor in a pointer field gives its ``data_ptr()`` (the caller has
    checked it contiguous, on the CPU, of the right dtype, and keeps it alive through the C call:
    pass tensors held by a name, never a temporary such as ``t.contiguous()``), an int is taken as
    an address, None gives NULL. Each call is counted in :data:`CALL_COUNTS`.

    Raises:
        ValueError: (at declaration) a declaration without a name, a repeated name, a name that is
            a Python keyword or starts with ``_``, an unknown scalar type, or a layout that differs
            from ctypes' (never on a supported platform).
        TypeError: (at a call) a missing or unknown field name.
    """

    def __init__(self, name: str, params: str):
        fields = []
        for decl in (d.strip() for d in params.replace("\n", " ").split(",")):
            m = re.fullmatch(r"(.*?[\s*])(\w+)", decl)
            if m is None or not m.group(1).strip():
                raise ValueError(f"CStruct {name}: cannot read the declaration {decl!r}")
            ctype = " ".join(m.group(1).split())
            if "*" not in ctype and ctype.replace("const ", "") not in C_SCALARS:
                raise ValueError(f"CStruct {name}: unknown C type {ctype!r} of {m.group(2)}")
            fields.append((m.group(2), ctype))
        names = [n for n, _ in fields]
        if len(set(names)) != len(names):
            raise ValueError(f"CStruct {name}: repeated field names in {names}")
        bad = [n for n in names if n.startswith("_") or keyword.iskeyword(n)]
        if bad:  # the packers take the fields as Python keyword arguments
            raise ValueError(f"CStruct {name}: field names {bad} are Python keywords or start with '_'")
        self.name, self.fields, self.names = name, tuple(fields), tuple(names)
        twins = [(n, ctypes.c_void_p if "*" in t else C_SCALARS[t.replace("const ", "")]) for n, t in fields]
        self.ctype = type(name, (ctypes.Structure,), {"_fields_": twins})
        packer = struct.Struct("@" + "".join(ct._type_ for _, ct in twins) + "0P")  # 0P: the trailing padding
        self._pack = packer.pack
        offsets = [struct.calcsize("@" + "".join(ct._type_ for _, ct in twins[:i + 1])) - ctypes.sizeof(ct)
                   for i, (_, ct) in enumerate(twins)]
        if offsets != [getattr(self.ctype, n).offset for n in names] or packer.size != ctypes.sizeof(self.ctype):
            raise ValueError(f"CStruct {name}: struct and ctypes layouts differ")
        self._pointer_at = tuple(i for i, (_, t) in enumerate(fields) if "*" in t)
        self._all = self.bind()

    def c_declaration(self) -> str:
        """The C ``typedef struct {...} <name>;`` and the ``GPUSIM_UNPACK_<name>(a)`` macro."""
        members = "".join(f"    {t}{'' if t.endswith('*') else ' '}{n};\n" for n, t in self.fields)
        unpack = " \\\n".join(f"    {t}{'' if t.endswith('*') else ' '}{n} = (a)->{n};" for n, t in self.fields)
        return (f"typedef struct {{\n{members}}} {self.name};\n"
                f"#define GPUSIM_UNPACK_{self.name}(a) \\\n{unpack}\n")

    def __call__(self, **values) -> bytes:
        return self._all(**values)

    def bind(self, **fixed):
        """A packer with the fields ``fixed`` set once (the pack's tables, the config's constants):
        ``packer(**rest) -> bytes`` takes the other fields, each by name, and is what a kernel's
        ``bind_*`` factory keeps for the step (the fixed fields cost nothing per call).

        Raises:
            TypeError: an unknown name in ``fixed``; (at a call) a missing or unknown field
                (Python's own message: "missing 1 required keyword-only argument: 'dt'").
        """
        unknown = sorted(set(fixed) - set(self.names))
        if unknown:
            raise TypeError(f"{self.name}: unknown fields {unknown}")
        pointers = {self.names[i] for i in self._pointer_at}
        scope = {"_pack": self._pack, "_counts": CALL_COUNTS, "_name": self.name}
        rest, exprs = [], []
        for i, n in enumerate(self.names):
            if n in fixed:  # a constant of the packer
                scope[f"_f{i}"] = _address(fixed[n]) if n in pointers else fixed[n]
                exprs.append(f"_f{i}")
            else:
                rest.append(n)
                exprs.append(f"(0 if {n} is None else {n} if {n}.__class__ is int else {n}.data_ptr())"
                             if n in pointers else n)
        # one generated function: keyword-only parameters (Python itself refuses a missing or
        # unknown name) and the values packed in the table's order, with no per-field loop
        params = f"*, {', '.join(rest)}" if rest else ""
        exec(f"def packer({params}):\n    _counts[_name] = _counts.get(_name, 0) + 1\n"
             f"    return _pack({', '.join(exprs)})\n", scope)
        return scope["packer"]


def _address(v) -> int:
    """The address a pointer field takes: a tensor's ``data_ptr()``, an int as is, None as 0."""
    return 0 if v is None else v if isinstance(v, int) else v.data_ptr()


def declare_struct_entry(lib, symbol: str, restype=None) -> None:
    """Declare ``lib.<symbol>`` as a C function of one :class:`CStruct` argument (``const T *``),
    the packed bytes of a call, returning ``restype``."""
    fn = getattr(lib, symbol)
    fn.argtypes, fn.restype = [ctypes.c_char_p], restype


class CLibrary:
    """One C source built on demand and loaded through ctypes.

    Args:
        name: file-name stem of the cached library (``<name>-<hash>.so``).
        source: path of the ``.c`` file.
        prefix: symbol prefix: the source exports ``<prefix>_abi`` and ``<prefix>_has_openmp``.
        abi: the version ``<prefix>_abi()`` must return.
        declare: called with the loaded ``ctypes.CDLL`` to set argument/result types.
        label: what the one warning calls it (e.g. ``"C observation kernel"``).
        generated: a function of no argument returning the text of the source's
            :data:`GENERATED_HEADER` (derived from Python tables; part of the cache key), or None
            (an empty header).
        structs: the :class:`CStruct` argument structs of its entry points, declared in the same
            generated header (after ``generated``'s text).
    """

    def __init__(self, name: str, source: Path, prefix: str, abi: int, declare: Callable, label: str,
                 generated: Callable | None = None, structs: tuple = ()):
        self.name, self.source, self.prefix, self.abi = name, Path(source), prefix, abi
        self.declare, self.label, self.generated, self.structs = declare, label, generated, tuple(structs)
        self._state: dict = {}  # "lib": CDLL | None, "reason": str, "openmp": bool, "path": Path
        _LIBRARIES[name] = self

    def _build_and_load(self) -> tuple:
        """(lib, reason, openmp, path): the loaded library, or None and why not."""
        cc = shlex.split(os.environ.get("CC") or "cc") or ["cc"]
        if shutil.which(cc[0]) is None:
            return None, f"no C compiler: {cc[0]!r} not found (set CC)", False, None
        generated = (self.generated() if self.generated is not None else "") + "".join(
            st.c_declaration() for st in self.structs)
        src = self.source.read_bytes() + HEADER.read_bytes() + generated.encode()
        errors = []
        for flags in (CFLAGS + ("-fopenmp",), CFLAGS):
            tag = hashlib.sha256(src + repr((flags, cc)).encode()).hexdigest()[:16]
            path = cache_dir() / f"{self.name}-{tag}.so"
            if not path.exists():
                err = compile_shared(cc, flags, self.source, path, generated)
                if err is not None:
                    errors.append(f"{' '.join(cc)} {' '.join(flags)}: {err}")
                    continue
            try:
                lib = ctypes.CDLL(str(path))
                got = getattr(lib, f"{self.prefix}_abi")()
            except (OSError, AttributeError) as exc:
                errors.append(f"loading {path}: {exc}")
                continue
            if got != self.abi:
                errors.append(f"{path}: ABI {got} != {self.abi}")
                continue
            self.declare(lib)
            return lib, "", bool(getattr(lib, f"{self.prefix}_has_openmp")()), path
        return None, "build failed: " + " | ".join(errors), False, None

    def load(self, stacklevel: int = 3):
        """The loaded library (built and cached on first use), or None when it cannot be built; the
        first failure of a label warns once (``RuntimeWarning`` naming the reason)."""
        if "lib" not in self._state:
            lib, reason, omp, path = self._build_and_load()
            self._state.update(lib=lib, reason=reason, openmp=omp, path=path)
            if lib is None and self.label not in _WARNED:
                _WARNED.add(self.label)
                warnings.warn(f"gpusim: {self.label} unavailable ({reason}); using the torch reference "
                              "(same results, slower)", RuntimeWarning, stacklevel=stacklevel)
        return self._state["lib"]

    def status(self) -> dict:
        """``{"available": bool, "reason": str, "openmp": bool, "path": str | None}`` (builds on first call)."""
        lib = self.load(stacklevel=4)
        path = self._state.get("path")
        return {"available": lib is not None, "reason": self._state["reason"], "openmp": self._state["openmp"],
                "path": str(path) if lib is not None else None}

    def forget(self) -> None:
        """Forget the loaded library and any build failure, so the next call builds/loads again
        (tests: a changed ``CC`` or cache directory). A loaded library stays mapped in the process."""
        self._state.clear()
        _WARNED.discard(self.label)


def libraries(label: str = STEP_LABEL) -> list:
    """The :class:`CLibrary` objects created with ``label`` (the op modules create theirs at import)."""
    return [lib for lib in _LIBRARIES.values() if lib.label == label]


def step_kernels_status() -> dict:
    """``{"available", "reason", "openmp", "path"}`` of the step's op kernels together (builds them on
    first call): available when every one loaded; the first failure's reason; ``path`` the cache
    directory of the first library."""
    import importlib

    for source in HEADER.parent.glob("*.c"):  # each op module next to its .c creates its library at import
        importlib.import_module(f"{__package__}.{source.stem}")
    st = [lib.status() for lib in libraries()]
    bad = [s for s in st if not s["available"]]
    return {"available": not bad, "reason": bad[0]["reason"] if bad else "", "openmp": all(s["openmp"] for s in st),
            "path": st[0]["path"] if st else None}


def forget_step_libraries() -> None:
    """:meth:`CLibrary.forget` on every step op library (tests: another ``CC`` or cache directory)."""
    for lib in libraries():
        lib.forget()


def c_tensor(t: torch.Tensor, fn: str, name: str, dtype, shape) -> torch.Tensor:
    """``t`` as a contiguous CPU tensor of ``dtype`` and ``shape`` (a copy only when not already
    contiguous). Called dozens of times a step, so the test is cheap and the message is built only
    on failure.

    Raises:
        ValueError: ``"<fn>: <name> must be a CPU <dtype> tensor of shape <shape>, got ..."``.
    """
    if t.dtype is not dtype or t.shape != shape or not t.is_cpu:
        raise ValueError(f"{fn}: {name} must be a CPU {dtype} tensor of shape {tuple(shape)}, "
                         f"got {t.dtype} {tuple(t.shape)} on {t.device}")
    return t if t.is_contiguous() else t.contiguous()


def trusted(t: torch.Tensor, fn: str, name: str, dtype, shape) -> torch.Tensor:
    """:func:`c_tensor` without the checks (``check=False``: the caller guarantees the layout)."""
    return t


def checker(check: bool) -> Callable:
    """:func:`c_tensor` when ``check``, else :func:`trusted`."""
    return c_tensor if check else trusted


def bool_out(out, W: int, A: int, name: str) -> torch.Tensor:
    """``out`` checked as a contiguous CPU bool [W, A] tensor, or a new one when None.

    Raises:
        ValueError: ``out`` of another dtype, shape, layout or device.
    """
    if out is None:
        return torch.empty(W, A, dtype=torch.bool)
    if out.dtype != torch.bool or tuple(out.shape) != (W, A) or not out.is_contiguous() or out.device.type != "cpu":
        raise ValueError(f"{name}: out must be a contiguous CPU bool tensor of shape {(W, A)}")
    return out


#: ``(weak reference to a heading tensor, its version, cos, sin)`` of the last :func:`heading_trig` call
_TRIG: list = [None, -1, None, None]


def heading_trig(heading: torch.Tensor) -> tuple:
    """``(torch.cos(heading), torch.sin(heading))`` of a float32 heading tensor, computed once for
    the same tensor object and in-place version: within a step the C kernels of the contacts and of
    the observation share one pass (the headings do not change between them)."""
    ref, version, c, s = _TRIG
    if ref is not None and ref() is heading and version == heading._version:
        return c, s
    c, s = torch.cos(heading), torch.sin(heading)
    _TRIG[:] = [weakref.ref(heading), heading._version, c, s]
    return c, s


def heading_trig_of(heading: torch.Tensor, cos_h=None, sin_h=None) -> tuple:
    """``(cos, sin)`` of ``heading`` (float32, torch's values): the caller's when given, else
    :func:`heading_trig`."""
    if cos_h is None or sin_h is None:
        return heading_trig(heading)
    return cos_h.contiguous(), sin_h.contiguous()


#: index tensors already checked by :func:`check_index_range`: id -> (weak reference, version, bound)
_RANGE_OK: dict = {}


def check_index_range(index, bound: int, what: str) -> None:
    """Raise ``ValueError(what)`` unless every value of the integer tensor ``index`` lies in
    ``[0, bound)``. A tensor that passed once is not read again while unchanged (the same object,
    same in-place version counter, same bound): the env's ``scenario`` tensor keeps its object
    between resets, so the C kernels' per-call range checks cost no torch op on the step's path.

    Raises:
        ValueError: naming ``what``.
    """
    hit = _RANGE_OK.get(id(index))
    if hit is not None and hit[0]() is index and hit[1] == index._version and hit[2] == bound:
        return
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= bound):
        raise ValueError(what)
    if len(_RANGE_OK) > 256:  # dead entries of freed tensors
        _RANGE_OK.clear()
    _RANGE_OK[id(index)] = (weakref.ref(index), index._version, bound)
