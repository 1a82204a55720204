#!/usr/bin/env bash
# The Python sources of a vLLM release that can't be installed here (0.33.0 ships for GPUs only), for
# tests/install/test_vllm_versions.py's static checks: the wheel from PyPI (pip checks its hash), its
# vllm/**/*.py unpacked into a cache folder. Prints the folder; a second run returns at once.
# usage: tools/env/vllm_sources.sh VERSION
# env:   DECISIONS_MODELS (default: ~/.cache/vllm-decisions/models); the sources go beside it
set -euo pipefail
VERSION=${1:?usage: vllm_sources.sh VERSION}
CACHE=$(dirname "${DECISIONS_MODELS:-$HOME/.cache/vllm-decisions/models}")/vllm-sources
DEST="$CACHE/$VERSION"
if [ ! -f "$DEST/.complete" ]; then
  T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
  echo "[vllm-sources] downloading the vllm==$VERSION wheel (about 340 MB) for its sources" >&2
  "${PYTHON:-python3}" -m pip download -q --no-deps --only-binary :all: --python-version 3.11 --platform manylinux_2_28_x86_64 \
    -d "$T" "vllm==$VERSION" 2> >(grep -v '^WARNING: Location' >&2)
  rm -rf "$DEST"; mkdir -p "$DEST"
  unzip -q -o "$T"/vllm-"$VERSION"-*.whl 'vllm/*.py' -d "$DEST"
  touch "$DEST/.complete"
fi
echo "$DEST"
