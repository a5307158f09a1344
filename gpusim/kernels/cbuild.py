"""Build, cache and load the hand-written C kernels of the CPU path (ctypes), shared by every
``*.c`` kernel (``observations/cpu.c``, ``step_cpu.c``).

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
cached library with another argument list is never called) and ``int <prefix>_has_openmp(void)``.

OpenMP: loaded after torch, a library binds to the ``libgomp.so.1`` torch already loaded, so it
shares torch's thread pool.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import warnings
import weakref
from pathlib import Path
from typing import Callable

#: Compiler flags (plus ``-fopenmp`` when it works). ``-ffp-contract=off`` keeps every float32
#: multiply and add separately rounded, as torch's eager ops are, so results match bit for bit.
CFLAGS = ("-std=c99", "-O3", "-fPIC", "-shared", "-ffp-contract=off")


def cache_dir() -> Path:
    """Where built libraries live: ``$XDG_CACHE_HOME/gpusim``, else ``~/.cache/gpusim``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpusim"


def compile_shared(cc: list, flags: tuple, source: Path, dest: Path) -> str | None:
    """Compile ``source`` to the shared library ``dest`` (temporary file + atomic rename).

    Returns:
        None on success, else the error text (compiler output tail, or the OS error).
    """
    tmp = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=dest.stem + ".", suffix=".tmp", dir=dest.parent)
        os.close(fd)
        res = subprocess.run([*cc, *flags, "-o", tmp, str(source), "-lm"], capture_output=True, text=True,
                             timeout=120)
        if res.returncode != 0:
            return (res.stderr or res.stdout).strip()[-400:] or f"exit code {res.returncode}"
        os.replace(tmp, dest)
        return None
    except (OSError, subprocess.SubprocessError) as exc:  # unwritable cache, compiler crash, timeout
        return f"{type(exc).__name__}: {exc}"
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


class CLibrary:
    """One C source built on demand and loaded through ctypes.

    Args:
        name: file-name stem of the cached library (``<name>-<hash>.so``).
        source: path of the ``.c`` file.
        prefix: symbol prefix: the source exports ``<prefix>_abi`` and ``<prefix>_has_openmp``.
        abi: the version ``<prefix>_abi()`` must return.
        declare: called with the loaded ``ctypes.CDLL`` to set argument/result types.
        label: what the one warning calls it (e.g. ``"C observation kernel"``).
    """

    def __init__(self, name: str, source: Path, prefix: str, abi: int, declare: Callable, label: str):
        self.name, self.source, self.prefix, self.abi = name, Path(source), prefix, abi
        self.declare, self.label = declare, label
        self._state: dict = {}  # "lib": CDLL | None, "reason": str, "openmp": bool, "path": Path

    def _build_and_load(self) -> tuple:
        """(lib, reason, openmp, path): the loaded library, or None and why not."""
        cc = shlex.split(os.environ.get("CC") or "cc") or ["cc"]
        if shutil.which(cc[0]) is None:
            return None, f"no C compiler: {cc[0]!r} not found (set CC)", False, None
        src = self.source.read_bytes()
        errors = []
        for flags in (CFLAGS + ("-fopenmp",), CFLAGS):
            tag = hashlib.sha256(src + repr((flags, cc)).encode()).hexdigest()[:16]
            path = cache_dir() / f"{self.name}-{tag}.so"
            if not path.exists():
                err = compile_shared(cc, flags, self.source, path)
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
        first failure warns once (``RuntimeWarning`` naming the reason)."""
        if "lib" not in self._state:
            lib, reason, omp, path = self._build_and_load()
            self._state.update(lib=lib, reason=reason, openmp=omp, path=path)
            if lib is None:
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
