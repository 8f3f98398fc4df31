# Sourced by tests/cluster/cluster.sh and tests/node/node.sh: messages and stopping processes.
# Set KD_LOG_PREFIX (the script's name in its messages) before sourcing.

log() { printf '%s: %s\n' "$KD_LOG_PREFIX" "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

alive() { [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null; }

# Stops a process: SIGTERM, then SIGKILL after a grace (in seconds, default 5), and waits until
# it is gone. kube-apiserver sometimes lingers for a while after it stopped serving.
stop_pid() { # pid name [grace seconds]
  local pid=$1 name=$2 grace=${3:-5}
  alive "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 $((grace * 10))); do
    alive "$pid" || return 0
    sleep 0.1
  done
  log "$name (pid $pid) still running ${grace} s after SIGTERM; killing it"
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    alive "$pid" || return 0
    sleep 0.1
  done
  die "$name (pid $pid) is still running after SIGKILL"
}
