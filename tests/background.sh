# Sourced by tests/run-tests.sh and tests/nextest-phases.sh: runs work beside the foreground.
#
# niced NICE COMMAND...
#   runs COMMAND in a session of its own (so that it can be stopped as a group: kill -- -PID,
#   and pkill -s PID for what started process groups of its own) at nice value NICE. A session
#   is a scheduling group of its own where the kernel groups sessions (sched_autogroup): the
#   group's nice value, not only the processes', says how much CPU it may take from the
#   foreground's group, so the group's is set too.
niced() {
  local nice=$1
  shift
  setsid bash -c 'echo "$0" >/proc/self/autogroup 2>/dev/null; exec nice -n "$0" "$@"' "$nice" "$@"
}

# stop_session PID: stops a job niced started, with everything it started.
stop_session() {
  kill -- "-$1" 2>/dev/null || true
  pkill -TERM -s "$1" 2>/dev/null || true
}
