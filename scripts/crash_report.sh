#!/usr/bin/env bash
# The native backtrace of every thread of a crashed process, from its core file in the working
# directory (scripts/test.sh calls this when pytest dies of a signal). Installs gdb with apt
# where it is missing and apt and root are there. Usage: crash_report.sh EXECUTABLE
set -uo pipefail
exe=$1
echo "== crash report: kernel.core_pattern is '$(cat /proc/sys/kernel/core_pattern 2>/dev/null)'"
core=$(ls -t core core.[0-9]* 2>/dev/null | head -1)
if [ -z "$core" ]; then
    echo "no core file in $(pwd) (cores go elsewhere under that pattern, or ulimit -c forbade one)"
    exit 0
fi
if ! command -v gdb >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gdb >/dev/null 2>&1 \
        || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gdb) >/dev/null 2>&1
fi
if ! command -v gdb >/dev/null; then
    echo "core file $core kept; gdb is not installed"
    exit 0
fi
echo "== gdb backtrace of $core ($exe)"
gdb -batch -q -ex "info sharedlibrary _core" -ex "info threads" -ex "thread apply all bt 40" \
    -ex "info registers rip rsp" -ex "x/6i \$pc" "$exe" "$core" 2>&1 | grep -v "^\[New LWP" | head -400
