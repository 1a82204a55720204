#!/usr/bin/env bash
# Edit one of patches/*.patch as real files, then write it back.
#
# usage: tools/env/patch_work.sh open  PATCH DIR   DIR/a: stock vLLM files the patch touches; DIR/b: patched
#        tools/env/patch_work.sh close PATCH DIR   rewrite PATCH as `diff -ruN a b` (no timestamps)
# env:   PYTHON (default .venv/bin/python): the Python whose vLLM 0.30 holds the stock files
set -euo pipefail
ACTION=${1:?open or close} PATCH=$(realpath "${2:?a patch file}") DIR=${3:?a working folder}
if [ "$ACTION" = close ]; then
  (cd "$DIR" && diff -ruN a b || true) | sed -E 's/^(---|\+\+\+) ([^\t]*)\t.*/\1 \2/' >"$PATCH"
  echo "wrote $PATCH"; exit 0
fi
SITE=$("${PYTHON:-$(dirname "$0")/../../.venv/bin/python}" -c 'import os, vllm; print(os.path.dirname(os.path.dirname(vllm.__file__)))')
rm -rf "$DIR" && mkdir -p "$DIR/a" "$DIR/b"
for file in $(sed -n 's|^+++ b/||p' "$PATCH"); do
  [ -f "$SITE/$file" ] && install -D -m 644 "$SITE/$file" "$DIR/a/$file"
done
# The installed vLLM may carry the patch already: take it out of the copies.
if (cd "$DIR/a" && patch -p1 -R --dry-run -s -f <"$PATCH" >/dev/null 2>&1); then (cd "$DIR/a" && patch -p1 -R -s -f -E <"$PATCH"); fi
cp -R "$DIR/a/." "$DIR/b/"
(cd "$DIR/b" && patch -p1 -s -f <"$PATCH")
echo "stock in $DIR/a, patched in $DIR/b; edit $DIR/b, then: $0 close $2 $DIR"
