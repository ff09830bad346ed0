"""`radixlm bench cold-start`: seconds from `radixlm serve` process start to the first token.

Two starts share one fresh RADIXLM_CACHE_DIR: the first converts the GGUF tokenizer
into the cache, the second finds it there. Each start is timed from just before the
subprocess is created until POST /v1/completions (max_tokens=1) first answers 200.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from radixlm.bench.report import append_json_line, format_table, machine_info, utc_now


@dataclass(frozen=True)
class ColdStartConfig:
    model: str | None = None
    server_args: tuple[str, ...] = ()  # extra `radixlm serve` flags
    timeout_s: float = 600.0
    starts: tuple[str, ...] = ("first", "second")  # one server start each, same cache dir
    output_file: str | None = None


class ServerStartError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def first_completion(port: int, timeout_s: float = 5.0) -> bool:
    """True once the server answers a 1-token completion with 200."""
    body = json.dumps({"prompt": "Hello", "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def stop_server(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def time_server_start(cfg: ColdStartConfig, cache_dir: str, log_path: str) -> float:
    """Start a server with RADIXLM_CACHE_DIR=cache_dir; seconds until its first token."""
    port = free_port()
    cmd = [sys.executable, "-m", "radixlm", "serve", "--port", str(port), *cfg.server_args]
    if cfg.model:
        cmd += ["--model", cfg.model]
    env = {**os.environ, "RADIXLM_CACHE_DIR": cache_dir}
    with open(log_path, "w") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while time.perf_counter() - t0 < cfg.timeout_s:
                if proc.poll() is not None:
                    raise ServerStartError(f"server exited with code {proc.returncode}; "
                                           f"log: {log_path}")
                if first_completion(port):
                    return time.perf_counter() - t0
                time.sleep(0.1)
            raise ServerStartError(f"no completion within {cfg.timeout_s:.0f} s; log: {log_path}")
        finally:
            stop_server(proc)


def run_cold_start(cfg: ColdStartConfig, log=print) -> dict[str, Any]:
    machine = machine_info()
    results = []
    with tempfile.TemporaryDirectory(prefix="radixlm-cold-start-") as tmp:
        cache_dir = os.path.join(tmp, "cache")
        for i, name in enumerate(cfg.starts):
            log(f"{name} start (RADIXLM_CACHE_DIR={cache_dir}) ...")
            log_path = os.path.join(tmp, f"server-{i}.log")
            try:
                seconds = time_server_start(cfg, cache_dir, log_path)
            except ServerStartError:
                with open(log_path) as f:
                    log(f.read()[-4000:])
                raise
            results.append({"start": name, "seconds_to_first_token": seconds})
    record = {"benchmark": "cold_start", "timestamp": utc_now(), "machine": machine,
              "load_avg_1m_end": os.getloadavg()[0],
              "config": dataclasses.asdict(cfg), "results": results}
    if cfg.output_file:
        append_json_line(cfg.output_file, record)
    return record


def cold_start_table(record: dict[str, Any]) -> str:
    rows = [[r["start"], r["seconds_to_first_token"]] for r in record["results"]]
    return format_table(["start", "s to first token"], rows)
