"""Leave a server process at once, once its work is done.

A server process that has stopped cleanly (requests finished, sockets closed, its own
children stopped) has nothing left for the interpreter's teardown to do but slow work:
torch's, Ray's and multiprocessing's atexit hooks and freeing every module take seconds.
`exit_now` flushes what is buffered (logging handlers, stdout, stderr) and calls
`os._exit(code)`, so the exit code still says how the process ended. Only for the
process entry points of `radixlm serve` (never a library call: it skips the caller's
cleanup)."""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def flush_output() -> None:
    """Flush every logging handler, then stdout and stderr (errors ignored: a closed
    pipe must not keep the process alive)."""
    for ref in list(logging._handlerList):  # type: ignore[attr-defined]
        handler = ref()
        if handler is not None:
            try:
                handler.flush()
            except Exception:
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def exit_now(code: int) -> NoReturn:
    """Flush buffered output and end this process with `code`, skipping interpreter
    teardown (atexit hooks, module finalizers, multiprocessing's joins)."""
    flush_output()
    os._exit(code)
