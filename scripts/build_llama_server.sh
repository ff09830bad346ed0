#!/usr/bin/env bash
# Optional benchmark set-up (never part of `make test`): build llama.cpp's `llama-server`
# so that `radixlm bench serve` can compare against it on the same GGUF.
#
# llama.cpp's source (server included) ships inside the llama-cpp-python source
# distribution on PyPI; we download that sdist (no wheel, no dependencies), and build only
# the `llama-server` target of its vendor/llama.cpp with CMake, without libcurl.
#
#   scripts/build_llama_server.sh            # -> .llama_cpp/bin/llama-server (git-ignored)
#   nice -n 19 scripts/build_llama_server.sh # on a shared machine
#   radixlm bench serve --llama-server .llama_cpp/bin/llama-server ...
#
# Takes about 6 minutes on 2 cores. Env: PYTHON (default .venv/bin/python, else python3),
# LLAMA_CPP_PYTHON_VERSION (default: the newest sdist), JOBS (default: nproc).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${LLAMA_SERVER_DIR:-$ROOT/.llama_cpp}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
JOBS="${JOBS:-$(nproc)}"
SPEC="llama-cpp-python${LLAMA_CPP_PYTHON_VERSION:+==$LLAMA_CPP_PYTHON_VERSION}"

command -v cmake >/dev/null || { echo "cmake is required" >&2; exit 1; }
mkdir -p "$OUT/src" "$OUT/bin"

if ! ls "$OUT"/src/llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
  echo "downloading the $SPEC source distribution"
  "$PYTHON" -m pip download --no-binary llama-cpp-python --no-deps -d "$OUT/src" "$SPEC"
fi
SDIST="$(ls "$OUT"/src/llama_cpp_python-*.tar.gz | sort -V | tail -n 1)"
SRC="$OUT/src/$(basename "$SDIST" .tar.gz)"
[ -d "$SRC" ] || tar -xzf "$SDIST" -C "$OUT/src"
LLAMA="$SRC/vendor/llama.cpp"
[ -f "$LLAMA/CMakeLists.txt" ] || { echo "no vendor/llama.cpp in $SDIST" >&2; exit 1; }

echo "building llama-server from $LLAMA with $JOBS jobs"
cmake -S "$LLAMA" -B "$OUT/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
  -DBUILD_SHARED_LIBS=OFF
cmake --build "$OUT/build" --target llama-server -j "$JOBS"
cp "$OUT/build/bin/llama-server" "$OUT/bin/llama-server"
echo "built $OUT/bin/llama-server"
"$OUT/bin/llama-server" --version || true
