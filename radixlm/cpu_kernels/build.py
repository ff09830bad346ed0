"""Builds the C++ CPU kernels of this folder once per machine and loads them.

Compiled with torch's extension builder (g++ and ninja) for the machine it runs on
(-march=native), into `cache_root()/cpu_kernels/<name>-<hash>`; the hash covers the
source, torch's version, the compiler flags, the CPU's flags and the toolchain's paths
(torch's and Python's headers and libraries, $CXX), so a second start loads the built
library in well under a second, a different CPU builds its own, and two environments
(venvs) sharing the cache each keep theirs instead of rebuilding over each other's. The
build `load_kernel` loads also registers the kernel's torch ops (`kernel_ops.py`). Any
failure (no compiler, no ninja) is logged once and answered with None: the callers fall
back to their torch code. A build about to run is announced first, with the time the last
build of that kernel took here; several missing kernels build in parallel, one process
each, as many at once as there are cores.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from types import ModuleType

import torch

from radixlm.runtime import cpu_features
from radixlm.runtime.cache_dir import cache_root
from radixlm.runtime.process_utils import die_with_parent

logger = logging.getLogger(__name__)

# -fassociative-math (with the two flags it needs) lets the compiler vectorize the float
# reductions of the dot products; results stay float32, in a different summation order.
CFLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-fno-signed-zeros", "-fno-trapping-math",
          "-fassociative-math", "-ffp-contract=fast")


# The build `load_kernel` loads registers the kernel's entries as torch ops where its source
# does (`TORCH_LIBRARY_IMPL` under RADIXLM_TORCH_OPS: compiled graphs call them without a
# Python hop). Other builds of a source (tests' narrower-ISA variants, benchmarks' old
# versions) load beside it in one process without taking its ops over.
MAIN_CFLAGS = ("-DRADIXLM_TORCH_OPS=1",)


def _build_key(source: Path, extra_cflags: tuple[str, ...] = ()) -> str:
    h = hashlib.sha256(source.read_bytes())
    for header in sorted(source.parent.glob("*.h")):  # what the sources may include
        h.update(header.read_bytes())
    h.update(torch.__version__.encode())
    h.update(" ".join((*CFLAGS, *extra_cflags)).encode())
    h.update(cpu_features.machine_key().encode())
    h.update(_toolchain_key().encode())
    return h.hexdigest()[:16]


def _toolchain_key() -> str:
    """What torch's builder writes into the build's ninja file besides the flags: the
    include and library paths of this torch and Python, and the compiler. Two venvs have
    different ones; under one key each build's ninja file would differ from the last, and
    ninja would recompile every kernel (silently: the library exists) at every switch."""
    from torch.utils import cpp_extension

    python_include = sysconfig.get_path("include", scheme="posix_prefix") or ""
    return "|".join([*cpp_extension.include_paths("cpu"), *cpp_extension.library_paths("cpu"),
                     python_include, os.environ.get("CXX", "c++")])


def _stage(source: Path, build_dir: Path) -> Path:
    """The source and its headers copied into the build directory (same key, same bytes):
    ninja's build file then names the same path whichever checkout builds, so a second
    checkout of the same sources (one environment) finds the build done."""
    staged = build_dir / "src"
    staged.mkdir(exist_ok=True)
    for path in [source, *sorted(source.parent.glob("*.h"))]:
        target = staged / path.name
        if not target.exists():
            shutil.copyfile(path, target)
    return staged / source.name


def _disabled(name: str) -> bool:
    # RADIXLM_DISABLE_CPU_KERNELS=1: none (the torch fallbacks); =name,name: those.
    disabled = os.environ.get("RADIXLM_DISABLE_CPU_KERNELS", "")
    return disabled == "1" or name in disabled.split(",")


@functools.cache
def load_kernel(name: str) -> ModuleType | None:
    """The extension built from `<name>.cpp` next to this file, or None (logged)."""
    if _disabled(name):
        return None
    return build_extension(name, _source(name), MAIN_CFLAGS)


# A first build's duration where none was recorded on this machine (g++ -O3 on one
# 2-vCPU EPYC core: 30-40 s per kernel).
_DEFAULT_BUILD_SECONDS = 40.0


def _build_dir(name: str, source: Path, extra_cflags: tuple[str, ...] = ()) -> Path:
    return cache_root() / "cpu_kernels" / f"{name}-{_build_key(source, extra_cflags)}"


def _seconds_file(name: str) -> Path:
    return cache_root() / "cpu_kernels" / f"{name}.build_seconds"


def _source(name: str) -> Path:
    return Path(__file__).with_name(f"{name}.cpp")


def is_built(name: str) -> bool:
    """Whether `name`'s library for this source, torch, flags, CPU and toolchain is in the
    cache."""
    source = _source(name)
    build_dir = _build_dir(name, source, MAIN_CFLAGS)
    return (build_dir / f"radixlm_{name}_{_build_key(source, MAIN_CFLAGS)}.so").exists()


def expected_build_seconds(name: str) -> float:
    """How long the last build of `name` took on this machine (any version), or a guess."""
    try:
        return float(_seconds_file(name).read_text())
    except (OSError, ValueError):
        return _DEFAULT_BUILD_SECONDS


def build_extension(name: str, source: Path, extra_cflags: tuple[str, ...] = ()) -> ModuleType | None:
    """Build (or find built) and import the extension of one C++ source; None on failure.
    `extra_cflags` follow CFLAGS (the tests' narrower-ISA variants: another `name`, and
    the flags are part of the key)."""
    key = _build_key(source, extra_cflags)
    build_dir = _build_dir(name, source, extra_cflags)
    if not (build_dir / f"radixlm_{name}_{key}.so").exists():
        logger.warning("building CPU kernel %s for this CPU (once per machine and version; "
                       "about %.0f s) ...", name, expected_build_seconds(name))
    t0 = time.perf_counter()
    try:
        from torch.utils.cpp_extension import load

        build_dir.mkdir(parents=True, exist_ok=True)
        # ninja may come as a wheel into this interpreter's bin/ without it being on PATH.
        bin_dir = os.path.dirname(sys.executable)
        if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
        # One builder at a time (TP ranks, test processes) under a lock the kernel drops
        # if its holder dies. torch's own lock file ("lock", created and deleted by
        # load()) would stay behind a killed build and make every later load wait
        # forever: found under our lock, it can only be such a leftover.
        with open(build_dir / "radixlm.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            (build_dir / "lock").unlink(missing_ok=True)
            module = load(name=f"radixlm_{name}_{key}", sources=[str(_stage(source, build_dir))],
                          extra_cflags=[*CFLAGS, *extra_cflags], extra_ldflags=["-fopenmp"],
                          build_directory=str(build_dir), verbose=False)
    except Exception as e:  # noqa: BLE001 - any build failure means "use the fallback"
        logger.warning("CPU kernel %s unavailable (%s: %s); using the torch fallback",
                       name, type(e).__name__, str(e).strip().splitlines()[-1][:300] if str(e) else "")
        return None
    dt = time.perf_counter() - t0
    if dt > 2:
        logger.warning("built CPU kernel %s in %.1f s (cached in %s)", name, dt, build_dir)
        _seconds_file(name).write_text(f"{dt:.1f}")
    return module


def kernel_names() -> list[str]:
    return sorted(p.stem for p in Path(__file__).parent.glob("*.cpp"))


def builder_preexec() -> None:
    """A builder process, before it execs: its own process group (the ninja, g++ and cc1plus
    it starts join it) and SIGTERM when its parent dies (`stop_builder_group`), SIGTERM's
    default action until main() installs that handler (a scheduler ignores SIGTERM, and an
    ignored signal would stay ignored across exec)."""
    os.setpgrp()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent(signal.SIGTERM)


def stop_builder_group(signum: int, frame: object) -> None:
    """A builder's SIGTERM (its parent died, or a service manager stops everything): its
    compiler processes go with it. They cannot be trusted to take SIGTERM themselves: a
    scheduler ignores it (the API process drains), and children inherit that."""
    os.killpg(os.getpgrp(), signal.SIGKILL)


def build_order(names: list[str]) -> list[str]:
    """`names` longest expected build first (then by name): the order a list schedule
    over the cores finishes soonest in when one build is much longer than the rest."""
    return sorted(names, key=lambda name: (-expected_build_seconds(name), name))


def schedule_seconds(seconds: list[float], workers: int) -> float:
    """When builds of these durations, started in this order, each on the first free
    worker, are all done."""
    free_at = [0.0] * max(workers, 1)
    for duration in seconds:
        i = free_at.index(min(free_at))
        free_at[i] += duration
    return max(free_at)


def build_missing_in_parallel(poll_seconds: float = 0.2) -> None:
    """Build every kernel not yet in the cache, one process per kernel and as many at once
    as there are cores (each g++ uses one): the longest expected first, and the next one
    started as soon as any finishes, so a first start waits about the sum of the builds
    divided by the cores. Plain subprocesses: the scheduler is a daemonic process, which
    multiprocessing forbids to have children. Each builder leads its own process group
    and takes its compilers down when the process that started it dies (a server stopped
    mid-build leaves no builder or compiler behind: `builder_preexec`). A failed child is
    only logged: load_kernel then tries (and says) again."""
    missing = [name for name in kernel_names() if not _disabled(name) and not is_built(name)]
    if not missing:
        return
    workers = min(len(missing), os.cpu_count() or 1)
    pending = build_order(missing)
    if len(missing) > 1 and workers > 1:  # a single builder announces its own build
        about = schedule_seconds([expected_build_seconds(n) for n in pending], workers)
        logger.warning("building %d CPU kernels, %d at a time (%s): about %.0f s", len(missing),
                       workers, ", ".join(pending), about)
    running: dict[str, subprocess.Popen] = {}
    while pending or running:
        while pending and len(running) < workers:
            name = pending.pop(0)
            running[name] = subprocess.Popen([sys.executable, "-m", "radixlm.cpu_kernels.build",
                                              "--only", name], preexec_fn=builder_preexec)
        for name, child in list(running.items()):
            if child.poll() is not None:
                del running[name]
                if child.returncode != 0:
                    logger.warning("parallel build of CPU kernel %s failed (exit %s)", name,
                                   child.returncode)
        if running and (len(running) == workers or not pending):  # none to start now
            time.sleep(poll_seconds)


def load_all_kernels() -> dict[str, bool]:
    """Build (or load) every kernel now; name -> available. A CPU model runner calls this
    at start-up, so that a first start on a new machine builds before the server reports
    ready instead of inside its first request."""
    build_missing_in_parallel()
    return {name: load_kernel(name) is not None for name in kernel_names()}


def main(argv: list[str] | None = None) -> int:
    """`python -m radixlm.cpu_kernels.build`: build every kernel of this folder now (the
    set-up does, so that neither the first start nor a test pays for the build);
    `--only NAME`: that one (exit 1 if it is unavailable)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--only"] and len(argv) == 2:
        if os.getpgrp() == os.getpid():  # a group of its own: see builder_preexec
            signal.signal(signal.SIGTERM, stop_builder_group)
        return 0 if load_kernel(argv[1]) is not None else 1
    for name, ok in load_all_kernels().items():
        print(f"{name}: {'ok' if ok else 'unavailable (torch fallback)'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
