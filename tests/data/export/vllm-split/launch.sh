#!/usr/bin/env bash
# splitplan export --to vllm: deepseek-ai/DeepSeek-V3, written for vllm 0.31.0 and vllm-router 0.1.17.
# Plan: TMP/plan.json. Run `./launch.sh NAME` on the machine of each entry below, and `./launch.sh router`.
# Set each *_HOST variable to that worker's (first) machine address first.
set -euo pipefail

case "${1:-}" in
  prefill-h200-141gb-tp8-0)  # GPUs 0,1,2,3,4,5,6,7 of its machine; worker prefill-h200-141gb-tp8-0
    export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
    vllm serve deepseek-ai/DeepSeek-V3 --tensor-parallel-size 8 --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}' --kv-cache-dtype fp8 --max-num-batched-tokens 2048 --max-num-seqs 1024 --host 0.0.0.0 --port 8100
    ;;
  prefill-h200-141gb-tp8-1)  # GPUs 0,1,2,3,4,5,6,7 of its machine; worker prefill-h200-141gb-tp8-1
    export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
    vllm serve deepseek-ai/DeepSeek-V3 --tensor-parallel-size 8 --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}' --kv-cache-dtype fp8 --max-num-batched-tokens 2048 --max-num-seqs 1024 --host 0.0.0.0 --port 8100
    ;;
  decode-h200-141gb-dp16ep16-0-node0)  # GPUs 0,1,2,3,4,5,6,7 of its machine; worker decode-h200-141gb-dp16ep16-0
    export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
    vllm serve deepseek-ai/DeepSeek-V3 --tensor-parallel-size 1 --data-parallel-size 16 --enable-expert-parallel --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}' --kv-cache-dtype fp8 --max-num-batched-tokens 128 --max-num-seqs 64 --host 0.0.0.0 --port 8100 --data-parallel-size-local 8 --data-parallel-address "${DECODE_H200_141GB_DP16EP16_0_HOST}" --data-parallel-rpc-port 13345
    ;;
  decode-h200-141gb-dp16ep16-0-node1)  # GPUs 0,1,2,3,4,5,6,7 of its machine; worker decode-h200-141gb-dp16ep16-0
    export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
    vllm serve deepseek-ai/DeepSeek-V3 --tensor-parallel-size 1 --data-parallel-size 16 --enable-expert-parallel --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}' --kv-cache-dtype fp8 --max-num-batched-tokens 128 --max-num-seqs 64 --host 0.0.0.0 --port 8100 --data-parallel-size-local 8 --data-parallel-address "${DECODE_H200_141GB_DP16EP16_0_HOST}" --data-parallel-rpc-port 13345 --headless --data-parallel-start-rank 8
    ;;
  router)
    vllm-router --vllm-pd-disaggregation --prefill "http://${PREFILL_H200_141GB_TP8_0_HOST}:8100" --prefill "http://${PREFILL_H200_141GB_TP8_1_HOST}:8100" --decode "http://${DECODE_H200_141GB_DP16EP16_0_HOST}:8100" --host 0.0.0.0 --port 8000
    ;;
  *)
    echo "usage: $0 {prefill-h200-141gb-tp8-0|prefill-h200-141gb-tp8-1|decode-h200-141gb-dp16ep16-0-node0|decode-h200-141gb-dp16ep16-0-node1|router}" >&2
    exit 2
    ;;
esac
