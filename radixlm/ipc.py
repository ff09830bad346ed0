"""Inter-process plumbing: per-instance ZMQ endpoints and the one serializer.

Every engine instance gets its own directory of `ipc://` sockets, so two engines on
one host never collide. Messages are the dataclasses of `radixlm.messages`, pickled.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

import zmq


@dataclass(frozen=True)
class IpcEndpoints:
    scheduler_input: str  # API process PUSH -> scheduler PULL (requests, aborts)
    detokenizer_input: str  # scheduler PUSH -> detokenizer PULL (token ids)
    api_input: str  # detokenizer PUSH -> API process PULL (text)
    control: str  # scheduler PUSH -> API process PULL (ready / failed)
    base_dir: str

    @classmethod
    def create(cls, detokenize_in_api: bool = False) -> "IpcEndpoints":
        """`detokenize_in_api`: no detokenizer process; the scheduler's token ids go
        straight to the API process's socket (--detokenizer-mode api)."""
        base = tempfile.mkdtemp(prefix="radixlm-ipc-")
        ep = lambda name: f"ipc://{os.path.join(base, name)}"  # noqa: E731
        detok = ep("api") if detokenize_in_api else ep("detokenizer")
        return cls(ep("scheduler"), detok, ep("api"), ep("control"), base)

    def cleanup(self) -> None:
        shutil.rmtree(self.base_dir, ignore_errors=True)


def dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes) -> Any:
    return pickle.loads(data)


def make_socket(ctx: zmq.Context, kind: int, endpoint: str, bind: bool) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    if bind:
        sock.bind(endpoint)
    else:
        sock.connect(endpoint)
    return sock
