#!/usr/bin/env bash
# splitplan export --to vllm: meta-llama/Llama-3.1-70B-Instruct, written for vllm 0.31.0 and vllm-router 0.1.17.
# Plan: TMP/plan.json. Run `./launch.sh NAME` on the machine of each entry below, and `./launch.sh router`.
# Set each *_HOST variable to that worker's (first) machine address first.
set -euo pipefail

case "${1:-}" in
  worker-h100-80gb-tp4-0)  # GPUs 0,1,2,3 of its machine; worker worker-h100-80gb-tp4-0
    export CUDA_VISIBLE_DEVICES=0,1,2,3
    vllm serve meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 4 --quantization fp8 --kv-cache-dtype fp8 --max-num-batched-tokens 2048 --max-num-seqs 1024 --host 0.0.0.0 --port 8100
    ;;
  worker-h100-80gb-tp4-1)  # GPUs 4,5,6,7 of its machine; worker worker-h100-80gb-tp4-1
    export CUDA_VISIBLE_DEVICES=4,5,6,7
    vllm serve meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 4 --quantization fp8 --kv-cache-dtype fp8 --max-num-batched-tokens 2048 --max-num-seqs 1024 --host 0.0.0.0 --port 8101
    ;;
  router)
    vllm-router --worker-urls "http://${WORKER_H100_80GB_TP4_0_HOST}:8100" "http://${WORKER_H100_80GB_TP4_1_HOST}:8101" --host 0.0.0.0 --port 8000
    ;;
  *)
    echo "usage: $0 {worker-h100-80gb-tp4-0|worker-h100-80gb-tp4-1|router}" >&2
    exit 2
    ;;
esac
