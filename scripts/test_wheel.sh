#!/usr/bin/env bash
# Build the abi3 manylinux_2_28 wheel (maturin + zig from PyPI, so it runs on glibc >= 2.28),
# check what is in it, install it into a fresh virtualenv with no Rust toolchain and no C
# compiler on PATH, and run the README's main command and a smoke test against it.
# scripts/test.sh runs this after the test suite; it needs .venv (made by scripts/test.sh).
# Output: dist/pyllama_gguf-*.whl. Set WHEEL=path to test a wheel built elsewhere, BUILD_ONLY=1
# to build it and stop (scripts/test.sh builds beside pytest, then tests).
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate

if [ -z "${WHEEL:-}" ]; then
    python -m pip install -q "ziglang>=0.13"
    rm -f dist/pyllama_gguf-*.whl
    echo "== building the wheel (maturin --zig, manylinux_2_28)"
    maturin build --release -q --zig --compatibility manylinux_2_28 -o dist
    WHEEL=$(ls dist/pyllama_gguf-*-cp39-abi3-manylinux_2_28_x86_64.whl)
fi
echo "== wheel: $WHEEL ($(du -k "$WHEEL" | cut -f1) KiB)"
[ -n "${BUILD_ONLY:-}" ] && exit 0
python - "$WHEEL" <<'EOF'
import sys, zipfile
w = zipfile.ZipFile(sys.argv[1])
names = w.namelist()
so = [n for n in names if n.endswith(".so")]
assert so == ["pyllama/_core.abi3.so"], f"expected exactly the abi3 extension, found {so}"
need = ["pyllama/__init__.py", "pyllama/py.typed", "pyllama/cli/__init__.py", "pyllama/server/app.py"]
missing = [n for n in need if n not in names]
assert not missing, f"missing from the wheel: {missing}"
meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
text = w.read(meta).decode()
assert "Name: pyllama-gguf" in text, "the distribution name must be pyllama-gguf"
total = sum(i.file_size for i in w.infolist())
print(f"wheel contents: {len(names)} files, {total / 2**20:.1f} MiB unpacked, extension "
      f"{w.getinfo(so[0]).file_size / 2**20:.1f} MiB")
EOF

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
BASE_PY=$(python -c "import sys; print(sys._base_executable)")
"$BASE_PY" -m venv "$TMP/venv"
# A PATH with the fresh venv and the few tools the commands need, and nothing that compiles.
mkdir "$TMP/bin"
for tool in sh bash env uname cat head tail grep sed ls rm mkdir mktemp od; do
    p=$(command -v "$tool" || true)
    [ -n "$p" ] && ln -s "$p" "$TMP/bin/$tool"
done
CLEAN_PATH="$TMP/venv/bin:$TMP/bin"
for c in cargo rustc cc gcc c++ g++ clang ld zig; do
    if PATH="$CLEAN_PATH" command -v "$c" >/dev/null 2>&1; then
        echo "FAIL: $c is on the clean PATH"; exit 1
    fi
done
echo "== installing into a fresh venv (no cargo, rustc, cc, gcc on PATH; binary packages only)"
env -i HOME="$HOME" PATH="$CLEAN_PATH" PIP_DISABLE_PIP_VERSION_CHECK=1 \
    "$TMP/venv/bin/python" -m pip install -q --only-binary=:all: "$WHEEL"

# Fresh model cache: the default model is fetched the way a new user's first run fetches it.
run() { env -i HOME="$HOME" PATH="$CLEAN_PATH" PYLLAMA_CACHE="$TMP/cache" LANG=C.UTF-8 "$@"; }
cd "$TMP"  # not the source tree: the installed package must be the one imported
echo "== pyllama info"
run pyllama info
echo "== README main command: pyllama generate -p \"The capital of France is\" -n 48"
run pyllama generate -p "The capital of France is" -n 48 > out48.txt
cat out48.txt; echo
echo "== pyllama generate -p hi -n 8"
run pyllama generate -p hi -n 8 > out8.txt
cat out8.txt; echo
echo "== smoke test"
run python - <<'EOF'
import subprocess, sys
from pathlib import Path
import pyllama
from pyllama import Llama, llama_api
from pyllama._models import default_model_path
assert "site-packages" in pyllama.__file__, pyllama.__file__
# llama.cpp 0c1e570's greedy continuation of this prompt on SmolLM2 (tests/data/generate_reference.json)
want = " Paris.\n\nThe United States has a population of approximately 3"
out = subprocess.run(["pyllama", "generate", "-p", "The capital of France is", "-n", "14", "--temp", "0"],
                     capture_output=True, text=True, check=True).stdout
assert out == "The capital of France is" + want + "\n", repr(out)
llm = Llama(model_path=str(default_model_path()), n_ctx=256, verbose=False)
text = llm.create_completion("The capital of France is", max_tokens=14, temperature=0.0)["choices"][0]["text"]
assert text == want, repr(text)
# the wgpu backend is in the wheel; where Mesa's software Vulkan driver is installed (CI), two
# offloaded layers give the same greedy tokens as the CPU
from pyllama import gpu
assert gpu.built(), "the wheel must carry the wgpu GPU backend"
if list(Path("/usr/share/vulkan/icd.d").glob("lvp_icd*.json")):
    assert gpu.devices(allow_software=True), "lavapipe is installed but the wheel finds no adapter"
    import os
    os.environ["PYLLAMA_GPU"] = "cpu-ok"
    g = Llama(model_path=str(default_model_path()), n_ctx=256, n_gpu_layers=2, verbose=False)
    text = g.create_completion("The capital of France is", max_tokens=3, temperature=0.0)["choices"][0]["text"]
    assert want.startswith(text) and text, repr(text)
    print("gpu: 2 layers on", gpu.usable(allow_software=True)[0]["name"], "give", repr(text))
print("smoke test: ok (CLI and Llama give llama.cpp's greedy text;", pyllama.__version__, ")")
EOF
test -s out8.txt
echo "wheel test: passed"
