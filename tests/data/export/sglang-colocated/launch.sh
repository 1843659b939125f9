#!/usr/bin/env bash
# splitplan export --to sglang: meta-llama/Llama-3.1-70B-Instruct, written for sglang 0.5.21 and sglang-router 0.3.2.
# Plan: TMP/plan.json. Run `./launch.sh NAME` on the machine of each entry below, and `./launch.sh router`.
# Set each *_HOST variable to that worker's (first) machine address first.
set -euo pipefail

case "${1:-}" in
  worker-h100-80gb-tp4-0)  # GPUs 0,1,2,3 of its machine; worker worker-h100-80gb-tp4-0
    export CUDA_VISIBLE_DEVICES=0,1,2,3
    python3 -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B-Instruct --served-model-name meta-llama/Llama-3.1-70B-Instruct --tp-size 4 --quantization fp8 --kv-cache-dtype fp8_e4m3 --chunked-prefill-size 2048 --host 0.0.0.0 --port 8100
    ;;
  worker-h100-80gb-tp4-1)  # GPUs 4,5,6,7 of its machine; worker worker-h100-80gb-tp4-1
    export CUDA_VISIBLE_DEVICES=4,5,6,7
    python3 -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B-Instruct --served-model-name meta-llama/Llama-3.1-70B-Instruct --tp-size 4 --quantization fp8 --kv-cache-dtype fp8_e4m3 --chunked-prefill-size 2048 --host 0.0.0.0 --port 8101
    ;;
  router)
    python3 -m sglang_router.launch_router --worker-urls "http://${WORKER_H100_80GB_TP4_0_HOST}:8100" "http://${WORKER_H100_80GB_TP4_1_HOST}:8101" --host 0.0.0.0 --port 8000
    ;;
  *)
    echo "usage: $0 {worker-h100-80gb-tp4-0|worker-h100-80gb-tp4-1|router}" >&2
    exit 2
    ;;
esac
