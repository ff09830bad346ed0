"""The engine of one Ray Serve replica: an ordinary `radixlm serve` child process.

Why a child server and not the engine in the replica's process: the child is today's
server unchanged, so every endpoint, validation, streaming, admission and the SIGTERM
drain are the ones `radixlm serve` has, and the engine's own processes (scheduler,
detokenizer, TP ranks) keep their lifecycle; it costs one loopback HTTP hop per request.
`server_flags` writes a ServerArgs as the command line that rebuilds it (only fields that
differ from the defaults). The child is SIGKILLed by Linux when the thread that started
it (the replica's) dies: a killed replica leaves no engine behind.
No Ray import here.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from radixlm.config import ServerArgs
from radixlm.runtime.process_utils import die_with_parent


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_flags(args: ServerArgs) -> list[str]:
    """ServerArgs -> `radixlm serve` flags (booleans as --flag / --no-flag)."""
    default = ServerArgs()
    flags: list[str] = []
    for f in dataclasses.fields(ServerArgs):
        value = getattr(args, f.name)
        if value == getattr(default, f.name) or value is None:
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + f.name.replace("_", "-"))
        else:
            flags += [flag, str(value)]
    return flags


class ChildServer:
    """Start `radixlm serve` with `args` (its host and port replaced), wait for /health."""

    def __init__(self, args: ServerArgs, host: str = "127.0.0.1",
                 log_path: str | None = None) -> None:
        self.port = free_port(host)
        self.args = args.replace(host=host, port=self.port, dp_size=1)
        self.url = f"http://{host}:{self.port}"
        cmd = [sys.executable, "-m", "radixlm", "serve", *server_flags(self.args)]
        self._log = open(log_path, "ab") if log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=die_with_parent)

    def wait_healthy(self, timeout_s: float = 600.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"radixlm serve exited during start-up "
                                   f"(exit code {self.proc.returncode})")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"radixlm serve not healthy after {timeout_s:.0f} s")
            time.sleep(0.5)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 30.0, sig: int = signal.SIGTERM) -> None:
        """`sig` (SIGTERM: the server drains and stops its children), SIGKILL to the group
        after `timeout_s`."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self._log is not subprocess.DEVNULL:
            self._log.close()
