# shellcheck shell=bash
# Shared settings and helpers for the tpu_scripts. Sourced, never executed.
#
# Settings (environment variables):
#   TPU_NAME         TPU VM / node name (required)
#   TPU_ZONE         zone, e.g. us-central2-b (required)
#   TPU_PROJECT      GCP project (default: gcloud's configured project)
#   TPU_TYPE         accelerator type (default: v4-8)
#   TPU_RUNTIME      TPU software version (default: tpu-ubuntu2204-base)
#   TPU_QUEUED       1 = go through a queued resource named "$TPU_NAME-qr" (default: 0)
#   TPU_SPOT         1 = spot capacity (default: 0)
#   TPU_REMOTE_DIR   project directory on every worker (default: jaxsample, relative to $HOME)
#   TPU_RESULTS      results directory inside TPU_REMOTE_DIR copied back by fetch.sh (default: runs)
#   DRY_RUN          1 = print the exact commands instead of running them (same as --dry-run)

set -euo pipefail

TPU_TYPE=${TPU_TYPE:-v4-8}
TPU_RUNTIME=${TPU_RUNTIME:-tpu-ubuntu2204-base}
TPU_QUEUED=${TPU_QUEUED:-0}
TPU_SPOT=${TPU_SPOT:-0}
TPU_REMOTE_DIR=${TPU_REMOTE_DIR:-jaxsample}
TPU_RESULTS=${TPU_RESULTS:-runs}
DRY_RUN=${DRY_RUN:-0}
TPU_SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck disable=SC2034  # used by install.sh
REPO_ROOT=$(cd "$TPU_SCRIPTS_DIR/.." && pwd)

die() {
  echo "error: $*" >&2
  exit 2
}

# Consumes a leading --dry-run / -n flag; the remaining arguments are left in ARGS.
parse_common_args() {
  ARGS=()
  for arg in "$@"; do
    case "$arg" in
      --dry-run | -n) DRY_RUN=1 ;;
      *) ARGS+=("$arg") ;;
    esac
  done
}

require_settings() {
  [[ -n "${TPU_NAME:-}" ]] || die "TPU_NAME is not set (name of the TPU VM)"
  [[ -n "${TPU_ZONE:-}" ]] || die "TPU_ZONE is not set (e.g. us-central2-b)"
  [[ "$TPU_QUEUED" == 0 || "$TPU_QUEUED" == 1 ]] || die "TPU_QUEUED must be 0 or 1, got '$TPU_QUEUED'"
  [[ "$TPU_SPOT" == 0 || "$TPU_SPOT" == 1 ]] || die "TPU_SPOT must be 0 or 1, got '$TPU_SPOT'"
  [[ "$TPU_REMOTE_DIR" != /* && "$TPU_REMOTE_DIR" != *..* ]] || die "TPU_REMOTE_DIR must be relative to \$HOME"
}

# Flags every gcloud TPU command takes.
zone_flags() {
  ZONE_FLAGS=("--zone=$TPU_ZONE")
  if [[ -n "${TPU_PROJECT:-}" ]]; then
    ZONE_FLAGS+=("--project=$TPU_PROJECT")
  fi
}

# Runs a command, or prints it shell-quoted under DRY_RUN=1.
run() {
  if [[ "$DRY_RUN" == 1 ]]; then
    printf '+'
    printf ' %q' "$@"
    printf '\n'
  else
    "$@"
  fi
}

# Runs a shell command on every worker of the TPU VM, streaming its output.
on_all_workers() {
  zone_flags
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${ZONE_FLAGS[@]}" --worker=all --command="$1"
}
