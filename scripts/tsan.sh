#!/usr/bin/env bash
# ThreadSanitizer over the code that runs on several threads (docs/RELIABILITY.md,
# "ThreadSanitizer"). Builds build-tsan (-DTORCHTPU_SANITIZE_THREAD=ON): the CLI and the gtest
# suites of the HTTP server, the scheduler, the batch, the prefix cache, drafts and media loading;
# runs those suites, then servers under scripts/tsan_load.py's mixed load:
#   1. the demo checkpoint: 4 rows, prompt-lookup drafts, idle sleep, slot files, SIGTERM with
#      requests in flight (drained for 2 s, then finished);
#   2. a checkpoint with vision and audio towers (tests/js/make_multimodal.py), two LoRA adapters
#      (make_lora.py) and a third loaded and unloaded at run time, an assistant's drafts
#      (make_assistant.py), behind `proxy`, with the MCP tools at /mcp; both stopped with Ctrl-C
#      (SIGINT) once the load ends.
# One intra-op thread throughout (see CMakeLists.txt). Any report of ThreadSanitizer, a failed
# suite, an unexpected answer or a process that does not exit 0 fails the script. Not part of
# scripts/test.sh: the build takes about 8 minutes on 2 cores, the runs about 8 more. Logs: build-tsan/tsan.
#
#   scripts/tsan.sh [SECONDS]   seconds of load on each server (default 120)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
seconds=${1:-120}
py="$root/.venv/bin/python"
suites=(server_test scheduler_test prefix_cache_test batch_test draft_test media_parts_test)

cmake -S . -B build-tsan -G Ninja -DTORCHTPU_SANITIZE_THREAD=ON -DTORCHTPU_BUILD_PYTHON=OFF \
  -DPython3_EXECUTABLE="$py" >/dev/null
cmake --build build-tsan -j "$(nproc)" --target torchtpu-cpp "${suites[@]}"

logs="$root/build-tsan/tsan"
rm -rf "$logs"
mkdir -p "$logs"
work="$(mktemp -d)"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 XDG_CACHE_HOME="$work/cache"
status=0
fail() {
  echo "FAILED: $*"
  status=1
}
# The options of a process named NAME: every report, each in $logs/NAME.PID.
options() {
  echo "halt_on_error=0 second_deadlock_stack=1 log_path=$logs/$1"
}

for suite in "${suites[@]}"; do
  TSAN_OPTIONS="$(options "$suite")" "build-tsan/tests/$suite" >"$logs/$suite.out" 2>&1 ||
    fail "$suite: $logs/$suite.out"
done

# start NAME ARGS...: `torchtpu-cpp ARGS --port 0` in the background, until its
# /health answers 200; sets pid and port (from the "on http://HOST:PORT" line it prints first).
start() {
  local name=$1
  shift
  # A simple command, so that $! is the process itself (signals go to it, wait gets its status).
  TSAN_OPTIONS="$(options "$name")" build-tsan/torchtpu-cpp "$@" --port 0 >"$logs/$name.out" 2>&1 &
  pid=$!
  pids+=("$pid")
  port=""
  for _ in $(seq 600); do
    [[ -z $port ]] && port=$(grep -om1 'on http://127.0.0.1:[0-9]*' "$logs/$name.out" |
      sed 's/.*://' || true)
    [[ -n $port ]] && curl -sf "http://127.0.0.1:$port/health" >/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  echo "$name did not start: $logs/$name.out" >&2
  exit 1
}
# finish NAME PID: waits for PID and fails unless it exited 0.
finish() {
  local code=0
  wait "$2" || code=$?
  ((code == 0)) || fail "$1 exited $code: $logs/$1.out"
}
# load NAME ARGS...: scripts/tsan_load.py ARGS, its counts in $logs/NAME.load.
load() {
  "$py" scripts/tsan_load.py --seconds "$seconds" "${@:2}" >"$logs/$1.load" ||
    fail "the load on $1: $logs/$1.load"
  cat "$logs/$1.load"
}

mkdir -p "$work/slots"
start demo serve --threads 1 --model-id m --parallel 4 --draft-max 3 --sleep-idle-seconds 1.5 \
  --slot-save-path "$work/slots" --drain-grace 2 --cache-mb 64
demo=$pid
load demo --port "$port" --term-pid "$demo" --term-at "$((seconds - 15))"
finish demo "$demo"

demo_dir="$XDG_CACHE_HOME/torchtpu-cpp/demo-v1"
for fixture in multimodal lora assistant; do
  "$py" "tests/js/make_$fixture.py" "$demo_dir" "$work/$fixture" >>"$logs/fixtures.out" 2>&1
done
start media serve --threads 1 --runtime-lora --model "$work/multimodal" --model-id m --parallel 3 \
  --lora "first=$work/lora/first" --lora "second=$work/lora/second" \
  --draft-model "$work/assistant" --slot-save-path "$work/slots" --sleep-idle-seconds 1.5
media=$pid
start proxy proxy --upstream "http://127.0.0.1:$port"
proxy=$pid
load media --port "$port" --media --mcp --runtime-lora "$work/lora/second"
kill -INT "$proxy" "$media"
finish proxy "$proxy"
finish media "$media"

reports=$(cat "$logs"/*.[0-9]* 2>/dev/null | grep -c '^WARNING: ThreadSanitizer' || true)
echo "ThreadSanitizer reports: $reports (logs: $logs)"
((reports == 0)) || fail "ThreadSanitizer reported $reports races"
exit "$status"
