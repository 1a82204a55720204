#!/usr/bin/env bash
# The main job from a fresh machine: set-up, install the overlay, serve the default model with
# decisions enabled, and answer a sample decision once the server is ready.
# usage: tools/serve.sh [--once] [extra vllm serve args...]
#   --once   stop the server after the sample answer (a smoke test)
# env: MODEL  a model folder or name as `vllm serve` takes it, or a short name for one that set-up builds:
#             qwen1.5b (the default): Qwen2.5-Coder-1.5B-Instruct (built on first use: a 1.1 GB download);
#             qwen: Qwen2.5-Coder-0.5B-Instruct; smollm2: SmolLM2-135M-Instruct (the tests' fast model)
#      PORT   default 8000
#      DECISIONS_VLLM_VERSION  0.30.0 (the default) or 0.32.0: which vLLM, each in its own environment
# The context is 8,192 tokens (a 255-option choice with short descriptions needs about 4,600); a later
# --max-model-len among the extra args wins, e.g. for a model with a shorter one.
set -euo pipefail
ONCE=0; [ "${1:-}" = --once ] && { ONCE=1; shift; }
MODEL=${MODEL:-qwen1.5b}
SETUP_MODELS=; [ "$MODEL" = qwen1.5b ] && SETUP_MODELS=qwen1.5b
source "$(dirname "$0")/env/common.sh"
# A short name is also the served model name, which requests name in `model` (README's examples: qwen1.5b).
NAMED=()
case "$MODEL" in
  qwen1.5b) MODEL=$MODELS/qwen2.5-coder-1.5b-instruct; NAMED=(--served-model-name qwen1.5b) ;;
  smollm2) MODEL=$MODELS/smollm2-135m-instruct; NAMED=(--served-model-name smollm2) ;;
  qwen) MODEL=$MODELS/qwen2.5-coder-0.5b-instruct; NAMED=(--served-model-name qwen) ;;
esac
PORT=${PORT:-8000}
ARGS=(--host 127.0.0.1 --port "$PORT" --max-model-len 8192 --enable-prefix-caching "${NAMED[@]}")
if [ -n "${TORCH_COMPILE_DISABLE:-}" ]; then
  # On CPU: bfloat16 where the CPU computes it natively (AVX-512 BF16 or AMX); elsewhere (AVX2 only) vLLM's
  # bf16 matmuls are emulated, about five times slower than float32 for SmolLM2.
  DTYPE=float32; grep -qw -e avx512_bf16 -e amx_bf16 /proc/cpuinfo 2>/dev/null && DTYPE=bfloat16
  ARGS+=(--enforce-eager --block-size 32 --dtype "$DTYPE")
fi
# tests/plugin claims Qwen2 models: tools/test.sh removes it when it ends, and this where a killed test
# run left it, so the server answers with the backend a user gets.
"$PY" -m pip uninstall -y -q decisions-test-plugin >/dev/null 2>&1 || true
VLLM_ENABLE_TYPED_DECISIONS=1 vllm serve "$MODEL" "${ARGS[@]}" "$@" >&2 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
echo "waiting for decisions on port $PORT (pid $SERVER)" >&2
# The sample decision carries the server's key where it has one: --api-key K among the extra args, or
# VLLM_API_KEY, which vllm serve reads too.
KEY=${VLLM_API_KEY:-}; PREVIOUS=
for arg in "$@"; do
  [ "$PREVIOUS" = --api-key ] && KEY=$arg
  case $arg in --api-key=*) KEY=${arg#--api-key=} ;; esac
  PREVIOUS=$arg
done
(cd "$ROOT" && VLLM_API_KEY=$KEY "$PY" -m tools.examples.sample_decision --port "$PORT" --wait 900 --server-pid "$SERVER")
if [ "$ONCE" = 1 ]; then exit 0; fi
echo "serving on http://127.0.0.1:$PORT (Ctrl-C stops)" >&2
wait $SERVER
