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
# uses the database `seckill` (DATABASE_URL). On servers that
# scripts/services.sh started, it connects as their `seckill` accounts, with
# passwords (.services/service.env; use_service_accounts below). SECKILL_BIN names a seckill
# binary to run instead of building target/release/seckill. The log and the
# process ids are target/serve/seckill-PORT.log and .pid.
#
# SERVE_REPLICAS=N (N > 1) runs the layout of docker-compose.yml without
# Docker: N replicas on the next N ports (PORT+1 …), behind an HAProxy (the
# distribution's `haproxy` package) that listens on SECKILL_ADDR, round
# robin, each replica checked on /readyz every second. Each replica logs to
# target/serve/seckill-PORT-replica-I.log.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

addr="${SECKILL_ADDR:-127.0.0.1:8080}"
port="${addr##*:}"
dir=target/serve
pidfile="$dir/seckill-$port.pid"
log="$dir/seckill-$port.log"

replicas="${SERVE_REPLICAS:-1}"
host="${addr%:*}"

# Whether process $1 runs (a zombie, ended but not yet reaped, does not).
alive() {
  kill -0 "$1" 2>/dev/null && [ "$(ps -o stat= -p "$1" 2>/dev/null | cut -c1)" != Z ]
}

# Whether any process of the pidfile (one pid per line) runs.
running() {
  [ -f "$pidfile" ] || return 1
  local pid
  while read -r pid; do alive "$pid" && return 0; done <"$pidfile"
  return 1
}

# HAProxy's configuration for the replicas on ports PORT+1 … PORT+N.
haproxy_config() {
  printf 'global\n    maxconn 4000\n\ndefaults\n    mode http\n    timeout connect 2s\n'
  printf '    timeout client 60s\n    timeout server 60s\n    option http-keep-alive\n'
  # A request whose connection failed never reached a replica: sent again to another.
  printf '    retries 2\n    option redispatch 1\n    retry-on conn-failure\n\n'
  printf 'frontend buyers\n    bind %s\n    default_backend replicas\n\n' "$addr"
  printf 'backend replicas\n    balance roundrobin\n    option httpchk\n'
  printf '    http-check send meth GET uri /readyz\n'
  for i in $(seq "$replicas"); do
    printf '    server replica-%s %s:%s check inter 1s\n' "$i" "$host" $((port + i))
  done
}

# On the servers scripts/services.sh runs itself, the service connects with its own
# accounts, which have passwords (their URLs, written by that script to
# .services/service.env): for each of DATABASE_URL, REDIS_URL and AMQP_URL that is
# unset or names the same server and database (or virtual host) as the account's URL,
# user aside; the Redis and AMQP ones only with their default prefix (the accounts are
# limited to it). Otherwise the variables apply as they are.
use_service_accounts() {
  local file=.services/service.env name url
  [ -f "$file" ] || return 0
  without_user() { sed -E 's#://[^@/]*@#://#' <<<"$1"; }
  while IFS='=' read -r name url; do
    [ -z "${!name:-}" ] || [ "$(without_user "${!name}")" = "$(without_user "$url")" ] || continue
    case "$name" in
      REDIS_URL) [ "${SECKILL_REDIS_PREFIX:-seckill}" = seckill ] || continue ;;
      AMQP_URL) [ "${SECKILL_AMQP_PREFIX:-seckill}" = seckill ] || continue ;;
    esac
    export "$name=$url"
  done <"$file"
}

start() {
  if running; then
    status >/dev/null || { status; return 1; }
    echo "seckill already serves on http://$addr (pid $(tr '\n' ' ' <"$pidfile" | sed 's/ $//')); stop it with: scripts/serve.sh stop"
    return 0
  fi
  bash scripts/services.sh up >&2
  use_service_accounts
  local bin="${SECKILL_BIN:-}"
  if [ -z "$bin" ]; then
    . scripts/release-build.sh
    release_build
    bin=target/release/seckill
  fi
  mkdir -p "$dir"
  # Without an admin token of its own, a try on this machine runs in
  # development mode: loopback only, the admin routes accept dev-admin-token,
  # and without a buyer token key the buyer is the body's user_id.
  if [ -z "${SECKILL_ADMIN_TOKEN:-}" ] && [ -z "${SECKILL_ADMIN_TOKEN_FILE:-}" ]; then
    export SECKILL_DEV=1
  fi
  # Detached from this shell's terminal and pipes: they outlive the script.
  if [ "$replicas" -gt 1 ]; then
    command -v haproxy >/dev/null || { echo "SERVE_REPLICAS needs HAProxy: install the distribution's haproxy package" >&2; return 1; }
    : >"$pidfile"
    for i in $(seq "$replicas"); do
      SECKILL_ADDR="$host:$((port + i))" SECKILL_INSTANCE="replica-$i" \
        nohup "$bin" serve >"$dir/seckill-$port-replica-$i.log" 2>&1 </dev/null &
      echo $! >>"$pidfile"
    done
    haproxy_config >"$dir/haproxy-$port.cfg"
    nohup haproxy -db -f "$dir/haproxy-$port.cfg" >"$log" 2>&1 </dev/null &
    echo $! >>"$pidfile"
  else
    nohup "$bin" serve >"$log" 2>&1 </dev/null &
    echo $! >"$pidfile"
  fi
  for _ in $(seq 600); do
    if curl -fs -o /dev/null --max-time 2 "http://$addr/readyz"; then
      if [ "$replicas" -gt 1 ]; then
        # Every replica in rotation before saying so.
        for i in $(seq "$replicas"); do
          curl -fs -o /dev/null --max-time 2 "http://$host:$((port + i))/readyz" || continue 2
        done
        echo "seckill serves on http://$addr through HAProxy, $replicas replicas on ports $((port + 1))-$((port + replicas)) (logs target/serve/seckill-$port-replica-*.log); stop them with: scripts/serve.sh stop"
      else
        echo "seckill serves on http://$addr (pid $(cat "$pidfile"), log $log); stop it with: scripts/serve.sh stop"
      fi
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

# Sends SIGTERM to the pids given and waits up to 10 s for them to end;
# SIGKILL for any still running then.
terminate() {
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  for _ in $(seq 100); do
    local up=0 pid
    for pid in "$@"; do alive "$pid" && up=1; done
    [ "$up" = 1 ] || return 0
    sleep 0.1
  done
  echo "still running after 10 s, killed: $*" >&2
  kill -KILL "$@" 2>/dev/null || true
}

stop() {
  if ! running; then
    rm -f "$pidfile"
    echo "no seckill started by scripts/serve.sh runs on port $port"
    return 0
  fi
  local pids=() pid
  while read -r pid; do pids+=("$pid"); done <"$pidfile"
  if [ "${#pids[@]}" -gt 1 ]; then
    # The replicas first (each answers what it has in progress, as on any
    # SIGTERM), while HAProxy still carries their answers; HAProxy last.
    terminate "${pids[@]:0:${#pids[@]}-1}"
    terminate "${pids[-1]}"
  else
    terminate "${pids[@]}"
  fi
  rm -f "$pidfile"
  echo "seckill (pid ${pids[*]}) stopped"
}

status() {
  if ! running; then
    echo "no seckill started by scripts/serve.sh runs on port $port"
    return 0
  fi
  local all=0 up=0 dead=() pid
  while read -r pid; do
    all=$((all + 1))
    if alive "$pid"; then up=$((up + 1)); else dead+=("$pid"); fi
  done <"$pidfile"
  if [ "$up" = "$all" ]; then
    echo "seckill serves on http://$addr (pid $(tr '\n' ' ' <"$pidfile" | sed 's/ $//'))"
  else
    echo "seckill on http://$addr is degraded: $up of $all processes run (ended: ${dead[*]}); scripts/serve.sh stop, then start again" >&2
    return 1
  fi
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: scripts/serve.sh [start|stop|status]" >&2; exit 2 ;;
esac
