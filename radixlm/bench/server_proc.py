"""Servers that a benchmark starts itself: radixlm (any ServerArgs) and llama.cpp's llama-server.

A `ServerSpec` is the command line; `LaunchedServer` starts it, waits until `GET /health`
answers 200, and stops it (SIGTERM, then SIGKILL) when the `with` block ends.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from radixlm.bench.cold_start import free_port, stop_server
from radixlm.runtime.cpu_features import cpu_flags


@dataclass(frozen=True)
class ServerSpec:
    name: str
    cmd: tuple[str, ...]
    port: int
    backend: str  # "radixlm" | "openai" (see serve_client.Target)
    env: dict[str, str] = field(default_factory=dict)
    # Restarted before each measured run to empty its caches: a server with no flush
    # endpoint (llama-server keeps prompts in slots and in a host-RAM prompt cache that
    # its slot-erase action does not clear). radixlm is flushed by POST /flush_cache.
    restart_to_flush: bool = False

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def engine_args_to_flags(engine_args: dict[str, Any]) -> list[str]:
    """{"disable_radix_cache": True, "chunked_prefill_size": -1} ->
    ["--disable-radix-cache", "--chunked-prefill-size", "-1"] (ServerArgs' generated flags:
    booleans are --flag / --no-flag; None keeps the server's default)."""
    flags: list[str] = []
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + key.replace("_", "-"))
        elif value is not None:
            flags += [flag, str(value)]
    return flags


def radixlm_spec(name: str, model: str | None, engine_args: dict[str, Any],
                 port: int | None = None) -> ServerSpec:
    port = port or free_port()
    cmd = [sys.executable, "-m", "radixlm", "serve", "--port", str(port)]
    if model:
        cmd += ["--model", model]
    cmd += engine_args_to_flags(engine_args)
    return ServerSpec(name, tuple(cmd), port, "radixlm")


def find_llama_server(path: str | None) -> str | None:
    """`path` if given (must exist), else `llama-server` on PATH, else the binary that
    scripts/build_llama_server.sh builds (.llama_cpp/bin/llama-server), else None."""
    if path:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise FileNotFoundError(f"--llama-server {path}: not an executable file")
        return path
    on_path = shutil.which("llama-server")
    if on_path:
        return on_path
    built = os.path.join(os.path.dirname(__file__), "..", "..", ".llama_cpp", "bin",
                         "llama-server")
    return os.path.abspath(built) if os.access(built, os.X_OK) else None


def llama_server_spec(binary: str, gguf: str, parallel: int, slot_ctx: int, threads: int,
                      port: int | None = None, amx: bool | None = None) -> ServerSpec:
    """llama-server on `gguf` with `parallel` slots of `slot_ctx` tokens each (its `-c` is
    the total context, split evenly over the `-np` slots), at its defaults but for
    `--no-repack` on a CPU with AMX (`amx`; default: this one's flags), where its AMX
    weight repacking crashes the server (SIGSEGV, or SIGILL at its first forward)."""
    if not gguf.endswith(".gguf"):
        raise ValueError(f"llama-server needs a GGUF model, got {gguf}")
    port = port or free_port()
    cmd = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port),
           "-c", str(parallel * slot_ctx), "-np", str(parallel), "-t", str(threads)]
    if amx if amx is not None else "amx_tile" in cpu_flags():
        cmd.append("--no-repack")
    return ServerSpec("llama-server", tuple(cmd), port, "openai", restart_to_flush=True)


class ServerStartError(RuntimeError):
    pass


class LaunchedServer:
    """`with LaunchedServer(spec) as s:` -- started and healthy inside the block."""

    def __init__(self, spec: ServerSpec, timeout_s: float = 600.0, poll_s: float = 0.5) -> None:
        """`poll_s`: seconds between health probes (a start-time benchmark wants them
        finer than the default)."""
        self.spec = spec
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"radixlm-bench-{spec.name}-",
                                               suffix=".log", delete=False)

    def log_tail(self, n: int = 3000) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()[-n:]

    def __enter__(self) -> "LaunchedServer":
        self._start()
        return self

    def restart(self) -> None:
        """Stop the server and start it again on the same port (empty caches)."""
        if self.proc is not None:
            stop_server(self.proc)
            self.proc = None
        self._start()

    def _start(self) -> None:
        self.proc = subprocess.Popen(list(self.spec.cmd), stdout=self.log,
                                     stderr=subprocess.STDOUT,
                                     env={**os.environ, **self.spec.env})
        deadline = time.monotonic() + self.timeout_s
        try:
            while True:
                if self.proc.poll() is not None:
                    raise ServerStartError(f"{self.spec.name} exited with code "
                                           f"{self.proc.returncode}:\n{self.log_tail()}")
                try:
                    if httpx.get(self.spec.base_url + "/health", timeout=2).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise ServerStartError(f"{self.spec.name} not healthy after "
                                           f"{self.timeout_s:.0f} s:\n{self.log_tail()}")
                time.sleep(self.poll_s)
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            stop_server(self.proc)
        self.log.close()
        if exc[0] is None:
            os.unlink(self.log.name)  # keep the log of a failed run
