"""The one way gpusim writes a file, and the one check of an output path.

Every file gpusim writes (checkpoints, packs, shards, JSON reports, protobuf exports, pictures,
run logs' side files) goes through :func:`atomic_write`: the bytes go to a temporary file in the
target's directory (``<name>.<random>.tmp``), are flushed to disk (``fsync``), and the temporary is
renamed over the target with ``os.replace``. POSIX makes a rename within one file system atomic, so
a reader sees either the old complete file or the new complete file, never a mix; a failed or
interrupted write leaves the previous file untouched and removes its temporary.

Every command that writes an output checks the output's path with :func:`check_output_path`
before it starts its work, so a finished evaluation or export is not lost to a path that could
never be written (its parent is a file, the path is a directory, the directory cannot be created
or is on a read-only file system).

A directory a process writes to for a while (a training run's folder) is held with
:func:`lock_directory`: an OS lock (``fcntl.flock``) that the kernel drops when the process ends
or is killed, so a second writer is refused with the holder's pid and no stale lock is left.

A write that fails anyway (a full disk, a file system remounted read-only, a permission change)
raises :class:`OutputError`: one line naming the file and the cause ("no space left on device"),
never a traceback from deep inside ``torch.save``. :func:`write_errors` does that conversion for
code that writes through another library (``matplotlib``'s ``savefig``, ``torch.save``).

:class:`OutputError` is a ``ValueError``, so the command-line tools' user-error handling (one line,
exit code 2) covers it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import tempfile

#: Causes named in :class:`OutputError` messages, by ``errno``; any other error uses
#: ``os.strerror`` (the C library's text).
_CAUSES = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EISDIR: "is a directory",
    errno.ENOTDIR: "a parent is a file, not a directory",
}


class OutputError(ValueError):
    """An output file that cannot be written. The message is one line naming the file (and the
    flag that chose it, when known) and the cause. ``errno`` holds the OS error number when the
    cause came from the OS (else ``None``)."""

    def __init__(self, message: str, errno_: int | None = None):
        super().__init__(message)
        self.errno = errno_


def cause(exc: OSError) -> str:
    """A short, lower-case name of an OS error's cause, e.g. ``"no space left on device"``."""
    if exc.errno in _CAUSES:
        return _CAUSES[exc.errno]
    if exc.errno is not None:
        return os.strerror(exc.errno).lower()
    return str(exc) or type(exc).__name__


def _label(path, flag: str | None) -> str:
    return f"{flag} {path}" if flag else str(path)


@contextlib.contextmanager
def write_errors(path, flag: str | None = None):
    """Context manager turning an ``OSError`` raised inside it into :class:`OutputError`.

    Args:
        path: the file being written (named in the message). flag: the command-line flag that
            chose it (e.g. ``"--json"``), or None.

    Raises:
        OutputError: ``"cannot write <flag> <path>: <cause>"`` for any ``OSError`` inside the
            block (the original is chained as ``__cause__``). Other exceptions pass unchanged.
    """
    try:
        yield
    except OutputError:
        raise
    except OSError as e:
        raise OutputError(f"cannot write {_label(path, flag)}: {cause(e)}", e.errno) from e


def temp_name_glob(path) -> str:
    """The glob pattern (relative to ``path``'s directory) of :func:`atomic_write`'s temporaries
    for ``path``: ``<name>.*.tmp``."""
    return pathlib.Path(path).name + ".*.tmp"


@contextlib.contextmanager
def atomic_write(path, mode: str = "w", *, flag: str | None = None, encoding: str = "utf-8"):
    """Open ``path`` for writing so that it appears whole or not at all.

    Yields a file object on a temporary file ``<dir>/<name>.<random>.tmp``; when the block ends
    without an error the file is flushed, ``fsync``-ed, closed and renamed over ``path``
    (``os.replace``), and the directory entry is ``fsync``-ed where the OS allows it. On any
    error (including ``KeyboardInterrupt``) the temporary is removed and ``path`` is left as it
    was. The parent directory is created if missing.

    Args:
        path: the target file (str or path-like). mode: ``"w"`` (text, ``encoding``) or ``"wb"``
            (bytes). flag: the command-line flag that chose ``path``, named in error messages.
        encoding: text encoding for ``"w"``.

    Raises:
        ValueError: a mode other than ``"w"``/``"wb"``.
        OutputError: an ``OSError`` while creating, writing or renaming (full disk, read-only file
            system, permission denied, ``path`` is a directory...), one line naming the file and
            the cause. Exceptions raised by the block itself other than ``OSError`` propagate
            unchanged.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write: mode must be 'w' or 'wb', not {mode!r}")
    kwargs = {"encoding": encoding} if mode == "w" else {}
    with _replaced(path, flag, "") as tmp, open(tmp, mode, **kwargs) as f:
        yield f


def _temp_beside(path: pathlib.Path, suffix: str = "") -> tuple[int, str]:
    """``(fd, name)`` of a new temporary file ``<dir>/<name>.<random>.tmp<suffix>`` beside ``path``
    (its folder created); raises ``IsADirectoryError`` when ``path`` is a directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    return tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp" + suffix)


@contextlib.contextmanager
def atomic_path(path, *, flag: str | None = None):
    """Like :func:`atomic_write` for writers that need a file *name* (e.g. ffmpeg): yields a
    temporary path ``<dir>/<name>.<random>.tmp<suffix>`` (the target's extension kept last, for
    writers that pick the format from it); when the block ends without an error that file is
    ``fsync``-ed and renamed over ``path``; on any error it is removed and ``path`` left as it was.

    Raises:
        OutputError: an ``OSError`` while creating, syncing or renaming (one line naming the file
            and the cause), or the writer left no file at the temporary path.
    """
    with _replaced(path, flag, pathlib.Path(path).suffix) as tmp:
        yield tmp


@contextlib.contextmanager
def _replaced(path, flag: str | None, suffix: str):
    """The one mechanism of :func:`atomic_write` and :func:`atomic_path`: yields a new temporary
    file's path beside ``path`` (:func:`_temp_beside`, ``suffix`` kept last); when the block ends
    without an error the file is ``fsync``-ed and renamed over ``path`` and the folder synced; on
    any error it is removed. ``OSError`` becomes :class:`OutputError` (:func:`write_errors`)."""
    path = pathlib.Path(path)
    tmp = None
    with write_errors(path, flag):
        try:
            fd, name = _temp_beside(path, suffix)
            os.close(fd)
            tmp = pathlib.Path(name)
            yield tmp
            if not tmp.is_file():
                raise OutputError(f"cannot write {_label(path, flag)}: the writer produced no file")
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            tmp = None
            _fsync_dir(path.parent)
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)


def _fsync_dir(directory: pathlib.Path) -> None:
    """``fsync`` a directory so a rename in it survives a power loss (best effort: some file
    systems refuse to open a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text(path, text: str, *, flag: str | None = None) -> pathlib.Path:
    """Write ``text`` (UTF-8) to ``path`` through :func:`atomic_write`; returns the path.

    Raises:
        OutputError: as :func:`atomic_write`.
    """
    return write_bytes(path, text.encode("utf-8"), flag=flag)


def write_bytes(path, data: bytes, *, flag: str | None = None) -> pathlib.Path:
    """Write ``data`` to ``path`` through :func:`atomic_write`; returns the path.

    Raises:
        OutputError: as :func:`atomic_write`.
    """
    with atomic_write(path, "wb", flag=flag) as f:
        f.write(data)
    return pathlib.Path(path)


def _nearest_existing(path: pathlib.Path) -> pathlib.Path:
    """``path`` or its nearest ancestor that exists (as anything: file, directory, link)."""
    p = path
    while not os.path.lexists(p):
        if p.parent == p:
            break
        p = p.parent
    return p


def _probe_writable(directory: pathlib.Path) -> None:
    """Create and remove a temporary file in ``directory``; raises the ``OSError`` if that fails.
    A real attempt is the only test that also holds for read-only mounts, ACLs and the root user
    (``os.access`` says yes to root on a read-only file system)."""
    fd, name = tempfile.mkstemp(dir=directory, prefix=".gpusim-write-check.", suffix=".tmp")
    os.close(fd)
    os.unlink(name)


def check_output_path(path, flag: str, *, kind: str = "file") -> pathlib.Path:
    """Check, before any work starts, that ``path`` can be written as an output.

    Nothing is created: a missing directory is fine when its nearest existing ancestor is a
    writable directory (the writer creates it later).

    Args:
        path: the output (str or path-like). flag: the command-line flag that chose it (named in
            the message, e.g. ``"--json"``). kind: ``"file"`` (a file written with
            :func:`atomic_write`) or ``"dir"`` (a directory files will be written into, e.g.
            ``--log-dir``, a pack directory).

    Returns:
        ``path`` as a ``pathlib.Path``.

    Raises:
        OutputError: one line naming ``flag`` and ``path``: the path is a directory (``kind``
            ``"file"``) or a file (``kind="dir"``); an ancestor is a file; the directory that
            would hold it cannot be written (read-only file system, permission denied).
        ValueError: an unknown ``kind``.
    """
    if kind not in ("file", "dir"):
        raise ValueError(f"check_output_path: kind must be 'file' or 'dir', not {kind!r}")
    path = pathlib.Path(path)
    label = _label(path, flag)
    if kind == "file" and path.is_dir():
        raise OutputError(f"{label} is a directory: give a file name", errno.EISDIR)
    if kind == "dir" and os.path.lexists(path) and not path.is_dir():
        raise OutputError(f"{label} is a file, not a directory: give a directory", errno.ENOTDIR)
    # The directory the writer will put its temporary files into.
    target_dir = path if kind == "dir" else path.parent
    existing = _nearest_existing(target_dir.absolute())
    if not existing.is_dir():
        raise OutputError(f"{label}: {existing} is a file, not a directory", errno.ENOTDIR)
    try:
        _probe_writable(existing)
    except OSError as e:
        raise OutputError(f"{label}: cannot write in {existing}: {cause(e)}", e.errno) from e
    return path


#: The lock file :func:`lock_directory` creates in a locked directory.
LOCK_FILE = ".lock"


class DirectoryInUse(ValueError):
    """A directory another live process holds the lock of (:func:`lock_directory`). ``pid`` is
    the holder's process id as it recorded it (None when unreadable)."""

    def __init__(self, message: str, pid: int | None = None):
        super().__init__(message)
        self.pid = pid


class DirectoryLock:
    """An exclusive ``fcntl.flock`` lock on ``<directory>/.lock``, held until :meth:`release` or
    the process ends (the OS drops it then, so a killed process leaves no stale lock; the file
    itself stays and is reused). Made by :func:`lock_directory`; usable as a context manager."""

    def __init__(self, directory: pathlib.Path, fd: int, created: list[pathlib.Path] | None = None):
        self.directory = directory
        self.path = directory / LOCK_FILE
        self.created = list(created or [])  # directories lock_directory made, deepest first
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        """Whether this object still holds the lock."""
        return self._fd is not None

    def release(self, cleanup: bool = False) -> None:
        """Drop the lock (idempotent). With ``cleanup``, when the directory holds nothing but the
        lock file, remove the lock file and the directories :func:`lock_directory` created, so a
        run that failed before writing anything leaves nothing behind."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                import fcntl

                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            if cleanup and self.created:
                with contextlib.suppress(OSError):
                    if [p.name for p in self.directory.iterdir()] == [LOCK_FILE]:
                        self.path.unlink()
                        for d in self.created:
                            d.rmdir()

    def __enter__(self) -> "DirectoryLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.release()


def lock_directory(directory, *, what: str = "run", hint: str = "") -> DirectoryLock:
    """Take the exclusive lock of ``directory`` (created if missing) for this process.

    The lock is ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``<directory>/.lock`` (POSIX advisory
    lock: every gpusim writer of the directory takes it; the kernel releases it when the holder
    exits or is killed). The holder writes its pid into the file so a refused process can name it.

    Args:
        directory: the directory (str or path-like). what: what holds it, for the message
            (``"run"``). hint: what to do instead, appended to the message (e.g. ``"pass another
            --run-name"``).

    Returns:
        A :class:`DirectoryLock` (release it, or use it as a context manager).

    Raises:
        DirectoryInUse: another live process holds the lock: ``"<directory> is in use by another
            <what> (pid N)[: hint]"``.
        OutputError: the directory or its lock file cannot be created.
    """
    import fcntl

    directory = pathlib.Path(directory)
    path = directory / LOCK_FILE
    created, p = [], directory.absolute()
    while not os.path.lexists(p) and p.parent != p:
        created.append(p)
        p = p.parent
    with write_errors(path):
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        try:
            text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        except OSError:
            text = ""
        os.close(fd)
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise OutputError(f"cannot lock {directory}: {cause(e)}", e.errno) from e
        pid = int(text) if text.isdigit() else None
        holder = f"pid {pid}" if pid is not None else "pid unknown"
        raise DirectoryInUse(f"{directory} is in use by another {what} ({holder})" + (f": {hint}" if hint else ""),
                             pid) from None
    with write_errors(path):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return DirectoryLock(directory, fd, created)


def torch_save(obj, path, *, flag: str | None = None) -> pathlib.Path:
    """``torch.save(obj)`` to ``path`` through :func:`atomic_write`.

    The object is serialised into memory first and then written as bytes: a write error then
    surfaces as the OS error it is (``torch.save`` writing to a full disk itself reports only
    "unexpected pos N vs M"). Costs one in-memory copy of the file.

    Raises:
        OutputError: the file cannot be written (one line naming it and the cause).
    """
    import io

    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return write_bytes(path, buf.getbuffer(), flag=flag)
