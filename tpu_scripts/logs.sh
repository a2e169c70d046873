#!/usr/bin/env bash
# Streams a job's log from every worker (Ctrl-C to stop).
# Usage: tpu_scripts/logs.sh [--dry-run] JOB
source "$(dirname "$0")/config.sh"
parse_common_args "$@"
set -- "${ARGS[@]}"
require_settings
[[ $# -eq 1 ]] || die "usage: logs.sh JOB"
on_all_workers "tail -n 200 -F $TPU_REMOTE_DIR/logs/$1.log"
