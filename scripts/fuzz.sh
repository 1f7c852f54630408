#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz in build-fuzz (clang, with AddressSanitizer and
# UndefinedBehaviorSanitizer) and runs the ones named, one after the other, on their checked-in
# seeds plus what earlier runs found (build-fuzz/fuzz-corpus/NAME). A crash, leak or timeout stops
# that harness with its input in build-fuzz/fuzz-artifacts/ and makes the script fail.
#
#   scripts/fuzz.sh --build-only                   configure and build only (scripts/test.sh)
#   scripts/fuzz.sh all                            every harness, 10 million executions each
#   scripts/fuzz.sh request mcp -- -max_total_time=600
#                                                  the named ones, with libFuzzer's own flags
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
harnesses=(safetensors config tokenizer detokenizer chat_template output_parser request mcp)

names=()
flags=()
build_only=0
while (($#)); do
  case "$1" in
    --build-only) build_only=1 ;;
    --) shift; flags=("$@"); break ;;
    all) names+=("${harnesses[@]}") ;;
    *) names+=("$1") ;;
  esac
  shift
done
((${#flags[@]})) || flags=(-runs=10000000)

cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DTORCHTPU_FUZZ=ON -DTORCHTPU_BUILD_PYTHON=OFF \
  -DPython3_EXECUTABLE="$root/.venv/bin/python" >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target fuzzers
((build_only)) && exit 0
if ((${#names[@]} == 0)); then
  echo "usage: scripts/fuzz.sh --build-only | all | NAME... [-- LIBFUZZER_FLAGS] (NAME: ${harnesses[*]})" >&2
  exit 2
fi

status=0
for name in "${names[@]}"; do
  if [ ! -x "build-fuzz/tests/${name}_fuzz" ]; then
    echo "fuzz: no harness $name (the harnesses: ${harnesses[*]})" >&2
    exit 2
  fi
  mkdir -p "build-fuzz/fuzz-corpus/$name" build-fuzz/fuzz-artifacts
  echo "fuzz: $name ${flags[*]}"
  start=$(date +%s)
  rc=0
  "build-fuzz/tests/${name}_fuzz" "${flags[@]}" -timeout=10 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="build-fuzz/fuzz-artifacts/$name-" \
    "build-fuzz/fuzz-corpus/$name" "tests/fuzz/corpus/$name" 2>"build-fuzz/fuzz-$name.log" || rc=$?
  grep -E '^stat::(number_of_executed_units|peak_rss_mb)|^SUMMARY' "build-fuzz/fuzz-$name.log" || true
  echo "fuzz: $name exit $rc after $(($(date +%s) - start)) s (log: build-fuzz/fuzz-$name.log)"
  ((rc == 0)) || status=1
done
exit $status
