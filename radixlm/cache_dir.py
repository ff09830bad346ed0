"""Where radixlm keeps what it builds once per machine (CPU kernels, compiled graphs).

$RADIXLM_CACHE_DIR, else $XDG_CACHE_HOME/radixlm, else ~/.cache/radixlm.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    if os.environ.get("RADIXLM_CACHE_DIR"):
        return Path(os.environ["RADIXLM_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "radixlm"
