#!/usr/bin/env bash
# The whole test suite from a fresh machine: set-up, install, lint, type-check, tests.
# usage: tools/test.sh [pytest args...]
set -euo pipefail
source "$(dirname "$0")/env/common.sh"
cd "$ROOT"
# The example plugin (tests/plugin), installed the way a third party's package would be.
"$VENV/bin/pip" install -q --no-deps --no-build-isolation "$ROOT/tests/plugin" 2> >(grep -v '^WARNING: Location' >&2)
echo "== ruff"; "$VENV/bin/ruff" check . && "$VENV/bin/ruff" format --check .
echo "== mypy"; "$VENV/bin/mypy"
echo "== pytest"
# Two workers (pytest-xdist), each test file on one of them and the files that share a session server on
# the same one; each worker's engines get cores of their own (tests/conftest.py).
# DECISIONS_TEST_WORKERS=0 runs in one process.
set +e
"$PY" -m pytest -n "${DECISIONS_TEST_WORKERS:-2}" "$@"
rc=$?
set -e
[ $rc -eq 5 ] && { echo "pytest collected no tests" >&2; exit 1; }
exit $rc
