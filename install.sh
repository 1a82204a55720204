#!/usr/bin/env bash
# Install the typed-decisions overlay into vLLM 0.30.x or 0.32.x: apply that version's patch set (the
# endpoints on vLLM's app, the LayaForDecision model, fp32 option log-probabilities under a bf16/fp16 LM
# head; docs/install.md says what each patch changes per version) and copy the package to
# vllm/entrypoints/generate/decisions/.
#
# usage: ./install.sh [--python PY] [--dev] [--with-canvas] [--with-ray] [--uninstall]
#   --python PY     the Python whose `import vllm` to install into (default: $PYTHON, else python3)
#   --dev           link the package to this checkout instead of copying it (edits take effect at once)
#   --with-canvas   on vLLM 0.30, also apply patches/00572-diffusion-canvas-read-v0.30.patch (DiffusionGemma
#                   canvas reads for the canvas backend; its engine path needs a GPU and is not verified
#                   here); vLLM 0.32 reads canvases itself, so there it changes nothing
#   --with-ray      also pip-install Ray Data (tools/env/requirements-ray.txt, the `ray` extra) into that
#                   Python, for the Ray Data stage (docs/bulk.md); nothing else in the package imports Ray
#   --uninstall     remove the package and reverse the patches, leaving stock vLLM
#
# Idempotent: a second run changes nothing and exits 0. On any failure it exits non-zero with the
# reason and leaves vLLM as it found it.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PACKAGE="$HERE/overlay/vllm/entrypoints/generate/decisions"
PY=${PYTHON:-python3}
MODE=copy
CANVAS=0
RAY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --python) PY=${2:?--python needs a path}; shift 2 ;;
    --dev) MODE=dev; shift ;;
    --uninstall) MODE=uninstall; shift ;;
    --with-canvas) CANVAS=1; shift ;;
    --with-ray) RAY=1; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
fail() { echo "install.sh: $*" >&2; exit 1; }
say() { echo "install.sh: $*"; }

command -v patch >/dev/null || fail "the 'patch' program is needed (apt-get install patch)"
FOUND=$("$PY" -c 'import os, vllm; print(vllm.__version__); print(os.path.dirname(os.path.dirname(vllm.__file__)))' 2>/dev/null) \
  || fail "'$PY' can't import vllm; activate the environment that has vLLM 0.30 or pass --python"
VERSION=$(sed -n 1p <<<"$FOUND"); SITE=$(sed -n 2p <<<"$FOUND")
# Each version's patch set, by role: the router, the Laya model, the canvas read (vLLM 0.30 only: 0.32
# has its own) and the fp32 read, which applies to both as it is.
case "$VERSION" in
  0.30.*) ROUTER=api-router-wire-v0.30 LAYA=00584-laya-for-decision-v0.30 CANVAS_READ=00572-diffusion-canvas-read-v0.30 ;;
  0.32.*) ROUTER=api-router-wire-v0.32 LAYA=00584-laya-for-decision-v0.32 CANVAS_READ= ;;
  *) fail "found vLLM $VERSION at $SITE; this overlay installs into vLLM 0.30.x and 0.32.x (docs/install.md)" ;;
esac
TARGET="$SITE/vllm/entrypoints/generate/decisions"
[ -w "$SITE/vllm" ] || fail "$SITE/vllm is not writable"
if [ "$RAY" = 1 ] && [ "$MODE" != uninstall ]; then  # first, so a failure leaves vLLM untouched
  "$PY" -m pip install -q -r "$HERE/tools/env/requirements-ray.txt" || fail "pip could not install Ray Data (above)"
  say "Ray Data installed: $("$PY" -c 'import ray; print("ray", ray.__version__)')"
fi

# The patches, each with a copy of itself as applied, so a later version of this overlay can take it back
# out first: the router patch, the model patch for Laya decision models (LayaForDecision) and the
# fp32 read patch (index 3).
# The canvas patch (index 2) goes in only with --with-canvas on 0.30; an earlier install's stays until --uninstall.
PATCHES=("$HERE/patches/$ROUTER.patch" "$HERE/patches/$LAYA.patch"
         "$HERE/patches/${CANVAS_READ:-00572-diffusion-canvas-read-v0.30}.patch" "$HERE/patches/exact-logprobs-v0.30.patch")
RECORDS=("$SITE/vllm/entrypoints/generate/.decisions-router.patch" "$SITE/vllm/model_executor/models/.laya-decision.patch"
         "$SITE/vllm/v1/sample/.canvas-read.patch" "$SITE/vllm/v1/sample/.exact-logprobs.patch")
WANTED=(0 1 3)
if [ "$CANVAS" = 1 ]; then
  if [ -n "$CANVAS_READ" ]; then WANTED+=(2)
  else say "vLLM $VERSION reads DiffusionGemma canvases itself (its diffusion_* sampling arguments): no canvas patch"; fi
fi
patch_state() {  # $1: a patch file; prints applied | stock | conflict
  if (cd "$SITE" && patch -p1 -R --dry-run -s -f --fuzz=0 <"$1" >/dev/null 2>&1); then echo applied
  elif (cd "$SITE" && patch -p1 --dry-run -s -f --fuzz=0 <"$1" >/dev/null 2>&1); then echo stock
  else echo conflict; fi
}
run_patch() { local file=$1; shift; (cd "$SITE" && patch -p1 -s -f -E --fuzz=0 --no-backup-if-mismatch "$@" <"$file"); }
current_patch() {  # $1: index; the version vLLM carries now: the one recorded at install time, else ours
  if [ -f "${RECORDS[$1]}" ]; then echo "${RECORDS[$1]}"; else echo "${PATCHES[$1]}"; fi
}

if [ "$MODE" = uninstall ]; then
  for i in "${!PATCHES[@]}"; do  # the optional canvas patch matters only where an install recorded it
    [ "$i" = 2 ] && [ ! -f "${RECORDS[$i]}" ] && continue
    [ "$(patch_state "$(current_patch "$i")")" = conflict ] \
      && fail "vLLM's files patched by $(basename "${PATCHES[$i]}") at $SITE differ from both stock and patched; not touching them"
  done
  [ -e "$TARGET" ] || [ -L "$TARGET" ] && { rm -rf "$TARGET"; say "removed $TARGET"; }
  for i in "${!PATCHES[@]}"; do
    [ "$i" = 2 ] && [ ! -f "${RECORDS[$i]}" ] && continue
    CURRENT=$(current_patch "$i")
    [ "$(patch_state "$CURRENT")" = applied ] && { run_patch "$CURRENT" -R; say "reversed $(basename "${PATCHES[$i]}")"; }
    rm -f "${RECORDS[$i]}"
  done
  say "vLLM $VERSION at $SITE is stock"
  exit 0
fi

REVERSED=() APPLIED=() STAGE= ASIDE= PLACED=0
cleanup() {  # on failure, undo what this run did
  local rc=$? i
  if [ $rc -ne 0 ]; then
    [ -n "$STAGE" ] && rm -rf "$STAGE"
    [ "$PLACED" = 1 ] && rm -rf "$TARGET"
    [ -n "$ASIDE" ] && mv "$ASIDE" "$TARGET"
    for ((i = ${#APPLIED[@]} - 1; i >= 0; i--)); do run_patch "${APPLIED[$i]}" -R; done
    for i in "${REVERSED[@]}"; do run_patch "$i"; done
  fi
  exit $rc
}
trap cleanup EXIT
for i in "${WANTED[@]}"; do
  PATCH=${PATCHES[$i]} CURRENT=$(current_patch "$i") NAME=$(basename "${PATCHES[$i]}")
  STATE=$(patch_state "$CURRENT")
  [ "$STATE" = conflict ] && fail "$NAME does not apply to vLLM $VERSION at $SITE (files modified?)"
  if [ "$STATE" = applied ] && ! cmp -s "$CURRENT" "$PATCH"; then
    run_patch "$CURRENT" -R; REVERSED+=("$CURRENT"); STATE=stock; say "took out the previous version of $NAME"
    [ "$(patch_state "$PATCH")" = stock ] || fail "$NAME does not apply to vLLM $VERSION at $SITE"
  fi
  if [ "$STATE" = stock ]; then run_patch "$PATCH"; APPLIED+=("$PATCH"); say "applied $NAME"; fi
done
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
for i in "${WANTED[@]}"; do cmp -s "${PATCHES[$i]}" "${RECORDS[$i]}" 2>/dev/null || cp "${PATCHES[$i]}" "${RECORDS[$i]}"; done
[ -n "$ASIDE" ] && rm -rf "$ASIDE"
ASIDE=
say "typed decisions installed into vLLM $VERSION at $SITE (enable with VLLM_ENABLE_TYPED_DECISIONS=1)"
