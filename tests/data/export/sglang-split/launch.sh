#!/usr/bin/env bash
# splitplan export --to sglang: deepseek-ai/DeepSeek-V3, written for sglang 0.5.21 and sglang-router 0.3.2.
# Plan: TMP/plan.json. Run `./launch.sh NAME` on the machine of each entry below, and `./launch.sh router`.
# Set each *_HOST variable to that worker's (first) machine address first.
set -euo pipefail

case "${1:-}" in
  prefill-h200-141gb-tp8-0)  # GPUs 0,1,2,3,4,5,6,7 of its machine; worker prefill-h200-141gb-tp8-0
    export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
    python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --served-model-name deepseek-ai/DeepSeek-V3 --tp-size 8 --disaggregation-mode prefill --disaggregation-transfer-backend nixl --kv-cache-dtype fp8_e4m3 --chunked-prefill-size 2048 --host 0.0.0.0 --port 8100 --disaggregation-bootstrap-port 8998
    ;;
  prefill-h200-141gb-tp8-1)  # GPUs 0,1,2,3,4,5,6,7 of its machine; worker prefill-h200-141gb-tp8-1
    export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
    python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --served-model-name deepseek-ai/DeepSeek-V3 --tp-size 8 --disaggregation-mode prefill --disaggregation-transfer-backend nixl --kv-cache-dtype fp8_e4m3 --chunked-prefill-size 2048 --host 0.0.0.0 --port 8100 --disaggregation-bootstrap-port 8998
    ;;
  decode-h200-141gb-dp16ep16-0-node0)  # GPUs 0,1,2,3,4,5,6,7 of its machine; worker decode-h200-141gb-dp16ep16-0
    export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
    python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --served-model-name deepseek-ai/DeepSeek-V3 --tp-size 16 --dp-size 16 --enable-dp-attention --ep-size 16 --disaggregation-mode decode --disaggregation-transfer-backend nixl --kv-cache-dtype fp8_e4m3 --chunked-prefill-size 2048 --host 0.0.0.0 --port 8100 --disaggregation-bootstrap-port 8998 --nnodes 2 --node-rank 0 --dist-init-addr "${DECODE_H200_141GB_DP16EP16_0_HOST}:5000"
    ;;
  decode-h200-141gb-dp16ep16-0-node1)  # GPUs 0,1,2,3,4,5,6,7 of its machine; worker decode-h200-141gb-dp16ep16-0
    export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
    python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --served-model-name deepseek-ai/DeepSeek-V3 --tp-size 16 --dp-size 16 --enable-dp-attention --ep-size 16 --disaggregation-mode decode --disaggregation-transfer-backend nixl --kv-cache-dtype fp8_e4m3 --chunked-prefill-size 2048 --host 0.0.0.0 --port 8100 --disaggregation-bootstrap-port 8998 --nnodes 2 --node-rank 1 --dist-init-addr "${DECODE_H200_141GB_DP16EP16_0_HOST}:5000"
    ;;
  router)
    python3 -m sglang_router.launch_router --pd-disaggregation --prefill "http://${PREFILL_H200_141GB_TP8_0_HOST}:8100" 8998 --prefill "http://${PREFILL_H200_141GB_TP8_1_HOST}:8100" 8998 --decode "http://${DECODE_H200_141GB_DP16EP16_0_HOST}:8100" --host 0.0.0.0 --port 8000
    ;;
  *)
    echo "usage: $0 {prefill-h200-141gb-tp8-0|prefill-h200-141gb-tp8-1|decode-h200-141gb-dp16ep16-0-node0|decode-h200-141gb-dp16ep16-0-node1|router}" >&2
    exit 2
    ;;
esac
