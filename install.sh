#!/usr/bin/env bash
# Install the typed-decisions overlay into vLLM 0.30.x: apply patches/api-router-wire-v0.30.patch and
# copy the package to vllm/entrypoints/generate/decisions/.
#
# usage: ./install.sh [--python PY] [--dev] [--uninstall]
#   --python PY   the Python whose `import vllm` to install into (default: $PYTHON, else python3)
#   --dev         link the package to this checkout instead of copying it (edits take effect at once)
#   --uninstall   remove the package and reverse the patch, leaving stock vLLM
#
# Idempotent: a second run changes nothing and exits 0. On any failure it exits non-zero with the
# reason and leaves vLLM as it found it.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PATCH="$HERE/patches/api-router-wire-v0.30.patch"
PACKAGE="$HERE/overlay/vllm/entrypoints/generate/decisions"
PY=${PYTHON:-python3}
MODE=copy
while [ $# -gt 0 ]; do
  case "$1" in
    --python) PY=${2:?--python needs a path}; shift 2 ;;
    --dev) MODE=dev; shift ;;
    --uninstall) MODE=uninstall; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
fail() { echo "install.sh: $*" >&2; exit 1; }
say() { echo "install.sh: $*"; }

command -v patch >/dev/null || fail "the 'patch' program is needed (apt-get install patch)"
FOUND=$("$PY" -c 'import os, vllm; print(vllm.__version__); print(os.path.dirname(os.path.dirname(vllm.__file__)))' 2>/dev/null) \
  || fail "'$PY' can't import vllm; activate the environment that has vLLM 0.30 or pass --python"
VERSION=$(sed -n 1p <<<"$FOUND"); SITE=$(sed -n 2p <<<"$FOUND")
case "$VERSION" in
  0.30.*) ;;
  *) fail "found vLLM $VERSION at $SITE; this overlay is for vLLM 0.30.x only" ;;
esac
TARGET="$SITE/vllm/entrypoints/generate/decisions"
[ -w "$SITE/vllm" ] || fail "$SITE/vllm is not writable"

# A copy of the patch as applied, so a later version of this overlay can take it back out first.
APPLIED="$SITE/vllm/entrypoints/generate/.decisions-router.patch"
patch_state() {  # $1: a patch file; prints applied | stock | conflict
  if (cd "$SITE" && patch -p1 -R --dry-run -s -f --fuzz=0 <"$1" >/dev/null 2>&1); then echo applied
  elif (cd "$SITE" && patch -p1 --dry-run -s -f --fuzz=0 <"$1" >/dev/null 2>&1); then echo stock
  else echo conflict; fi
}
run_patch() { local file=$1; shift; (cd "$SITE" && patch -p1 -s -f --fuzz=0 --no-backup-if-mismatch "$@" <"$file"); }

# The patch vLLM carries now: the one recorded at install time, else (older installs) ours.
CURRENT="$PATCH"; [ -f "$APPLIED" ] && CURRENT="$APPLIED"
STATE=$(patch_state "$CURRENT")
if [ "$MODE" = uninstall ]; then
  [ "$STATE" = conflict ] && fail "vLLM's patched files at $SITE differ from both stock and patched; not touching them"
  [ -e "$TARGET" ] || [ -L "$TARGET" ] && { rm -rf "$TARGET"; say "removed $TARGET"; }
  [ "$STATE" = applied ] && { run_patch "$CURRENT" -R; say "reversed the router patch"; }
  rm -f "$APPLIED"
  say "vLLM $VERSION at $SITE is stock"
  exit 0
fi

[ "$STATE" = conflict ] && fail "the router patch does not apply to vLLM $VERSION at $SITE (files modified?)"
OLD_REVERSED=0 PATCHED_NOW=0 STAGE= ASIDE= PLACED=0
cleanup() {  # on failure, undo what this run did
  local rc=$?
  if [ $rc -ne 0 ]; then
    [ -n "$STAGE" ] && rm -rf "$STAGE"
    [ "$PLACED" = 1 ] && rm -rf "$TARGET"
    [ -n "$ASIDE" ] && mv "$ASIDE" "$TARGET"
    [ "$PATCHED_NOW" = 1 ] && run_patch "$PATCH" -R
    [ "$OLD_REVERSED" = 1 ] && run_patch "$CURRENT"
  fi
  exit $rc
}
trap cleanup EXIT
if [ "$STATE" = applied ] && ! cmp -s "$CURRENT" "$PATCH"; then
  run_patch "$CURRENT" -R; OLD_REVERSED=1; STATE=stock; say "took out the previous version's router patch"
  [ "$(patch_state "$PATCH")" = stock ] || fail "the router patch does not apply to vLLM $VERSION at $SITE"
fi
if [ "$STATE" = stock ]; then run_patch "$PATCH"; PATCHED_NOW=1; say "applied the router patch"; fi
replace_target() {  # move the old package aside (restored on failure), put $1 in its place
  if [ -e "$TARGET" ] || [ -L "$TARGET" ]; then
    ASIDE=$(mktemp -u "$SITE/vllm/entrypoints/generate/.decisions-old.XXXXXX"); mv "$TARGET" "$ASIDE"
  fi
  mv "$1" "$TARGET"; PLACED=1
}
if [ "$MODE" = dev ]; then
  if [ "$(readlink "$TARGET" 2>/dev/null)" != "$PACKAGE" ]; then
    STAGE=$(mktemp -u "$SITE/vllm/entrypoints/generate/.decisions-link.XXXXXX")
    ln -s "$PACKAGE" "$STAGE"; replace_target "$STAGE"; STAGE=
    say "linked $TARGET -> $PACKAGE"
  fi
elif [ -L "$TARGET" ] || ! diff -rq -x __pycache__ "$PACKAGE" "$TARGET" >/dev/null 2>&1; then
  STAGE=$(mktemp -d "$SITE/vllm/entrypoints/generate/.decisions-new.XXXXXX")
  cp -R "$PACKAGE/." "$STAGE/"
  find "$STAGE" -name __pycache__ -prune -exec rm -rf {} +
  chmod 755 "$STAGE"
  replace_target "$STAGE"; STAGE=
  say "copied the package to $TARGET"
fi
"$PY" -m compileall -q "$TARGET" >/dev/null || fail "the installed package does not compile; see above"
cmp -s "$PATCH" "$APPLIED" 2>/dev/null || cp "$PATCH" "$APPLIED"
[ -n "$ASIDE" ] && rm -rf "$ASIDE"
ASIDE=
say "typed decisions installed into vLLM $VERSION at $SITE (enable with VLLM_ENABLE_TYPED_DECISIONS=1)"
