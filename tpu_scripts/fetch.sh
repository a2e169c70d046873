#!/usr/bin/env bash
# Copies the results directory back from worker 0 (where process 0 gathers and writes results).
# Usage: tpu_scripts/fetch.sh [--dry-run] [LOCAL_DIR]   (default LOCAL_DIR: ./runs-$TPU_NAME)
source "$(dirname "$0")/config.sh"
parse_common_args "$@"
set -- "${ARGS[@]}"
require_settings
zone_flags
dest=${1:-runs-$TPU_NAME}
run mkdir -p "$dest"
run gcloud compute tpus tpu-vm scp --recurse "$TPU_NAME:$TPU_REMOTE_DIR/$TPU_RESULTS" "$dest" "${ZONE_FLAGS[@]}" --worker=0
