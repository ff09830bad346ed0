"""Where radixlm keeps what it makes once per machine: converted tokenizers, built CPU
kernels, inductor's compiled decode graphs. $RADIXLM_CACHE_DIR, else ~/.cache/radixlm."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "RADIXLM_CACHE_DIR"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache",
                                                          "radixlm"))
