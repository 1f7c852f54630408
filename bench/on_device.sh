#!/usr/bin/env bash
# The engine on an accelerator, in one run: the parity suites with the engine on DEVICE against
# the references on the CPU (transformers' Gemma 4, the float64 reference, compressed-tensors),
# then the E2B benchmark there beside transformers (docs/BENCHMARKS.md, "On a GPU").
#
#   bench/on_device.sh CLI DEVICE OUT [run_all.py options...]
#
# CLI is a `torchtpu-cpp` built against the torch of the `python3` on PATH; DEVICE is cuda:0, say.
# Logs and results go to OUT as they come, so that a run stopped midway keeps what it measured.
# Exits 1 when a suite or the benchmark failed, after running both.
set -uo pipefail

if [ $# -lt 3 ]; then
  echo "usage: bench/on_device.sh CLI DEVICE OUT [run_all.py options...]" >&2
  exit 2
fi
cli=$(realpath "$1") device=$2 out=$3
shift 3
cd "$(dirname "$0")/.."
mkdir -p "$out"
export PYTHONUNBUFFERED=1
failed=0

echo "== parity suites, engine on $device ($(date -u +%H:%M:%S))"
OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 TORCHTPU_CLI=$cli TORCHTPU_TEST_DEVICE=$device \
  python3 -m pytest -q -p no:cacheprovider -m "not slow" -rs \
  tests/python/test_parity_reference.py tests/python/test_parity_transformers.py \
  2>&1 | tee "$out/parity.log" || failed=1

echo "== E2B benchmark on $device ($(date -u +%H:%M:%S))"
python3 bench/run_all.py --cli "$cli" --device "$device" --out "$out" "$@" \
  2>&1 | tee "$out/bench.log" || failed=1

echo "== done ($(date -u +%H:%M:%S)), failed=$failed"
exit $failed
