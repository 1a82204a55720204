#!/usr/bin/env bash
# The whole test suite from a fresh machine: set-up, install, lint, type-check, tests.
# usage: tools/test.sh [pytest args...]
# Without arguments it runs everything: the whole suite on vLLM 0.30 (the tests marked `many_engines` in a
# pass of their own, one at a time), then the tests marked `vllm032` (both wires, the API key, one template
# family, bulk) on vLLM 0.32 in a second environment. With arguments, pytest runs just those, on vLLM 0.30.
set -euo pipefail
export DECISIONS_VLLM_VERSION=0.30.0  # the first pass; the second sets up its own
SETUP_MODELS=  # the suite never builds the quickstart's model
source "$(dirname "$0")/env/common.sh"
cd "$ROOT"
# The example plugin (tests/plugin), installed the way a third party's package would be, for the tests
# only: it claims Qwen2 models, so it leaves with them and tools/serve.sh serves what a user gets.
plugin() { "$1/bin/pip" install -q --no-deps --no-build-isolation "$ROOT/tests/plugin" 2> >(grep -v '^WARNING: Location' >&2); }
unplug() { for venv in "$@"; do "$venv/bin/pip" uninstall -y -q decisions-test-plugin >/dev/null 2>&1 || true; done; }
trap 'unplug "$VENV" ${VENV_032:+"$VENV_032"}' EXIT
plugin "$VENV"
# vLLM 0.32 beside it, the overlay installed into it the same way (tests/install reads its stock files too),
# and vLLM 0.33's sources for the static checks of tests/install/test_vllm_versions.py.
VENV_032=$(DECISIONS_VLLM_VERSION=0.32.0 DECISIONS_VENV=${DECISIONS_VENV_032:-} bash "$ROOT/tools/env/setup.sh" | sed -n 's/^VENV=//p')
"$ROOT/install.sh" --python "$VENV_032/bin/python" >&2
plugin "$VENV_032"
export DECISIONS_VENV_032=$VENV_032
PYTHON=$PY bash "$ROOT/tools/env/vllm_sources.sh" 0.33.0 >/dev/null
echo "== ruff"; "$VENV/bin/ruff" check . && "$VENV/bin/ruff" format --check .
# Formatting is ruff's, as in vLLM: no file opts out of it.
if git grep -nE '#[[:space:]]*fmt:[[:space:]]*(skip|off)' -- '*.py'; then echo "formatter opt-outs above" >&2; exit 1; fi
echo "== mypy"; "$VENV/bin/mypy"
# Two workers (pytest-xdist), each test file on one of them and the files that share a session server on
# the same one; each worker's engines get cores of their own (tests/conftest.py).
# DECISIONS_TEST_WORKERS=0 runs in one process.
WORKERS=${DECISIONS_TEST_WORKERS:-2}
checked() {  # runs pytest; a run that collected nothing is a failure too
  local rc=0
  "$@" || rc=$?
  [ $rc -eq 5 ] && { echo "pytest collected no tests" >&2; rc=1; }
  return $rc
}
rc=0
if [ $# -gt 0 ]; then
  echo "== pytest (vLLM 0.30)"
  checked "$PY" -m pytest -n "$WORKERS" "$@" || rc=$?
else
  echo "== pytest (vLLM 0.30)"
  # The slowest tests are listed at the end, so the suite's time (CI keeps it under 45 minutes) stays visible.
  checked "$PY" -m pytest -n "$WORKERS" -m "not many_engines" --durations=20 || rc=$?
  # The files that start several engines at once (two "nodes", Ray actors), one at a time in one process:
  # beside the other tests' servers a 24 GiB machine ran out of memory.
  echo "== pytest (vLLM 0.30: the tests marked many_engines, one at a time)"
  checked "$PY" -m pytest -m many_engines tests || rc=$?
  echo "== pytest (vLLM 0.32: the tests marked vllm032)"
  checked env PATH="$VENV_032/bin:$PATH" "$VENV_032/bin/python" -m pytest -n "$WORKERS" -m vllm032 tests || rc=$?
fi
exit $rc
