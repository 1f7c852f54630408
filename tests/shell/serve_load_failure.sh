#!/usr/bin/env bash
# `torchtpu-cpp serve` on a checkpoint that does not exist: every run must end, with a non-zero
# status and the load error on stderr, however the failed load, the stop it triggers and the
# listener thread's start interleave (a stop before the listener accepted used to be lost).
# Usage: serve_load_failure.sh TORCHTPU_CPP [RUNS]
set -euo pipefail
cli=${1:?usage: serve_load_failure.sh TORCHTPU_CPP [RUNS]}
runs=${2:-20}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
missing=$work/no-such-checkpoint
for ((i = 1; i <= runs; i++)); do
  status=0
  # A hung server swallows timeout's SIGTERM (it asks the server to stop), hence the KILL after.
  timeout --kill-after=5 60 "$cli" serve --model "$missing" --port 0 >"$work/out" 2>"$work/err" ||
    status=$?
  if ((status == 124 || status == 137)); then
    echo "run $i of $runs: still running after 60 s (the shutdown hung)" >&2
    exit 1
  fi
  if ((status == 0)); then
    echo "run $i of $runs: exited 0 on a checkpoint that does not exist" >&2
    exit 1
  fi
  if ! grep -q "^error: .*$missing" "$work/err"; then
    echo "run $i of $runs: exited $status without the load error; stderr:" >&2
    cat "$work/err" >&2
    exit 1
  fi
done
echo "$runs runs: each exited non-zero with the load error"
