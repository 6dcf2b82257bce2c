"""MCAP recordings of the published wire messages (docs/RECORDING.md; docs/ARCHITECTURE.md Sec. 4.3).

One MCAP channel per topic (``state``, ``force``, ``stats``, ``event``), message_encoding ``msgpack``, no schema
(schema id 0; the payload format is documented in :mod:`suturesim.server.protocol` and every payload carries its
schema version ``v``). Each message's data is exactly the published payload, so a recording can be replayed byte
for byte. Config and versions go in as MCAP metadata records.

Crash safety: messages are grouped in zstd chunks of at most ``chunk_size`` bytes, and the chunk in progress is
closed and the file flushed to the OS at least every ``flush_interval`` seconds (by :meth:`McapRecorder.write`
and, when the writer is idle, by a background thread). A process killed with SIGKILL therefore leaves a file
that is a valid MCAP prefix missing only its last ``flush_interval`` seconds and the summary section.
:func:`read_messages` and :func:`read_metadata` read such truncated files: they walk the data section record by
record and stop cleanly at the first incomplete record.
"""

from __future__ import annotations

import heapq
import io
import os
import struct
import threading
import time
from typing import IO, Iterator, Mapping

from mcap.data_stream import ReadDataStream
from mcap.opcode import Opcode
from mcap.records import Channel, Chunk, Message, Metadata
from mcap.stream_reader import breakup_chunk
from mcap.writer import LIBRARY_IDENTIFIER, CompressionType, Writer

__all__ = ["McapRecorder", "read_messages", "read_metadata", "RecordingError", "MESSAGE_ENCODING"]

MESSAGE_ENCODING = "msgpack"
_MAGIC = b"\x89MCAP0\r\n"
_RECORD_HEADER = struct.Struct("<BQ")
# Sanity bound on a single record while reading (a chunk is ~chunk_size; a message is capped at 16 MiB).
_RECORD_SIZE_LIMIT = 1 << 30


class RecordingError(ValueError):
    """The file is not an MCAP recording, or a complete record in it is corrupt."""


def _library_id() -> str:
    try:
        from importlib.metadata import version
        ours = f"suturesim/{version('suturesim')}"
    except Exception:  # pragma: no cover - not installed
        ours = "suturesim"
    return f"{ours}; {LIBRARY_IDENTIFIER}"


class McapRecorder:
    """Write published messages to an MCAP file.

    :param path: output file (created/truncated, or created only: ``exclusive``).
    :param metadata: ``{name: {key: value}}`` MCAP metadata records written at the start (e.g. ``config``,
        ``versions``); values must be strings.
    :param profile: MCAP header profile.
    :param chunk_size: uncompressed chunk size (bytes) at which a chunk is closed regardless of time.
    :param flush_interval: maximum wall time (s) that a written message may stay in memory; bounds what a
        SIGKILL can lose.
    :param compression: ``"zstd"``, ``"lz4"`` or ``"none"``.
    :param fsync: also ``os.fsync`` on each periodic flush (survives power loss, not only process death).
    :param background_flush: run a daemon thread that flushes while no messages arrive; without it flushing
        happens only inside :meth:`write`.
    :param exclusive: create the file, never open an existing one or follow a symlink (FileExistsError, or
        OSError ELOOP): a recording a client asked for (server/files.py).

    Thread-safe; usable as a context manager. :meth:`close` is idempotent.
    """

    def __init__(self, path: str | os.PathLike, metadata: Mapping[str, Mapping[str, str]] | None = None,
                 profile: str = "suturesim", *, chunk_size: int = 256 * 1024, flush_interval: float = 0.5,
                 compression: str = "zstd", fsync: bool = False, background_flush: bool = True,
                 exclusive: bool = False):
        comp = {"zstd": CompressionType.ZSTD, "lz4": CompressionType.LZ4, "none": CompressionType.NONE}
        if compression not in comp:
            raise ValueError(f"compression must be one of {sorted(comp)}, got {compression!r}")
        if flush_interval <= 0:
            raise ValueError("flush_interval must be > 0")
        self.path = os.fspath(path)
        if exclusive:   # a new file only: never an existing one, nor anything through a symlink
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
            self._file: IO[bytes] = os.fdopen(fd, "wb")
        else:
            self._file = open(self.path, "wb")
        self._writer = Writer(self._file, chunk_size=chunk_size, compression=comp[compression])
        self._lock = threading.Lock()
        self._channels: dict[str, int] = {}
        self._flush_interval = float(flush_interval)
        self._fsync = fsync
        self._dirty = False
        self._closed = False
        self.message_count = 0
        self.error: OSError | None = None   # what the background flush met (a full disk), raised by write
        self._writer.start(profile=profile, library=_library_id())
        for name, data in (metadata or {}).items():
            self._add_metadata_locked(name, data)
        self._file.flush()
        self._last_flush = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if background_flush:
            self._thread = threading.Thread(target=self._flush_loop, name="mcap-flush", daemon=True)
            self._thread.start()

    # -- writing ----------------------------------------------------------------------------------------------

    def write(self, topic: bytes | str, payload: bytes, log_time_ns: int, publish_time_ns: int | None = None,
              sequence: int = 0) -> None:
        """Record one message; ``payload`` is stored byte for byte. Times are integer nanoseconds."""
        name = topic.decode("utf-8") if isinstance(topic, (bytes, bytearray, memoryview)) else str(topic)
        if not isinstance(payload, bytes):
            payload = bytes(payload)
        log_time_ns = int(log_time_ns)
        publish_time_ns = log_time_ns if publish_time_ns is None else int(publish_time_ns)
        with self._lock:
            if self._closed:
                raise ValueError("write to a closed McapRecorder")
            if self.error is not None:
                raise self.error
            channel_id = self._channels.get(name)
            if channel_id is None:
                channel_id = self._writer.register_channel(
                    topic=name, message_encoding=MESSAGE_ENCODING, schema_id=0)
                self._channels[name] = channel_id
            self._writer.add_message(channel_id=channel_id, log_time=log_time_ns, data=payload,
                                     publish_time=publish_time_ns, sequence=int(sequence) & 0xFFFFFFFF)
            self.message_count += 1
            self._dirty = True
            if time.monotonic() - self._last_flush >= self._flush_interval:
                self._flush_locked()

    def add_metadata(self, name: str, data: Mapping[str, str]) -> None:
        """Add an MCAP metadata record ``name`` with string key/value pairs (written to disk immediately)."""
        with self._lock:
            if self._closed:
                raise ValueError("add_metadata on a closed McapRecorder")
            self._add_metadata_locked(name, data)
            self._file.flush()

    def flush(self) -> None:
        """Close the chunk in progress and flush everything to the OS now."""
        with self._lock:
            if not self._closed:
                self._flush_locked()

    def close(self) -> None:
        """Write the summary section and close the file. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            try:
                self._writer.finish()
                self._file.flush()
                if self._fsync:
                    os.fsync(self._file.fileno())
            finally:
                self._file.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> McapRecorder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------------------------

    def _add_metadata_locked(self, name: str, data: Mapping[str, str]) -> None:
        if not isinstance(name, str):
            raise TypeError(f"metadata name must be str, got {type(name).__name__}")
        items = {}
        for k, v in data.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"metadata {name!r}: keys and values must be str, got {k!r}: {v!r}")
            items[k] = v
        self._writer.add_metadata(name, items)

    def _flush_locked(self) -> None:
        self._writer.flush()  # finalizes the open chunk (if it has messages) and flushes the file object
        if self._fsync:
            os.fsync(self._file.fileno())
        self._dirty = False
        self._last_flush = time.monotonic()

    def _flush_loop(self) -> None:
        period = self._flush_interval / 4
        while not self._stop.wait(period):
            with self._lock:
                if (not self._closed and self._dirty
                        and time.monotonic() - self._last_flush >= self._flush_interval):
                    try:
                        self._flush_locked()
                    except OSError as exc:   # a full disk: the next write raises it to the recorder
                        self.error = exc
                        return


# -- reading -------------------------------------------------------------------------------------------------


def _scan(f: IO[bytes], path) -> list[tuple[int, int, int]]:
    """``(opcode, body_offset, body_length)`` of every complete record in the data section.

    Stops at DataEnd/Footer, or silently at an incomplete record at the end of a truncated file (the writer was
    killed while or before writing it). Only record headers are read.
    """
    size = os.fstat(f.fileno()).st_size  # a file still being written is read up to this point
    f.seek(0)
    magic = f.read(len(_MAGIC))
    if magic != _MAGIC[:len(magic)]:
        raise RecordingError(f"{os.fspath(path)}: not an MCAP file (bad magic)")
    out: list[tuple[int, int, int]] = []
    if len(magic) < len(_MAGIC):
        return out  # killed before the magic was complete: an empty recording
    pos = len(_MAGIC)
    while pos + _RECORD_HEADER.size <= size:
        f.seek(pos)
        opcode, length = _RECORD_HEADER.unpack(f.read(_RECORD_HEADER.size))
        if opcode in (Opcode.DATA_END, Opcode.FOOTER):
            break
        end = pos + _RECORD_HEADER.size + length
        if end > size:
            break
        if length > _RECORD_SIZE_LIMIT:
            raise RecordingError(f"{os.fspath(path)}: record at offset {pos} claims {length} bytes")
        out.append((opcode, pos + _RECORD_HEADER.size, length))
        pos = end
    return out


def _read_body(f: IO[bytes], offset: int, length: int, path) -> bytes:
    f.seek(offset)
    body = f.read(length)
    if len(body) != length:
        raise RecordingError(f"{os.fspath(path)}: short read at offset {offset}")
    return body


def _parse(cls, opcode: int, body: bytes, path) -> object:
    try:
        stream = ReadDataStream(io.BytesIO(body))
        return cls.read(stream, len(body)) if cls is Message else cls.read(stream)
    except Exception as exc:
        raise RecordingError(f"{os.fspath(path)}: corrupt {Opcode(opcode).name} record: {exc}") from exc


_U64 = struct.Struct("<Q")


def read_messages(path: str | os.PathLike) -> Iterator[tuple[str, bytes, int, int]]:
    """Iterate ``(topic, payload, log_time_ns, publish_time_ns)`` in log-time order (file order among equal
    log times).

    Works on complete files and on files truncated by a killed writer (everything up to the last complete
    chunk is returned). Streams chunk by chunk: when log times increase through the file, memory stays about
    one chunk. Raises :class:`RecordingError` if the file is not MCAP or a complete record is corrupt.
    """
    with open(path, "rb") as f:
        units = [u for u in _scan(f, path) if u[0] in (Opcode.CHUNK, Opcode.MESSAGE, Opcode.CHANNEL)]
        # earliest log time in each record (chunk: message_start_time; message: its log_time), then the
        # earliest log time still to come from record i onwards
        inf = float("inf")
        starts = []
        for opcode, offset, length in units:
            if opcode == Opcode.CHUNK and length >= 8:
                starts.append(_U64.unpack(_read_body(f, offset, 8, path))[0])
            elif opcode == Opcode.MESSAGE and length >= 22:
                starts.append(_U64.unpack(_read_body(f, offset + 6, 8, path))[0])
            else:
                starts.append(inf)
        future_min = starts + [inf]
        for i in range(len(units) - 1, -1, -1):
            future_min[i] = min(starts[i], future_min[i + 1])

        topics: dict[int, str] = {}
        heap: list[tuple[int, int, str, bytes, int]] = []
        order = 0
        for i, (opcode, offset, length) in enumerate(units):
            body = _read_body(f, offset, length, path)
            if opcode == Opcode.CHUNK:
                chunk = _parse(Chunk, opcode, body, path)
                try:
                    records = breakup_chunk(chunk, validate_crc=True)
                except Exception as exc:
                    raise RecordingError(f"{os.fspath(path)}: corrupt chunk at offset {offset}: {exc}") from exc
            else:
                records = [_parse(Channel if opcode == Opcode.CHANNEL else Message, opcode, body, path)]
            for rec in records:
                if isinstance(rec, Channel):
                    topics[rec.id] = rec.topic
                elif isinstance(rec, Message):
                    topic = topics.get(rec.channel_id)
                    if topic is None:
                        raise RecordingError(f"{os.fspath(path)}: message on unknown channel {rec.channel_id}")
                    heapq.heappush(heap, (rec.log_time, order, topic, rec.data, rec.publish_time))
                    order += 1
            # nothing later in the file is earlier than future_min[i + 1]; ties keep file order
            upto = future_min[i + 1]
            while heap and heap[0][0] <= upto:
                log_time, _, topic, data, publish_time = heapq.heappop(heap)
                yield topic, data, log_time, publish_time


def read_metadata(path: str | os.PathLike) -> dict[str, dict[str, str]]:
    """All metadata records as ``{name: {key: value}}`` (a later record with the same name wins).

    Works on truncated files too.
    """
    out: dict[str, dict[str, str]] = {}
    with open(path, "rb") as f:
        for opcode, offset, length in _scan(f, path):
            if opcode == Opcode.METADATA:
                md = _parse(Metadata, opcode, _read_body(f, offset, length, path), path)
                out[md.name] = dict(md.metadata)
    return out
