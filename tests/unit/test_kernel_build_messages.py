"""The kernel builder says what it builds before it builds, records how long it took,
finds the build done the second time (also from a second checkout; another environment
keeps its own), and is not blocked by a killed build's lock (a C++ source on Python's C
API alone, ~1 s to build)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from radixlm.cpu_kernels import build

TINY = r"""
#include <Python.h>
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define STR2(a) #a
#define STR(a) STR2(a)
static PyObject* two(PyObject*, PyObject*) { return PyLong_FromLong(2); }
static PyMethodDef methods[] = {{"two", two, METH_NOARGS, nullptr}, {nullptr, nullptr, 0, nullptr}};
static PyModuleDef tiny_module = {PyModuleDef_HEAD_INIT, STR(TORCH_EXTENSION_NAME), nullptr, -1, methods};
PyMODINIT_FUNC CAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&tiny_module); }
"""


def test_build_is_announced_timed_and_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    source = src_dir / "tiny.cpp"
    source.write_text(TINY)
    caplog.set_level(logging.INFO, logger=build.__name__)

    assert build.expected_build_seconds("tiny") == build._DEFAULT_BUILD_SECONDS
    module = build.build_extension("tiny", source)
    assert module is not None
    messages = [r.getMessage() for r in caplog.records]
    announced = [i for i, m in enumerate(messages) if m.startswith("building CPU kernel tiny")]
    assert announced, messages
    assert "about 40 s" in messages[announced[0]]
    library = build._build_dir("tiny", source) / f"radixlm_tiny_{build._build_key(source)}.so"
    assert library.exists()

    # A recorded duration is what the next announcement quotes; a built kernel is not
    # announced again.
    build._seconds_file("tiny").write_text("7.0")
    assert build.expected_build_seconds("tiny") == 7.0
    caplog.clear()
    assert build.build_extension("tiny", source) is not None
    assert not any(r.getMessage().startswith("building") for r in caplog.records)


def test_parallel_builders_die_with_their_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server killed mid-build (SIGKILL: no handler runs) leaves no builder behind: each
    parallel builder asks Linux to kill it when its parent dies."""
    started: list[dict] = []

    class Child:
        returncode = 0

        def __init__(self, cmd: list[str], **kwargs: object) -> None:
            started.append(kwargs)

        def poll(self) -> int:
            return 0

    monkeypatch.setattr(build, "kernel_names", lambda: ["a", "b"])
    monkeypatch.setattr(build, "is_built", lambda name: False)
    monkeypatch.setattr(build, "_disabled", lambda name: False)
    monkeypatch.setattr(build.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(build.subprocess, "Popen", Child)
    build.build_missing_in_parallel()
    assert len(started) == 2
    assert all(kw.get("preexec_fn") is build.builder_preexec for kw in started)


def test_parallel_builds_start_the_next_as_soon_as_one_finishes(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Two cores, three kernels: the longest expected build starts first, and the third
    starts when the first to finish does, not when the slower one of a pair does."""
    monkeypatch.setattr(build, "cache_root", lambda: tmp_path)
    (tmp_path / "cpu_kernels").mkdir()
    for name, seconds in {"short": 10, "long": 50, "mid": 20}.items():
        build._seconds_file(name).write_text(str(seconds))
    events: list[str] = []
    children: dict[str, "Child"] = {}

    class Child:
        def __init__(self, cmd: list[str], **kwargs: object) -> None:
            self.name = cmd[-1]
            self.returncode: int | None = None
            self.polls = 0
            children[self.name] = self
            events.append(f"start {self.name}")

        def poll(self) -> int | None:
            # "mid" ends at its second poll, "short" at its first, "long" once it is alone.
            self.polls += 1
            others = [c for c in children.values() if c is not self and c.returncode is None]
            done = {"mid": self.polls >= 2, "short": True, "long": not others}[self.name]
            if done and self.returncode is None:
                self.returncode = 0
                events.append(f"end {self.name}")
            return self.returncode

    monkeypatch.setattr(build, "kernel_names", lambda: ["short", "long", "mid"])
    monkeypatch.setattr(build, "is_built", lambda name: False)
    monkeypatch.setattr(build, "_disabled", lambda name: False)
    monkeypatch.setattr(build.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(build.subprocess, "Popen", Child)
    build.build_missing_in_parallel(poll_seconds=0)
    assert events == ["start long", "start mid", "end mid", "start short", "end short",
                      "end long"]
    assert build.build_order(["short", "long", "mid"]) == ["long", "mid", "short"]
    assert build.schedule_seconds([50, 20, 10], 2) == 50
    assert build.schedule_seconds([10, 20, 50], 2) == 60


# The parent: ignores SIGTERM as a scheduler process does (its children inherit that),
# starts one builder as build_missing_in_parallel does, prints its pid.
PARENT = """
import signal, subprocess, sys
from radixlm.cpu_kernels import build
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", BUILDER], preexec_fn=build.builder_preexec)
print(child.pid, flush=True)
child.wait()
"""
# The builder: `build.main(["--only", ...])` whose build is a stand-in compiler that
# ignores SIGTERM, like a g++ started under a scheduler; prints the compiler's pid.
BUILDER = """
import subprocess
from radixlm.cpu_kernels import build
def load_kernel(name):
    p = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 60 & wait"])
    print(p.pid, flush=True)
    p.wait()
build.load_kernel = load_kernel
build.main(["--only", "slow"])
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited (reaping it is its new parent's business)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("how", ["parent killed", "SIGTERM to everything"])
def test_a_builder_takes_its_compilers_down(how: str) -> None:
    """A real process tree (parent -> builder -> compiler stand-in that ignores SIGTERM):
    when the parent is SIGKILLed, or when every process gets SIGTERM as a service manager
    stopping the unit sends it, the builder and its compiler are gone within seconds."""
    env = {**os.environ, "PYTHONPATH": str(Path(build.__file__).parents[2])}
    parent = subprocess.Popen([sys.executable, "-c", PARENT.replace("BUILDER", repr(BUILDER))],
                              stdout=subprocess.PIPE, text=True, env=env)
    builder = compiler = None
    grandchildren: list[int] = []
    try:
        builder = int(parent.stdout.readline())
        compiler = int(parent.stdout.readline())
        grandchildren = [int(p) for p in Path(f"/proc/{compiler}/task/{compiler}/children")
                         .read_text().split()]
        assert _alive(builder) and _alive(compiler)
        if how == "parent killed":
            parent.kill()
        else:
            for pid in (parent.pid, builder, compiler, *grandchildren):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(
                _alive(p) for p in (builder, compiler, *grandchildren)):
            time.sleep(0.05)
        assert not [p for p in (builder, compiler, *grandchildren) if _alive(p)]
    finally:
        parent.kill()
        parent.wait()
        for pid in (builder, compiler, *grandchildren):  # what a failure left behind
            if pid is not None and _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_extra_flags_are_compiled_in_and_keyed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A variant built with extra flags (tests/kernel_variants.py) gets them on the
    compiler's command line and its own key: the plain build is not reused for it, nor
    one variant's library for another's."""
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "tiny.cpp"
    source.write_text("#ifndef TINY_FLAG\n#error the extra flag did not reach g++\n#endif\n" + TINY)
    keys = {build._build_key(source), build._build_key(source, ("-DTINY_FLAG",)),
            build._build_key(source, ("-DTINY_FLAG", "-mno-avx2"))}
    assert len(keys) == 3
    assert build.build_extension("tiny", source) is None  # the #error: no flag, no build
    assert build.build_extension("tiny_flag", source, ("-DTINY_FLAG",)) is not None
    assert (build._build_dir("tiny_flag", source, ("-DTINY_FLAG",))
            / f"radixlm_tiny_flag_{build._build_key(source, ('-DTINY_FLAG',))}.so").exists()


def test_a_killed_build_does_not_block_later_builds(tmp_path, monkeypatch):
    """torch's build lock file left behind by a killed build is cleared, not waited on
    (a tiny extension, so the build is quick)."""
    import textwrap

    source = tmp_path / "tiny.cpp"
    source.write_text(TINY)
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))
    code = textwrap.dedent(f"""
        from pathlib import Path
        from radixlm.cpu_kernels import build
        src = Path({str(source)!r})
        d = build.cache_root() / "cpu_kernels" / f"tiny-{{build._build_key(src)}}"
        d.mkdir(parents=True)
        (d / "lock").touch()  # what a build killed inside torch's load() leaves
        assert build.build_extension("tiny", src).two() == 2
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_a_second_checkout_reuses_the_build(tmp_path, monkeypatch):
    """Two checkouts of the same sources in one environment (a clone, a worktree) share one
    build: the sources are staged into the build directory, so ninja sees the same paths
    and does not recompile (it used to, for every other checkout, and under load that
    pushed server start-ups past their timeouts)."""
    import textwrap

    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))
    sources = []
    for checkout in ("a", "b"):
        (tmp_path / checkout).mkdir()
        source = tmp_path / checkout / "tiny.cpp"
        source.write_text(TINY)
        sources.append(source)

    def build_from(source) -> float:
        code = textwrap.dedent(f"""
            from pathlib import Path
            from radixlm.cpu_kernels import build
            m = build.build_extension("tiny", Path({str(source)!r}))
            assert m.two() == 2
            print(Path(m.__file__).stat().st_mtime_ns)
        """)
        out = subprocess.run([sys.executable, "-c", code], check=True, timeout=300,
                             capture_output=True, text=True)
        return int(out.stdout.split()[-1])

    first = build_from(sources[0])
    assert build_from(sources[1]) == first  # the .so was not rebuilt


def test_two_environments_keep_their_own_builds(tmp_path, monkeypatch):
    """Two environments sharing the cache (two venvs: another torch's and Python's header
    paths in the builder's ninja file) each build once and keep their build: switching
    back and forth rebuilds nothing. Under one key for both, each switch recompiled every
    kernel, silently (the library existed, so no build was announced)."""
    import textwrap

    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "tiny.cpp"
    source.write_text(TINY)
    other = tmp_path / "other-torch" / "include"
    other.mkdir(parents=True)

    def build_in(environment: str) -> tuple[str, int]:
        code = textwrap.dedent(f"""
            from pathlib import Path
            from torch.utils import cpp_extension
            from radixlm.cpu_kernels import build
            if {environment == "other"!r}:  # another venv: its torch's headers elsewhere
                paths = cpp_extension.include_paths
                cpp_extension.include_paths = lambda *a, **k: [{str(other)!r}, *paths(*a, **k)]
            m = build.build_extension("tiny", Path({str(source)!r}))
            assert m.two() == 2
            print(m.__file__, Path(m.__file__).stat().st_mtime_ns)
        """)
        out = subprocess.run([sys.executable, "-c", code], check=True, timeout=300,
                             capture_output=True, text=True)
        path, mtime = out.stdout.split()[-2:]
        return path, int(mtime)

    first = build_in("this")
    second = build_in("other")
    assert second[0] != first[0]  # its own library
    assert build_in("this") == first  # this environment's build was not redone
    assert build_in("other") == second
