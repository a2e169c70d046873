#!/usr/bin/env bash
# Launches the same job on every worker (multi-host JAX: each process calls jax.distributed.initialize(),
# which auto-detects the TPU pod), streaming the output and keeping a log on each worker.
# Usage: tpu_scripts/launch.sh [--dry-run] JOB [ARGS...]
#   JOB: data  -> wakong build ARGS        (BART text-infilling shards)
#        train -> python -m jaxsample train ARGS
#        eval  -> python -m jaxsample eval ARGS
#        demo  -> python -m jaxsample demo ARGS
#        run   -> ARGS is the command itself (run inside the project virtualenv)
source "$(dirname "$0")/config.sh"
parse_common_args "$@"
set -- "${ARGS[@]}"
require_settings
[[ $# -ge 1 ]] || die "missing JOB (data, train, eval, demo or run)"
job=$1
shift

case "$job" in
  data) cmd=(wakong build "$@") ;;
  train | eval | demo) cmd=(python -m jaxsample "$job" "$@") ;;
  run)
    [[ $# -ge 1 ]] || die "run needs a command"
    cmd=("$@")
    ;;
  *) die "unknown JOB '$job' (data, train, eval, demo or run)" ;;
esac

quoted=$(printf ' %q' "${cmd[@]}")
log="logs/$job.log"
on_all_workers "set -o pipefail; cd $TPU_REMOTE_DIR && mkdir -p logs && source .venv/bin/activate \
&& JAXSAMPLE_DISTRIBUTED=1${quoted} 2>&1 | tee -a $log"
