#!/usr/bin/env bash
# Download here (where the package registry is reachable) the wheels of radixlm's
# dependencies that the GPU machine lacks, into the git-ignored .whl/ folder; carry `.whl`
# to the machine and scripts/gpu_check.sh installs them. The GPU image (Python 3.12,
# torch, triton, transformers, numpy, pyyaml, requests, tqdm, ...) lacks gguf (pure Python)
# and pyzmq (a binary wheel, hence the platform flags). The server's fastapi/uvicorn/pydantic
# are not needed by the check (offline engine and benchmarks only) and are left out.
#   scripts/gpu_wheels.sh            # versions as installed in .venv (else the newest)
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
grep -qx '/.whl/' .gitignore 2>/dev/null || grep -qx '/.whl/' .git/info/exclude 2>/dev/null \
  || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
for pkg in gguf pyzmq; do
  version=$("$PY" -m pip show "$pkg" 2>/dev/null | sed -n 's/^Version: //p')
  spec="$pkg${version:+==$version}"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl "$spec"
done
ls -la .whl
