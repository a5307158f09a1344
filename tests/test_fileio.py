"""gpusim.fileio: the atomic writer, the output-path check and the one-line write errors."""

from __future__ import annotations

import errno
import os

import pytest

from gpusim import fileio
from gpusim.fileio import OutputError, atomic_write, check_output_path


def _leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_atomic_write_text_and_bytes(tmp_path):
    target = tmp_path / "sub" / "report.json"   # the parent is created
    with atomic_write(target) as f:
        f.write('{"a": 1}')
    assert target.read_text() == '{"a": 1}'
    fileio.write_bytes(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    assert _leftovers(target.parent) == []


def test_failed_write_keeps_the_previous_file_and_removes_the_temporary(tmp_path):
    target = tmp_path / "export.binproto"
    target.write_bytes(b"previous good file")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_write(target, "wb") as f:
            f.write(b"half of the new")
            raise RuntimeError("boom")
    assert target.read_bytes() == b"previous good file"
    assert _leftovers(tmp_path) == []


def test_full_disk_is_one_line_naming_file_and_cause(tmp_path):
    target = tmp_path / "export.binproto"
    target.write_bytes(b"previous good file")
    with pytest.raises(OutputError) as info:
        with atomic_write(target, "wb", flag="--out") as f:
            f.write(b"partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    msg = str(info.value)
    assert msg == f"cannot write --out {target}: no space left on device"
    assert "\n" not in msg and info.value.errno == errno.ENOSPC
    assert target.read_bytes() == b"previous good file"
    assert _leftovers(tmp_path) == []


def test_a_directory_at_the_target_is_refused(tmp_path):
    (tmp_path / "out.json").mkdir()
    with pytest.raises(OutputError, match="is a directory"):
        fileio.write_text(tmp_path / "out.json", "x")
    assert _leftovers(tmp_path) == []


def test_write_errors_wraps_only_os_errors(tmp_path):
    with pytest.raises(OutputError, match=r"cannot write --out .*pic.png: read-only file system"):
        with fileio.write_errors(tmp_path / "pic.png", "--out"):
            raise OSError(errno.EROFS, "Read-only file system")
    with pytest.raises(KeyError):
        with fileio.write_errors(tmp_path / "pic.png", "--out"):
            raise KeyError("not an OS error")


def test_check_output_path_file(tmp_path):
    assert check_output_path(tmp_path / "new" / "deeper" / "a.json", "--json") == tmp_path / "new" / "deeper" / "a.json"
    assert not (tmp_path / "new").exists()          # nothing created
    with pytest.raises(OutputError, match=r"^--json .* is a directory: give a file name$"):
        check_output_path(tmp_path, "--json")
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(OutputError, match=r"^--json .*afile/x/out.json: .*afile is a file, not a directory$"):
        check_output_path(afile / "x" / "out.json", "--json")


def test_check_output_path_dir(tmp_path):
    assert check_output_path(tmp_path / "runs" / "x", "--log-dir", kind="dir") == tmp_path / "runs" / "x"
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(OutputError, match=r"^--log-dir .*afile is a file, not a directory: give a directory$"):
        check_output_path(afile, "--log-dir", kind="dir")
    with pytest.raises(OutputError, match="is a file, not a directory"):
        check_output_path(afile / "run", "--log-dir", kind="dir")


def test_check_output_path_read_only(tmp_path, monkeypatch):
    """A read-only file system (simulated: the root user passes any permission test) is named."""
    def refuse(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(fileio.tempfile, "mkstemp", refuse)
    with pytest.raises(OutputError, match=r"^--out .*x.binproto: cannot write in .*: read-only file system$"):
        check_output_path(tmp_path / "x.binproto", "--out")


def test_bad_arguments():
    with pytest.raises(ValueError, match="mode"):
        with atomic_write("x", "a"):
            pass
    with pytest.raises(ValueError, match="kind"):
        check_output_path("x", "--out", kind="socket")


def test_atomic_path_for_writers_that_need_a_name(tmp_path):
    target = tmp_path / "v.mp4"
    target.write_bytes(b"old")
    with fileio.atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".mp4" and tmp != target
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new"
    with pytest.raises(RuntimeError):
        with fileio.atomic_path(target) as tmp:
            tmp.write_bytes(b"partial")
            raise RuntimeError("encoder died")
    assert target.read_bytes() == b"new" and _leftovers(tmp_path) == [] and len(list(tmp_path.iterdir())) == 1
    with pytest.raises(OutputError, match="produced no file"):
        with fileio.atomic_path(target) as tmp:
            tmp.unlink()
    assert target.read_bytes() == b"new"


def test_lock_directory_is_exclusive_and_cleans_up(tmp_path):
    run = tmp_path / "runs" / "x"
    lock = fileio.lock_directory(run)
    assert (run / fileio.LOCK_FILE).read_text().strip() == str(os.getpid())
    with pytest.raises(fileio.DirectoryInUse, match=rf"^{run} is in use by another run \(pid {os.getpid()}\)$") as e:
        fileio.lock_directory(run)  # a second open file: flock refuses it even in one process
    assert e.value.pid == os.getpid()
    lock.release(cleanup=True)  # nothing but the lock file in it: the directories it made go
    assert not (tmp_path / "runs").exists()
    with fileio.lock_directory(run) as again:
        (run / "metrics.jsonl").write_text("x")
        assert again.held
    assert not again.held and (run / "metrics.jsonl").exists()
