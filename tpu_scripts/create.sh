#!/usr/bin/env bash
# Creates the TPU VM (directly, or through a queued resource with TPU_QUEUED=1) and waits until it is ready.
# Usage: tpu_scripts/create.sh [--dry-run]
source "$(dirname "$0")/config.sh"
parse_common_args "$@"
require_settings
zone_flags

capacity=()
if [[ "$TPU_SPOT" == 1 ]]; then
  capacity=(--spot)
fi

if [[ "$TPU_QUEUED" == 1 ]]; then
  qr="$TPU_NAME-qr"
  run gcloud compute tpus queued-resources create "$qr" "${ZONE_FLAGS[@]}" \
    --node-id="$TPU_NAME" --accelerator-type="$TPU_TYPE" --runtime-version="$TPU_RUNTIME" "${capacity[@]}"
  if [[ "$DRY_RUN" == 1 ]]; then
    run gcloud compute tpus queued-resources describe "$qr" "${ZONE_FLAGS[@]}" --format='value(state.state)'
    exit 0
  fi
  while true; do
    state=$(gcloud compute tpus queued-resources describe "$qr" "${ZONE_FLAGS[@]}" --format='value(state.state)')
    echo "queued resource $qr: $state"
    case "$state" in
      ACTIVE) break ;;
      FAILED | SUSPENDED) die "queued resource $qr ended in state $state" ;;
    esac
    sleep 30
  done
else
  run gcloud compute tpus tpu-vm create "$TPU_NAME" "${ZONE_FLAGS[@]}" \
    --accelerator-type="$TPU_TYPE" --version="$TPU_RUNTIME" "${capacity[@]}"
fi
