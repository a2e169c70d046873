#!/usr/bin/env bash
# Copies the committed project to every worker and installs it with JAX for TPU in a virtualenv.
# Usage: tpu_scripts/install.sh [--dry-run]
source "$(dirname "$0")/config.sh"
parse_common_args "$@"
require_settings
zone_flags

archive=${TMPDIR:-/tmp}/jaxsample-src.tar.gz
run git -C "$REPO_ROOT" archive --format=tar.gz --output="$archive" HEAD
run gcloud compute tpus tpu-vm scp "$archive" "$TPU_NAME:jaxsample-src.tar.gz" "${ZONE_FLAGS[@]}" --worker=all
on_all_workers "set -e; mkdir -p $TPU_REMOTE_DIR && tar -xzf jaxsample-src.tar.gz -C $TPU_REMOTE_DIR \
&& cd $TPU_REMOTE_DIR && python3 -m venv .venv && .venv/bin/pip install --quiet --upgrade pip \
&& .venv/bin/pip install --quiet 'jax[tpu]' && .venv/bin/pip install --quiet -e '.[all]' \
&& .venv/bin/python -c 'import jax; print(jax.process_index(), jax.local_device_count(), jax.device_count())'"
