#!/usr/bin/env bash
# The whole test suite from a fresh machine: set-up, install, lint, type-check, tests.
# usage: tools/test.sh [pytest args...]
set -euo pipefail
source "$(dirname "$0")/env/common.sh"
cd "$ROOT"
echo "== ruff"; "$VENV/bin/ruff" check . && "$VENV/bin/ruff" format --check .
echo "== mypy"; "$VENV/bin/mypy"
echo "== pytest"
set +e
"$PY" -m pytest "$@"
rc=$?
set -e
[ $rc -eq 5 ] && { echo "pytest collected no tests" >&2; exit 1; }
exit $rc
