#!/usr/bin/env bash
# The GPU check (bench/gpu/verl_engine.py: verl's actor engine beside the local trainer, three updates of a
# random 0.5B Qwen2) on the GPU machine the device tool lends: torch there, no Ray, vLLM, DuckDB or network.
#
#   bench/gpu/verl_engine.sh prepare       here: wheels for the machine's Python 3.12 into build/gpu-carry
#   bench/gpu/verl_engine.sh run [ARGS]    there: install build/gpu-carry over the machine's python3, run
#   bench/gpu/verl_engine.sh --cpu --tiny  here: the same proven on CPU, over a stand-in of the machine
#
# With the device tool, after `prepare`:
#   run(command="bench/gpu/verl_engine.sh run --json $OUT/verl_engine.json", carry=["build/gpu-carry"],
#       timeout_s=600)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-.venv/bin/python}  # the project's environment, which prepares the carry

# Install the carried wheels beside the machine's packages (pip --target, first on PYTHONPATH: they win over
# the machine's own versions) and run the check with that interpreter; the stand-in for Ray comes first.
run_check() {
  local python=$1 carry=$2
  shift 2
  SITE=$(mktemp -d "${TMPDIR:-/tmp}/otel-rl-gpu-check-site.XXXXXX")
  trap 'rm -rf "$SITE"' EXIT
  "$python" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
    --target "$SITE" "$carry"/wheels/*.whl
  PYTHONPATH="$ROOT/bench/gpu/fixtures:$SITE" PYTHONUNBUFFERED=1 "$python" bench/gpu/verl_engine.py "$@"
}

case "${1:-}" in
  prepare)
    "$PYTHON" bench/gpu/carry.py wheels build/gpu-carry --python-version 3.12
    ;;
  run)
    shift
    run_check python3 build/gpu-carry "$@"
    ;;
  --cpu)
    "$PYTHON" bench/gpu/carry.py wheels build/gpu-carry-cpu --python-version local
    run_check "$("$PYTHON" bench/gpu/carry.py machine build/gpu-carry-cpu)" build/gpu-carry-cpu "$@"
    ;;
  *)
    sed -n '2,11p' "$0" >&2
    exit 2
    ;;
esac
