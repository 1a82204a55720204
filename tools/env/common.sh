# Shared by tools/serve.sh and tools/test.sh: set up the environment and install the overlay.
# Sourcing it sets VENV, MODELS, PY and the environment vLLM needs on CPU; SETUP_MODELS (optional) names the
# models set-up builds only when asked (setup.sh's arguments).
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
eval "$(bash "$ROOT/tools/env/setup.sh" ${SETUP_MODELS:-} | sed 's/^/export /')"
PY="$VENV/bin/python"
"$ROOT/install.sh" --python "$PY" >&2
export PATH="$VENV/bin:$PATH" HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
# vLLM on CPU: no torch.compile (40-60 s per start), a small KV cache.
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  export TORCH_COMPILE_DISABLE=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
fi
