"""FileKVStore: the storage tier of the hierarchical cache, one file per K/V block.

Layout: `<dir>/<fingerprint hex>/<key hex>.kv`, each file a fixed header (magic, format
version, fingerprint, key, payload length, crc32 of the payload) and the payload. Writes
go to a temporary name in the same directory and are renamed into place, so a reader sees
a whole file or none. A file whose header, length or checksum is wrong, or that names
another fingerprint or key, is deleted and never loaded. The index (key -> size, in LRU
order) is rebuilt from the directory at start; past `capacity_bytes` the least recently
used files are deleted. One server per fingerprint directory: an flock on `<fp>/lock`,
held for the store's life, makes a second server on the same directory and configuration
fail at start (configurations differ in fingerprint, so they never share files).
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import threading
import zlib
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

logger = logging.getLogger(__name__)

MAGIC = b"RXKV"
_HEADER = struct.Struct("<4sI16s16sQI")  # magic, version, fingerprint, key, length, crc32
HEADER_BYTES = _HEADER.size


class StorageDirLocked(RuntimeError):
    pass


class FileKVStore:
    name = "storage"

    def __init__(self, root: str | os.PathLike, fingerprint: bytes, block_bytes: int,
                 capacity_bytes: int, format_version: int) -> None:
        self.fingerprint = fingerprint
        self.version = format_version
        self.block_bytes = block_bytes
        self.capacity_bytes = capacity_bytes
        self.dir = Path(root) / fingerprint.hex()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise StorageDirLocked(
                f"--hicache-storage-dir {root}: {self.dir.name} is in use by another radixlm "
                "server with the same model and KV layout (one server per directory and "
                "configuration); give this one another directory") from None
        self._mu = threading.Lock()
        self._index: OrderedDict[bytes, int] = OrderedDict()  # key -> file bytes, LRU first
        self._bytes = 0
        self.deleted_bad = 0  # files found bad (header, length, checksum) and deleted
        self._scan()

    # --- files --------------------------------------------------------------------------

    def _path(self, key: bytes) -> Path:
        return self.dir / f"{key.hex()}.kv"

    def _scan(self) -> None:
        """Rebuild the index from the directory (oldest mtime first); drop leftovers of
        interrupted writes and files whose header or length is wrong."""
        entries = []
        expected = HEADER_BYTES + self.block_bytes
        for f in self.dir.iterdir():
            if f.name == "lock":
                continue
            if not f.name.endswith(".kv") or len(f.name) != 35:
                self._unlink(f)  # a temporary file of a write cut short, or junk
                continue
            try:
                st = f.stat()
                key = bytes.fromhex(f.name[:32])
                with open(f, "rb") as fh:
                    header = fh.read(HEADER_BYTES)
            except (OSError, ValueError):
                self._unlink(f)
                continue
            if st.st_size != expected or not self._header_ok(header, key):
                self.deleted_bad += 1
                self._unlink(f)
                continue
            entries.append((st.st_mtime_ns, key, st.st_size))
        for _, key, size in sorted(entries):
            self._index[key] = size
            self._bytes += size
        if entries:
            logger.info("hicache storage %s: %d blocks (%.1f MB) from an earlier run",
                        self.dir, len(entries), self._bytes / 1e6)
        self._shrink()

    def _header_ok(self, header: bytes, key: bytes, crc: int | None = None) -> bool:
        if len(header) != HEADER_BYTES:
            return False
        magic, version, fp, k, length, _ = _HEADER.unpack(header)
        return (magic == MAGIC and version == self.version and fp == self.fingerprint
                and k == key and length == self.block_bytes)

    @staticmethod
    def _unlink(f: Path) -> None:
        try:
            f.unlink()
        except OSError:
            pass

    def _shrink(self) -> None:
        """Delete least recently used files until within capacity (caller holds _mu or
        is the constructor)."""
        while self._bytes > self.capacity_bytes and self._index:
            key, size = self._index.popitem(last=False)
            self._bytes -= size
            self._unlink(self._path(key))

    # --- the KVTier interface ---------------------------------------------------------

    def contains(self, key: bytes) -> bool:
        with self._mu:
            return key in self._index

    def get(self, key: bytes) -> torch.Tensor | None:
        """The block's bytes, checked; None (and the file deleted) if missing or bad."""
        path = self._path(key)
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except OSError:
            self._forget(key, delete=False)
            return None
        ok = len(raw) == HEADER_BYTES + self.block_bytes and self._header_ok(raw[:HEADER_BYTES], key)
        if ok:
            crc = _HEADER.unpack(raw[:HEADER_BYTES])[5]
            ok = zlib.crc32(memoryview(raw)[HEADER_BYTES:]) == crc
        if not ok:
            logger.warning("hicache storage: %s is truncated, corrupted or foreign; deleted",
                           path.name)
            self.deleted_bad += 1
            self._forget(key, delete=True)
            return None
        with self._mu:
            if key in self._index:
                self._index.move_to_end(key)
        return torch.frombuffer(bytearray(raw[HEADER_BYTES:]), dtype=torch.uint8)

    def put(self, key: bytes, data: torch.Tensor) -> bool:
        """Write one block (uint8 CPU tensor of block_bytes); False if it could not."""
        if data.numel() != self.block_bytes:
            raise ValueError(f"block of {data.numel()} bytes, expected {self.block_bytes}")
        payload = memoryview(np.ascontiguousarray(data.numpy()))
        header = _HEADER.pack(MAGIC, self.version, self.fingerprint, key, self.block_bytes,
                              zlib.crc32(payload))
        path = self._path(key)
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}.{threading.get_ident()}")
        try:
            with open(tmp, "wb") as fh:
                fh.write(header)
                fh.write(payload)
            os.replace(tmp, path)
        except OSError as e:
            logger.warning("hicache storage: cannot write %s: %s", path, e)
            self._unlink(tmp)
            return False
        with self._mu:
            if key not in self._index:
                self._bytes += HEADER_BYTES + self.block_bytes
            self._index[key] = HEADER_BYTES + self.block_bytes
            self._index.move_to_end(key)
            self._shrink()
        return True

    def _forget(self, key: bytes, delete: bool) -> None:
        with self._mu:
            size = self._index.pop(key, None)
            if size is not None:
                self._bytes -= size
        if delete:
            self._unlink(self._path(key))

    def clear(self) -> None:
        with self._mu:
            keys = list(self._index)
            self._index.clear()
            self._bytes = 0
        for key in keys:
            self._unlink(self._path(key))

    def num_blocks(self) -> int:
        with self._mu:
            return len(self._index)

    def size_bytes(self) -> int:
        with self._mu:
            return self._bytes

    def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1
