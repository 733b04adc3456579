#!/usr/bin/env bash
# A packaged repository served by `trtspec serve`, driven by clients trtspec did not write:
#   * NVIDIA's end_to_end_grpc_client.py (tensorrtllm_backend c2e65b8), streaming and not, on
#     `ensemble` and NVIDIA's text-level `tensorrt_llm_bls`;
#   * the `openai` package on the OpenAI-compatible port (completions, streamed, and chat);
#   * genai-perf 0.0.16 (perf_analyzer 2.51) on `ensemble`, streaming, output length pinned
#     (--output-tokens-mean-deterministic: it sends min_length);
# and trtspec's own client on the same prompt, for the texts to be compared. Not run in CI (needs
# NVIDIA's scripts, fetched once, and genai-perf's venv).
#
#   git -C tensorrtllm_backend checkout c2e65b8      # or: git show c2e65b8:inflight_batcher_llm/client/... > DIR/
#   python3 -m venv .venv-perf && .venv-perf/bin/pip install genai-perf==0.0.16 'tritonclient[all]==2.51.0' 'pandas<2.3'
#   scripts/third_party_clients.sh REPO NVIDIA_CLIENT_DIR TOKENIZER [OUT]
#
# e.g. scripts/third_party_clients.sh runs/qwen-coder-cpu/package/repository \
#        tensorrtllm_backend/inflight_batcher_llm/client models/qwen2.5-coder-1.5b-instruct
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
REPO=${1:?usage: $0 REPO NVIDIA_CLIENT_DIR TOKENIZER [OUT]}
NV=${2:?NVIDIA_CLIENT_DIR: the folder with end_to_end_grpc_client.py}
TOKENIZER=$(cd "${3:?TOKENIZER: the HF folder of the target}" && pwd)
OUT=${4:-$ROOT/bench/results/third_party_clients}
PY=$ROOT/.venv/bin/python
PERF=$ROOT/.venv-perf
mkdir -p "$OUT"
"$ROOT/.venv/bin/trtspec" serve "$REPO" --json --openai-port 0 --probe-every 0 > "$OUT/serve.json" 2> "$OUT/serve.err" &
SPID=$!
trap 'kill -TERM $SPID 2>/dev/null; wait $SPID' EXIT
for _ in $(seq 1 600); do [ -s "$OUT/serve.json" ] && break; kill -0 $SPID 2>/dev/null || { cat "$OUT/serve.err"; exit 2; }; sleep 1; done
GRPC=$($PY -c "import json,sys; print(json.loads(open(sys.argv[1]).readline())['grpc'])" "$OUT/serve.json")
OAI=$($PY -c "import json,sys; print(json.loads(open(sys.argv[1]).readline())['openai'])" "$OUT/serve.json")
PROMPT=$(printf 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n')
echo "served: gRPC $GRPC, OpenAI $OAI"

echo "== NVIDIA end_to_end_grpc_client.py"
for args in "ensemble --streaming" "ensemble" "tensorrt_llm_bls --streaming"; do
  set -- $args
  $PY "$NV/end_to_end_grpc_client.py" -u "$GRPC" -p "$PROMPT" -o 48 --model-name "$@" > "$OUT/nvidia_${1}${2:+_stream}.txt" 2>&1
  echo "$args: exit $?"
done

echo "== trtspec's client"
$PY - "$GRPC" "$PROMPT" > "$OUT/trtspec_client.txt" <<'PY'
import sys
from trtspec.client import LLMClient, Sampling
with LLMClient(sys.argv[1]) as c:
    for m in ("ensemble", "ensemble_baseline"):
        print(m, repr(c.generate(sys.argv[2], Sampling(max_tokens=48), model=m).text))
PY
cat "$OUT/trtspec_client.txt"

echo "== openai package"
$PY - "$OAI" "$PROMPT" > "$OUT/openai.txt" 2>&1 <<'PY'
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1], api_key="unused")
print("models", [m.id for m in c.models.list().data])
for model in ("ensemble", "ensemble_baseline"):
    r = c.completions.create(model=model, prompt=sys.argv[2], max_tokens=48, temperature=0)
    print(model, "completion", repr(r.choices[0].text), r.usage.completion_tokens)
    s = c.completions.create(model=model, prompt=sys.argv[2], max_tokens=48, temperature=0, stream=True)
    print(model, "streamed", repr("".join(ch.choices[0].text for ch in s)))
ch = c.chat.completions.create(model="ensemble", max_tokens=48, temperature=0,
                               messages=[{"role": "user", "content": "Write a Python function that reverses a string."}])
print("chat", repr(ch.choices[0].message.content))
PY
echo "exit $?"; cat "$OUT/openai.txt"

echo "== genai-perf 0.0.16"
LIBS=$($PY -c "from trtspec.triton.launch.paths import pytriton_dist; print(pytriton_dist().parent.parent / 'nvidia_pytriton.libs')")
mkdir -p "$PERF/palibs"
ln -sf "$(ls "$LIBS"/libb64-*.so.0d | head -1)" "$PERF/palibs/libb64.so.0d"
ln -sf "$(ls "$LIBS"/libcudart-*.so.12* | head -1)" "$PERF/palibs/libcudart.so.12"
(cd "$OUT" && PATH="$PERF/bin:$PATH" LD_LIBRARY_PATH="$PERF/palibs" "$PERF/bin/genai-perf" profile -m ensemble \
   --endpoint-type kserve --backend tensorrtllm -u "$GRPC" --streaming --concurrency 1 --request-count 8 \
   --warmup-request-count 2 --random-seed 0 --synthetic-input-tokens-mean 64 --synthetic-input-tokens-stddev 0 \
   --output-tokens-mean 48 --output-tokens-mean-deterministic --tokenizer "$TOKENIZER" > genai_perf.txt 2>&1)
echo "exit $?"
cat "$OUT"/artifacts/*/profile_export_genai_perf.csv 2>/dev/null
