#!/usr/bin/env bash
# Cross-build the aarch64 abi3 wheel here (maturin + zig, manylinux_2_28) and run it under
# qemu user-mode emulation with Debian's arm64 CPython: `pyllama info`, and the README's
# prompt greedily, which must give llama.cpp's continuation (the NEON kernels' float order).
#
# Needs the Rust standard library for aarch64-unknown-linux-gnu (`rustup target add`, from
# static.rust-lang.org) and Debian's qemu-user and debootstrap (apt). Where the Rust target
# cannot be had (a machine that reaches only PyPI, crates.io and Debian) it says so and
# exits 0 without testing anything; every other failure fails. scripts/test.sh runs it.
# BUILD_ONLY=1: build the wheel and the arm64 root, and stop; WHEEL_AARCH64=path: test that
# wheel instead of building one (scripts/test.sh builds beside pytest, then tests).
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate

if ! rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
    if ! timeout 300 rustup target add aarch64-unknown-linux-gnu >/dev/null 2>&1; then
        echo "aarch64 wheel: SKIPPED: the Rust standard library for aarch64-unknown-linux-gnu is not" \
             "installed and rustup could not fetch it (no network to static.rust-lang.org)"
        exit 0
    fi
fi
need=()
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
    SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
    $SUDO apt-get install -y -q "${need[@]}" >/dev/null
fi
if [ -n "${WHEEL_AARCH64:-}" ]; then
    WHEEL=$WHEEL_AARCH64
else
    python -m pip install -q "ziglang>=0.13"
    echo "== building the aarch64 wheel (maturin --zig, manylinux_2_28)"
    rm -f dist/pyllama_gguf-*aarch64.whl
    maturin build --release -q --zig --target aarch64-unknown-linux-gnu --compatibility manylinux_2_28 -o dist
    WHEEL=$(ls dist/pyllama_gguf-*-cp39-abi3-manylinux_2_28_aarch64.whl)
fi
echo "== wheel: $WHEEL ($(du -k "$WHEEL" | cut -f1) KiB)"

# Debian bookworm arm64 with python3, unpacked (not configured: nothing of it runs natively).
ROOT=${PYLLAMA_ARM64_ROOT:-$HOME/.cache/pyllama/arm64-bookworm}
if [ ! -x "$ROOT/usr/bin/python3.11" ]; then
    echo "== unpacking Debian bookworm arm64 + python3 into $ROOT"
    rm -rf "$ROOT"
    debootstrap --arch=arm64 --foreign --variant=minbase --include=python3,python3-pip \
        bookworm "$ROOT" http://deb.debian.org/debian >/dev/null
    for deb in "$ROOT"/var/cache/apt/archives/*.deb; do dpkg -x "$deb" "$ROOT"; done
fi
[ -n "${BUILD_ONLY:-}" ] && exit 0
PY=(qemu-aarch64 -L "$ROOT" "$ROOT/usr/bin/python3.11")
"${PY[@]}" -c "import platform; assert platform.machine() == 'aarch64'"

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "== installing the wheel for arm64 CPython (under qemu; binary packages only)"
"${PY[@]}" -m pip install -q --disable-pip-version-check --root-user-action=ignore \
    --only-binary=:all: --target "$TMP/site" "$WHEEL"
# The default model, already here (a fetch would start pip as a child: no binfmt for it).
python - "$TMP/cache" <<'EOF'
import sys
from pathlib import Path
from pyllama._models import default_model_path
d = Path(sys.argv[1]); d.mkdir()
(d / default_model_path().name).symlink_to(default_model_path())
EOF
export PYTHONPATH="$TMP/site" PYLLAMA_CACHE="$TMP/cache"
cd "$TMP"
echo "== pyllama info (aarch64)"
"${PY[@]}" -m pyllama info | tee info.txt
grep -q "kernel set: neon" info.txt
echo "== pyllama generate (aarch64): llama.cpp's greedy continuation"
"${PY[@]}" -m pyllama generate -p "The capital of France is" -n 14 --temp 0 2>/dev/null > out.txt
cat out.txt
want=$'The capital of France is Paris.\n\nThe United States has a population of approximately 3'
[ "$(cat out.txt)" = "$want" ] || { echo "FAIL: not llama.cpp's greedy text"; exit 1; }
echo "aarch64 wheel test: passed"
