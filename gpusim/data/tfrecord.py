"""TFRecord framing without TensorFlow: read and write records, verifying both checksums.

A TFRecord file is a sequence of records, each framed as (all little-endian):

    uint64 length | uint32 masked_crc32c(length bytes) | payload (length bytes) | uint32 masked_crc32c(payload)

The checksum is CRC-32C (Castagnoli), masked as TensorFlow does (``tensorflow/core/lib/hash/
crc32c.h``, described here in our own words): rotate the 32-bit CRC right by 15 bits and add the
constant ``0xA282EAD8`` modulo 2^32. Files may be gzip-compressed as a whole (detected from the
gzip magic bytes, whatever the name). CRC-32C itself comes from the ``crc32c`` package.

Records are streamed one at a time, so memory stays bounded by the largest record.
"""

from __future__ import annotations

import contextlib
import gzip
import pathlib
import re
import struct
from collections.abc import Iterator

from gpusim.data.errors import ScenarioError

_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
#: Refuse records larger than this (a corrupt length field would otherwise ask for terabytes).
MAX_RECORD_BYTES = 1 << 31


_TFRECORD_NAME = re.compile(r"\.tfrecord(\.gz)?$|\.tfrecord-\d+(-of-\d+)?(\.gz)?$", re.IGNORECASE)


def is_tfrecord_file(path) -> bool:
    """True for ``*.tfrecord``, ``*.tfrecord.gz`` and shards ``*.tfrecord-NNNNN[-of-NNNNN][.gz]``
    (JSON names such as ``tfrecord-00001-of-01000_307.json.xz`` are not TFRecords)."""
    name = pathlib.Path(path).name
    return not name.lower().endswith((".json", ".json.gz", ".json.xz")) and _TFRECORD_NAME.search(name) is not None


def _crc32c():
    try:
        import crc32c
    except ImportError:  # pragma: no cover - crc32c is a declared dependency
        raise ImportError("reading TFRecord files needs the 'crc32c' package: pip install crc32c") from None
    return crc32c.crc32c


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC-32C of ``data`` (uint32)."""
    crc = _crc32c()(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def is_gzip(path) -> bool:
    """True if the file starts with the gzip magic bytes."""
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


class _Reader:
    """Opens a (possibly gzipped) file; ``pos()`` is the offset in the file on disk (for progress)."""

    def __init__(self, path):
        self.raw = open(path, "rb")
        self.fh = gzip.GzipFile(fileobj=self.raw, mode="rb") if is_gzip(path) else self.raw

    def read(self, n: int) -> bytes:
        try:
            return self.fh.read(n)
        except (EOFError, OSError, gzip.BadGzipFile) as exc:
            raise _Broken(f"cannot decompress ({type(exc).__name__}: {exc})") from None

    def pos(self) -> int:
        return self.raw.tell()

    def close(self):
        self.fh.close()
        self.raw.close()


class _Broken(Exception):
    pass


def iter_records(path, *, positions: bool = False) -> Iterator:
    """Yield the records of a TFRecord file in order, verifying both CRCs.

    Args:
        path: a TFRecord file, plain or gzip-compressed.
        positions: also yield the reader's byte offset in the file on disk (for progress bars).

    Yields:
        ``(index, payload_or_error)`` — or ``(index, payload_or_error, offset)`` with
        ``positions`` — where ``payload_or_error`` is the record's ``bytes``, or a
        :class:`ScenarioError` (field ``record[index]``) for a record that cannot be used. A bad
        payload CRC skips only that record; a truncated record, a bad length CRC, an impossible
        length or a decompression error ends the file (the framing after it cannot be trusted).

    Raises:
        ScenarioError: (field ``""``) if the file cannot be opened.
    """
    path = str(path)
    try:
        reader = _Reader(path)
    except OSError as exc:
        raise ScenarioError(path, "", f"cannot open ({exc.strerror or exc})") from None
    index = 0

    def out(item):
        return (index, item, reader.pos()) if positions else (index, item)

    try:
        while True:
            fld = f"record[{index}]"
            try:
                head = reader.read(_HEADER.size)
                if not head:
                    return
                if len(head) < _HEADER.size:
                    yield out(ScenarioError(path, fld, f"truncated record header ({len(head)} of 12 bytes)"))
                    return
                length, length_crc = _HEADER.unpack(head)
                if masked_crc(head[:8]) != length_crc:
                    yield out(ScenarioError(path, fld, "bad CRC of the record length (corrupt file)"))
                    return
                if length > MAX_RECORD_BYTES:
                    yield out(ScenarioError(path, fld, f"record length {length} bytes is implausible"))
                    return
                payload = reader.read(length)
                foot = reader.read(_FOOTER.size)
            except _Broken as exc:
                yield out(ScenarioError(path, fld, str(exc)))
                return
            if len(payload) < length or len(foot) < _FOOTER.size:
                yield out(ScenarioError(path, fld, f"truncated record ({len(payload)} of {length} payload bytes)"))
                return
            if masked_crc(payload) != _FOOTER.unpack(foot)[0]:
                yield out(ScenarioError(path, fld, "bad CRC of the record data (corrupt record skipped)"))
            else:
                yield out(payload)
            index += 1
    finally:
        reader.close()


def encode_record(payload: bytes) -> bytes:
    """One framed record (header, payload, footer)."""
    head = struct.pack("<Q", len(payload))
    return head + _FOOTER.pack(masked_crc(head)) + payload + _FOOTER.pack(masked_crc(payload))


def write_records(path, payloads, *, compress: bool = False, flag: str | None = None) -> pathlib.Path:
    """Write ``payloads`` (an iterable of ``bytes``) as a TFRecord file, gzip-compressed if
    ``compress``, through the atomic writer (:func:`gpusim.fileio.atomic_write`). Returns the path.

    Raises:
        OutputError: the file cannot be written (one line naming it, and ``flag`` if given, and
            the cause).
    """
    from gpusim.fileio import atomic_write

    path = pathlib.Path(path)
    with atomic_write(path, "wb", flag=flag) as raw:
        with (gzip.GzipFile(fileobj=raw, mode="wb") if compress else contextlib.nullcontext(raw)) as fh:
            for p in payloads:
                fh.write(encode_record(bytes(p)))
    return path
