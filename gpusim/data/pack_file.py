"""Reading and writing the file of a :class:`~gpusim.data.pack.ScenarioPack`: format versions,
atomic writes, and the checks made before any tensor is built (present, not empty, recorded
size and CRC-32C, a torch file, a gpusim pack of a readable format).

A pack file is ``torch.save({"meta": dict, "tensors": {name: tensor}})``, read back with
``torch.load(weights_only=True)`` (only tensors and plain containers are unpickled).
"""

from __future__ import annotations

import io
import pathlib
import warnings

import torch

from gpusim.data.errors import PackFileError
from gpusim.data.integrity import bytes_crc32c

#: 2 added agent_interest/agent_predict and the signal tensors; version-1 packs still load (no signals).
#: 3: compact grid tables (int16, cells of all scenarios concatenated, ``grid_start``); versions 1
#: and 2 (padded int32 tables) still load and are compacted on load.
#: 4: CRC-32C checksums of every tensor and of the meta (``meta["checksums"]``,
#: :mod:`gpusim.data.integrity`), verified on load; versions 1 to 3 load with a note to reconvert.
FORMAT_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)
#: Keys already noted by :func:`note_once`.
_NOTED: set[str] = set()


def note_once(key: str, text: str, stacklevel: int = 2) -> None:
    """``warnings.warn(text)`` (a ``UserWarning``) the first time ``key`` is noted in this process:
    a file or a dataset directory written before checksums is noted once, not at every load."""
    if key in _NOTED:
        return
    _NOTED.add(key)
    warnings.warn(text, stacklevel=stacklevel + 1)


def atomic_torch_save(obj, path: pathlib.Path) -> None:
    """``torch.save(obj, path)`` through the atomic writer (:func:`gpusim.fileio.torch_save`: a
    temporary file in the same directory, then a rename; a reader sees the old file or the new
    one, never a partial one).

    Raises:
        OutputError: the file cannot be written (one line naming it and the cause).
    """
    from gpusim.fileio import torch_save

    torch_save(obj, path)


def read_payload(file: pathlib.Path, verify: bool, expect_crc32c: int | None, expect_bytes: int | None) -> dict:
    """``torch.load`` of a pack file with the checks that need no tensor: present, not empty,
    the recorded size and CRC-32C (when given and ``verify``), a torch file, a gpusim pack of a
    readable format. Raises FileNotFoundError / PackFileError (see :meth:`gpusim.data.pack.ScenarioPack.load`)."""
    if not file.exists():
        raise FileNotFoundError(f"no scenario pack at {file}")
    again = "convert the data again (python -m gpusim.data convert ...)"
    size = file.stat().st_size
    if size == 0:
        raise PackFileError(file, "", f"empty file; {again}")
    if expect_bytes is not None and size != expect_bytes:
        raise PackFileError(file, "", f"{size} bytes where the index records {expect_bytes} (truncated or "
                                      f"replaced); {again}")
    source = file
    if verify and expect_crc32c is not None:
        data = file.read_bytes()
        if bytes_crc32c(data) != expect_crc32c:
            raise PackFileError(file, "", f"checksum mismatch with the index: the file is corrupt or from "
                                          f"another conversion; {again}")
        source = io.BytesIO(data)
    try:
        payload = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for corrupt files (zip, pickle, EOF, ...)
        # torch's own text is multi-line and, for random bytes, advises weights_only=False
        # (unsafe): only the exception type is kept.
        raise PackFileError(file, "", f"truncated or not a scenario pack ({type(exc).__name__} from "
                                      f"torch.load); {again}") from None
    if not (isinstance(payload, dict) and isinstance(payload.get("meta"), dict)
            and isinstance(payload.get("tensors"), dict)):
        raise PackFileError(file, "", f"not a gpusim scenario pack (no meta/tensors); {again}")
    version = payload["meta"].get("format_version")
    if version not in READABLE_VERSIONS:
        raise PackFileError(file, "", f"pack format {version} is not one of {READABLE_VERSIONS}; {again}")
    return payload
