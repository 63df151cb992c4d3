#!/usr/bin/env bash
# Run llama.cpp's own llama-server pytest suite against `pyllama serve`.
#
# usage: tools/run_llama_server_tests.sh [unit/test_x.py ...] [-- extra pytest args]
#
# - copies the suite (tools/server/tests), models/templates (chat templates some tests load
#   by relative path) and tools/mtmd/test-1.jpeg into a fresh temp dir, laid out as in
#   llama.cpp, so the relative paths of the tests still work; the source tree is read only;
# - adds unit/conftest.py to the COPY, overriding the session fixture `load_server_presets`
#   with a no-op: upstream it starts every preset once (bert, jina, tinygemma3, router
#   included) only to pre-download their models; here there is nothing to download and a
#   preset pyllama cannot start would error every test of the session. Each test still
#   starts its own server as upstream;
# - LLAMA_SERVER_BIN_PATH = tools/llama_server_shim.py (see its docstring for what it maps);
# - runs pytest one test at a time (no xdist), -x off, with a per-test timeout
#   (pytest-timeout), -p no:cacheprovider, -m "not slow" unless SLOW_TESTS=1.
#
# environment:
#   LLAMA_CPP_SRC   llama.cpp source tree (default: the vendored one in /work/sdist)
#   TEST_TIMEOUT    per-test timeout in seconds (default 300)
#   RESULTS_DIR     where junit XML and logs go (default: a new temp dir, printed)
#   KEEP_TMP=1      keep the temp copy of the suite
set -euo pipefail

HERE="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd -- "$HERE/.." && pwd)"
SRC="${LLAMA_CPP_SRC:-/work/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp}"
TIMEOUT="${TEST_TIMEOUT:-300}"

DEFAULT_FILES=(
  unit/test_basic.py unit/test_completion.py unit/test_chat_completion.py unit/test_tokenize.py
  unit/test_metrics.py unit/test_ctx_shift.py unit/test_security.py unit/test_stream.py
  unit/test_template.py unit/test_ignore_eos.py
)

FILES=()
EXTRA=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; EXTRA=("$@"); break; fi
  FILES+=("$1"); shift
done
[ ${#FILES[@]} -gt 0 ] || FILES=("${DEFAULT_FILES[@]}")

if [ -z "${VIRTUAL_ENV:-}" ] && [ -f "$REPO/.venv/bin/activate" ]; then
  # shellcheck disable=SC1091
  . "$REPO/.venv/bin/activate"
fi

python - <<'EOF'
import importlib.util, sys
missing = [m for m in ("pytest", "pytest_timeout", "requests", "wget", "filelock", "openai", "pyllama")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit("missing Python packages: " + ", ".join(missing) +
             " (pip install pytest-timeout wget filelock requests openai)")
EOF

[ -d "$SRC/tools/server/tests/unit" ] || { echo "no llama.cpp server tests under $SRC" >&2; exit 2; }

WORK="$(mktemp -d -t llama-server-tests.XXXXXX)"
cleanup() { if [ "${KEEP_TMP:-0}" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT

ROOT="$WORK/llama.cpp"
mkdir -p "$ROOT/tools/server" "$ROOT/models" "$ROOT/tools/mtmd"
cp -R "$SRC/tools/server/tests" "$ROOT/tools/server/tests"
cp -R "$SRC/models/templates" "$ROOT/models/templates"
cp "$SRC/tools/mtmd/test-1.jpeg" "$ROOT/tools/mtmd/" 2>/dev/null || true
rm -rf "$ROOT/tools/server/tests/tmp" "$ROOT/tools/server/tests/.pytest_cache"
chmod -R u+w "$WORK"

if [ -e "$ROOT/tools/server/tests/unit/conftest.py" ]; then
  echo "unit/conftest.py already exists upstream; refusing to overwrite it" >&2; exit 2
fi
cat > "$ROOT/tools/server/tests/unit/conftest.py" <<'EOF'
# Added by pyllama's tools/run_llama_server_tests.sh (not part of llama.cpp): upstream's
# session fixture of the same name starts every ServerPreset once only to download its
# model. There is nothing to download here, so it is a no-op.
import pytest


@pytest.fixture(scope="session", autouse=True)
def load_server_presets():
    yield
EOF

RESULTS_DIR="${RESULTS_DIR:-$(mktemp -d -t llama-server-results.XXXXXX)}"
mkdir -p "$RESULTS_DIR"

export LLAMA_SERVER_BIN_PATH="$HERE/llama_server_shim.py"
chmod +x "$LLAMA_SERVER_BIN_PATH" 2>/dev/null || true
export PYTHONDONTWRITEBYTECODE=1

MARK=(-m "not slow")
[ "${SLOW_TESTS:-0}" = 1 ] && MARK=()

cd "$ROOT/tools/server/tests"
echo "suite copy: $ROOT/tools/server/tests"
echo "results:    $RESULTS_DIR"
echo "shim:       $LLAMA_SERVER_BIN_PATH"

rc=0
for f in "${FILES[@]}"; do
  name="$(basename "$f" .py)"
  if [ ! -f "$f" ]; then echo "== $f: not in this version of the suite, skipped"; continue; fi
  echo "== $f"
  python -m pytest "$f" -p no:cacheprovider --timeout="$TIMEOUT" -o timeout_func_only=false \
      "${MARK[@]}" -rfEs --tb=short -q \
      --junitxml="$RESULTS_DIR/$name.xml" "${EXTRA[@]}" >"$RESULTS_DIR/$name.log" 2>&1 || rc=1
  tail -n 1 "$RESULTS_DIR/$name.log"
done

python - "$RESULTS_DIR" <<'EOF'
import glob, os, sys
import xml.etree.ElementTree as ET
tot = [0, 0, 0, 0]
print(f"\n{'file':<28}{'passed':>8}{'failed':>8}{'errors':>8}{'skipped':>8}")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.xml"))):
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    t = f = e = s = 0
    for su in suites:
        t += int(su.get("tests", 0)); f += int(su.get("failures", 0))
        e += int(su.get("errors", 0)); s += int(su.get("skipped", 0))
    p = t - f - e - s
    for i, v in enumerate((p, f, e, s)):
        tot[i] += v
    print(f"{os.path.basename(path)[:-4]:<28}{p:>8}{f:>8}{e:>8}{s:>8}")
print(f"{'total':<28}{tot[0]:>8}{tot[1]:>8}{tot[2]:>8}{tot[3]:>8}")
EOF
echo "logs and junit XML: $RESULTS_DIR"
exit $rc
