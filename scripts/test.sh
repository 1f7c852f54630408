#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs every test suite through CTest: C++ (GoogleTest), Python
# (pytest against transformers, tokenizers, compressed-tensors, huggingface_hub), JavaScript
# (the official OpenAI and MCP clients, Playwright) and shell. Extra arguments go to ctest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
cd "$root"
exec ctest --test-dir build --output-on-failure --timeout 2400 -j 2 "$@"
