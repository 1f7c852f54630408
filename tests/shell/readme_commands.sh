#!/usr/bin/env bash
# The README's command lines that run offline and end by themselves (make-tiny, generate,
# quantize), as written there, each one after the other: the README is the contract, and a
# checkpoint its first line writes must serve its next ones.
# Usage: readme_commands.sh TORCHTPU_CPP REPO_DIR
set -euo pipefail
cli=${1:?usage: readme_commands.sh TORCHTPU_CPP REPO_DIR}
repo=${2:?usage: readme_commands.sh TORCHTPU_CPP REPO_DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The sh block under "## The command line".
block=$(awk '/^## The command line/ {on = 1} on && /^```sh/ {inside = 1; next}
             inside && /^```/ {exit} inside' "$repo/README.md")
mapfile -t lines < <(grep -E '^build/torchtpu-cpp (make-tiny|generate|quantize) ' <<<"$block")
if ((${#lines[@]} < 4)); then
  echo "expected make-tiny, two generate and a quantize line in README.md, found:" >&2
  printf '%s\n' "${lines[@]}" >&2
  exit 1
fi
cd "$repo"
for line in "${lines[@]}"; do
  command=${line//\/tmp\//$work/}
  command=${command/#build\/torchtpu-cpp/$cli}
  echo "+ $line"
  if ! eval "$command" >"$work/out" 2>&1; then
    echo "README.md's line failed: $line" >&2
    cat "$work/out" >&2
    exit 1
  fi
done
