"""Byte sizes as people write them ("24GiB", "80GB", "512M") and back."""

from __future__ import annotations

import re

# Binary units (KiB, MiB, GiB, TiB; also K, M, G, T as llama.cpp/Docker use them) and
# decimal units (KB, MB, GB, TB: device vendors quote GPUs in these, e.g. "H100 80GB").
_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20,
    "g": 2**30, "gib": 2**30, "t": 2**40, "tib": 2**40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}
_SIZE_RE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*")

GiB = 2**30
MiB = 2**20


def parse_size(text: str) -> int:
    """'24GiB' -> 25769803776; '80GB' -> 80e9; a bare number is bytes. ValueError otherwise."""
    m = _SIZE_RE.fullmatch(text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size: use e.g. 24GiB, 80GB, 512MiB")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"size {text!r} must be positive")
    return value


def fmt_bytes(n: float) -> str:
    """Binary units with 2 decimals in GiB, 1 below: '1.50 GiB', '300.0 MiB', '12 B'."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n >= GiB:
        return f"{sign}{n / GiB:.2f} GiB"
    if n >= MiB:
        return f"{sign}{n / MiB:.1f} MiB"
    if n >= 2**10:
        return f"{sign}{n / 2**10:.1f} KiB"
    return f"{sign}{int(n)} B"
