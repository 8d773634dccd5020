#!/usr/bin/env bash
# Progress lines for the slow steps of ./dev and the image builds, on
# stderr, one line at a time (no carriage returns, so CI logs stay
# readable). Source it; then:
#   step "what starts"                 a line with the time since the script began
#   with_progress LABEL CMD [ARGS...]  run CMD with its output in a log; every
#                                      $SBX_PROGRESS_SECS (10) s print how long it has
#                                      run and its last output line; on failure print
#                                      the log's last 40 lines; CMD's exit status
_progress_t0=${_progress_t0:-$SECONDS}

step() {
  printf '[%s +%ds] %s\n' "${0##*/}" "$((SECONDS - _progress_t0))" "$*" >&2
}

with_progress() {
  local label=$1; shift
  local log every=${SBX_PROGRESS_SECS:-10} start=$SECONDS pid ticker status
  log=$(mktemp "/tmp/sbxlua-${label//[^A-Za-z0-9]/-}.XXXXXX.log")
  step "$label: started (log: $log)"
  "$@" >"$log" 2>&1 &
  pid=$!
  (
    while sleep "$every"; do
      kill -0 "$pid" 2>/dev/null || exit 0
      last=$(tail -n 1 "$log" 2>/dev/null | tr -d '\r' | cut -c1-120)
      step "$label: $((SECONDS - start)) s${last:+, last: $last}"
    done
  ) &
  ticker=$!
  status=0
  wait "$pid" || status=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  if [ "$status" -eq 0 ]; then
    step "$label: done in $((SECONDS - start)) s"
    rm -f "$log"
  else
    step "$label: FAILED (exit $status) after $((SECONDS - start)) s; the end of $log:"
    tail -n 40 "$log" >&2
  fi
  return "$status"
}
