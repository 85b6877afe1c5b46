#!/usr/bin/env bash
# Runs the service in the background, for trying it by hand (README, "Using
# the service"):
#   scripts/serve.sh          bring up the servers if needed, build in release mode
#                             if needed, start `seckill serve`, and return once
#                             /readyz answers (or show why the service stopped)
#   scripts/serve.sh stop     stop the service this script started
#   scripts/serve.sh status   say whether it runs
#
# The service reads its configuration from the environment (README,
# Configuration): by default it listens on 127.0.0.1:8080 (SECKILL_ADDR) and
# uses the database `seckill` (DATABASE_URL). SECKILL_BIN names a seckill
# binary to run instead of building target/release/seckill. The log and the
# process id are target/serve/seckill-PORT.log and .pid.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

addr="${SECKILL_ADDR:-127.0.0.1:8080}"
port="${addr##*:}"
dir=target/serve
pidfile="$dir/seckill-$port.pid"
log="$dir/seckill-$port.log"

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

start() {
  if running; then
    echo "seckill already serves on http://$addr (pid $(cat "$pidfile")); stop it with: scripts/serve.sh stop"
    return 0
  fi
  bash scripts/services.sh up >&2
  local bin="${SECKILL_BIN:-}"
  if [ -z "$bin" ]; then
    . scripts/release-build.sh
    release_build
    bin=target/release/seckill
  fi
  mkdir -p "$dir"
  # Without an admin token of its own, a try on this machine runs in
  # development mode: loopback only, the admin routes accept dev-admin-token.
  if [ -z "${SECKILL_ADMIN_TOKEN:-}" ] && [ -z "${SECKILL_ADMIN_TOKEN_FILE:-}" ]; then
    export SECKILL_DEV=1
  fi
  # Detached from this shell's terminal and pipes: it outlives the script.
  nohup "$bin" serve >"$log" 2>&1 </dev/null &
  echo $! >"$pidfile"
  for _ in $(seq 600); do
    if curl -fs -o /dev/null --max-time 2 "http://$addr/readyz"; then
      echo "seckill serves on http://$addr (pid $(cat "$pidfile"), log $log); stop it with: scripts/serve.sh stop"
      return 0
    fi
    if ! running; then
      echo "seckill stopped before it was ready; the end of $log:" >&2
      tail -n 20 "$log" >&2
      rm -f "$pidfile"
      return 1
    fi
    sleep 0.1
  done
  echo "seckill did not become ready within 60 s; see $log (scripts/serve.sh stop stops it)" >&2
  return 1
}

stop() {
  if ! running; then
    rm -f "$pidfile"
    echo "no seckill started by scripts/serve.sh runs on port $port"
    return 0
  fi
  local pid
  pid=$(cat "$pidfile")
  kill -TERM "$pid"
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  rm -f "$pidfile"
  echo "seckill (pid $pid) stopped"
}

status() {
  if running; then echo "seckill serves on http://$addr (pid $(cat "$pidfile"))"; else echo "no seckill started by scripts/serve.sh runs on port $port"; fi
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: scripts/serve.sh [start|stop|status]" >&2; exit 2 ;;
esac
