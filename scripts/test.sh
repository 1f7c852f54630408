#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs every test suite through CTest: Python (pytest against
# transformers, tokenizers, compressed-tensors, huggingface_hub), JavaScript (the official OpenAI
# and MCP clients, Playwright), Go and shell in the regular build; the C++ gtest suites built with
# AddressSanitizer and UndefinedBehaviorSanitizer (build-asan, the only tree that builds them);
# each fuzz harness for a few seconds (build-fuzz, scripts/fuzz.sh). Extra arguments go to each
# ctest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
cd "$root"

# Either sanitizer's first finding ends the process with an error (the builds turn recovery off),
# so a finding fails its test; ASan's defaults include LeakSanitizer at exit. UBSan reports carry
# a stack trace. No suppressions: libtorch, uninstrumented, runs clean (docs/RELIABILITY.md).
export UBSAN_OPTIONS=print_stacktrace=1

# Only the gtest suites are built sanitized: the other suites drive the regular build's binaries.
cmake -S . -B build-asan -G Ninja -DTORCHTPU_SANITIZE=ON -DTORCHTPU_BUILD_PYTHON=OFF \
  -DPython3_EXECUTABLE="$root/.venv/bin/python" >/dev/null
cmake --build build-asan -j "$(nproc)" --target gtest_suites
scripts/fuzz.sh --build-only

# One CTest run over the three trees, so that both cores stay busy to the end: three runs one after
# the other each ended on one long test while the other core idled. Each tree's entries keep their
# own TIMEOUT; --timeout bounds the rest.
mkdir -p build-all
printf 'subdirs("%s" "%s" "%s")\n' "$root/build" "$root/build-asan" "$root/build-fuzz" \
  > build-all/CTestTestfile.cmake
exec ctest --test-dir build-all --output-on-failure --timeout 2400 -j 2 "$@"
