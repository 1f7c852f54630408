#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and starts the OpenAI-compatible server with its chat page. With no
# --model it serves the built-in demo checkpoint (random weights). Arguments go to
# `torchtpu-cpp serve`, e.g. scripts/serve.sh --model DIR --port 8000.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
exec "$root/build/torchtpu-cpp" serve "$@"
