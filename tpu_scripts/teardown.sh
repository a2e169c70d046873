#!/usr/bin/env bash
# Deletes the TPU VM (and its queued resource with TPU_QUEUED=1). Irreversible.
# Usage: tpu_scripts/teardown.sh [--dry-run]
source "$(dirname "$0")/config.sh"
parse_common_args "$@"
require_settings
zone_flags
if [[ "$TPU_QUEUED" == 1 ]]; then
  run gcloud compute tpus queued-resources delete "$TPU_NAME-qr" "${ZONE_FLAGS[@]}" --force --quiet
else
  run gcloud compute tpus tpu-vm delete "$TPU_NAME" "${ZONE_FLAGS[@]}" --quiet
fi
