"""KVFingerprint: everything that changes the bytes of a token's K/V, hashed; and the
storage keys of a token sequence's blocks (a hash chain prefixed by the fingerprint).

Invariant: two configurations that could produce different K/V bytes for the same token
ids have different fingerprints, so a storage key never names another model's, dtype's,
layout's, page size's, RoPE's or TP rank's K/V. The weights' content hash (sha256 of the
GGUF file, or of an HF directory's weight files) is cached per (path, size, mtime) under
the radixlm cache dir: a restart does not reread the weights to hash them.
Block i's key = blake2b(key of block i-1 || token ids of block i), block -1's = the
fingerprint: a key names the whole prefix up to its block, never a block alone.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

# Bump when the storage file layout or the meaning of its bytes changes.
KV_FORMAT_VERSION = 1
_WEIGHT_SUFFIXES = (".gguf", ".safetensors", ".bin", ".pt")


@dataclass(frozen=True)
class KVFingerprint:
    weights_sha256: str
    kv_dtype: str
    num_layers: int
    kv_heads: int  # this rank's
    head_dim: int
    page_size: int
    block_tokens: int
    rope: str  # json of theta, scaling, local theta, per-frequency factors
    tp_rank: int
    tp_size: int
    format_version: int = KV_FORMAT_VERSION

    def digest(self) -> bytes:
        """16 bytes naming this configuration (the storage keys' prefix)."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.blake2b(blob, digest_size=16).digest()


def rope_signature(cfg) -> str:
    """The RoPE settings of a ModelConfig as a stable string."""
    return json.dumps({"theta": cfg.rope_theta, "scaling": cfg.rope_scaling,
                       "local_theta": getattr(cfg, "rope_local_theta", None),
                       "freq_factors": getattr(cfg, "rope_freq_factors", None)},
                      sort_keys=True, default=str)


def _weight_files(model_path: str) -> list[Path]:
    p = Path(model_path)
    if p.is_file():
        return [p]
    return sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(_WEIGHT_SUFFIXES))


def weights_sha256(model_path: str, cache_dir: Path) -> str:
    """sha256 over the model's weight files (name, size, bytes), cached by path, size and
    mtime of each file in `cache_dir/weights_sha256.json`."""
    files = _weight_files(model_path)
    stamp = [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]
    stamp_key = hashlib.sha256(json.dumps(stamp).encode()).hexdigest()
    cache_file = cache_dir / "weights_sha256.json"
    try:
        cached = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cached = {}
    if isinstance(cached, dict) and isinstance(cached.get(stamp_key), str):
        return cached[stamp_key]
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}:{f.stat().st_size}\n".encode())
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
    digest = h.hexdigest()
    cached = cached if isinstance(cached, dict) else {}
    cached[stamp_key] = digest
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(cached))
        os.replace(tmp, cache_file)
    except OSError:
        pass  # no cache: hashed again at the next start
    return digest


def block_keys(fingerprint: bytes, tokens: list[int], block_tokens: int,
               first: int = 0, prev: bytes | None = None) -> list[bytes]:
    """Keys of the whole blocks of `tokens` from block `first` on; `prev` is the key of
    block first-1 (the fingerprint for first == 0; else computed from the start)."""
    n = len(tokens) // block_tokens
    arr = np.asarray(tokens[:n * block_tokens], dtype=np.int64).reshape(n, block_tokens) \
        if n else np.zeros((0, block_tokens), dtype=np.int64)
    key = fingerprint
    start = 0
    if prev is not None:
        key, start = prev, first
    out: list[bytes] = []
    for i in range(start, n):
        key = hashlib.blake2b(key + arr[i].tobytes(), digest_size=16).digest()
        if i >= first:
            out.append(key)
    return out


@dataclass
class BlockKeyChain:
    """The keys of one token sequence's whole blocks, kept between calls (a deferred load's
    retries): blocks whose tokens are unchanged keep their keys, only new or changed ones
    are hashed, so every retry names the blocks exactly as the first call did."""
    fingerprint: bytes
    block_tokens: int
    tokens: list[int] = field(default_factory=list)
    keys: list[bytes] = field(default_factory=list)

    def keys_of(self, tokens: list[int]) -> list[bytes]:
        """block_keys(fingerprint, tokens, block_tokens), reusing the common prefix."""
        b = self.block_tokens
        n = len(tokens) // b
        same = 0
        while (same < min(n, len(self.keys))
               and self.tokens[same * b:(same + 1) * b] == tokens[same * b:(same + 1) * b]):
            same += 1
        if same < n:
            new = block_keys(self.fingerprint, tokens[:n * b], b, first=same,
                             prev=self.keys[same - 1] if same else None)
            self.keys = self.keys[:same] + new
            self.tokens = list(tokens[:n * b])
        return self.keys[:n]
