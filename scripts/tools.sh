#!/usr/bin/env bash
# The programs the test suite and the comparison run themselves, beside the
# servers scripts/services.sh brings: each one missing is installed with
# apt-get (after one `apt-get update`), as root, or through sudo when this
# user is not root; the script says which packages and why before it
# installs them. Without apt-get, or without root and sudo, it stops and
# names the packages to install.
#
#   scripts/tools.sh test            what the test suite needs (scripts/test.sh)
#   scripts/tools.sh compare [ARGS]  what `loadtest compare ARGS` needs (scripts/compare.sh)
#
# program             Debian package    needed by
# haproxy             haproxy           `compare --haproxy`; the tests compare_balanced,
#                                       compare_interrupted, failover::rabbitmq_cluster
# chromium            chromium          the report page, the live view and the storefront,
#                                       tested in a browser (report_html, live_view,
#                                       storefront); CHROMIUM, or chromium-browser or
#                                       google-chrome on the PATH, will do
# redis-server        redis-server      Redis nodes of their own: lock/redlock's nodes, the
#                                       redis-restart fault, the tests' owned Redis
# redis-cli           redis-tools       a Redis Cluster of its own (`--redis-cluster`, the
#                                       cluster tests)
# rabbitmq-server     rabbitmq-server   a RabbitMQ node or cluster of its own (the
#                                       broker-restart fault, the queue_broker tests,
#                                       failover::rabbitmq_cluster)
# curl                curl              the README walkthrough (app/tests/readme.rs)
# python3 -m venv     python3-venv      schemathesis's virtualenv (app/tests/contract.rs)
set -euo pipefail

# Packages to install, and what for (one line each).
packages=()
reasons=()

need() { # PACKAGE REASON: when the check before it failed
  packages+=("$1")
  reasons+=("  $1: $2")
}

has() { command -v "$1" >/dev/null 2>&1; }

has_chromium() {
  [ -n "${CHROMIUM:-}" ] || has chromium || has chromium-browser || has google-chrome
}

for_tests() {
  has haproxy || need haproxy "a load balancer (compare_balanced, compare_interrupted, failover::rabbitmq_cluster)"
  has_chromium || need chromium "pages tested in a browser (report_html, live_view, storefront)"
  has redis-server || need redis-server "Redis nodes a test owns"
  has redis-cli || need redis-tools "the Redis Cluster tests (redis-cli --cluster create)"
  has rabbitmq-server || need rabbitmq-server "RabbitMQ nodes a test owns (queue_broker, compare_faults, failover::rabbitmq_cluster)"
  has curl || need curl "the README walkthrough (app/tests/readme.rs)"
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need python3-venv "schemathesis's virtualenv (app/tests/contract.rs)"
}

# What `loadtest compare ARGS` starts itself. The default strategies include
# lock/redlock, whose three Redis nodes it starts unless SECKILL_LOCK_REDLOCK_URLS names some.
for_compare() {
  local args=" $* " strategies="" faults=""
  [[ "$args" =~ \ --strategies[=\ ]([^ ]*) ]] && strategies="${BASH_REMATCH[1]}"
  [[ "$args" =~ \ --faults[=\ ]([^ ]*) ]] && faults="${BASH_REMATCH[1]}"
  [[ "$args" == *" --target"* ]] && return 0
  if [[ "$args" == *" --haproxy "* ]] && ! has haproxy; then
    need haproxy "--haproxy: the load balancer in front of the instances"
  fi
  if ! has redis-server; then
    if { [ -z "${SECKILL_LOCK_REDLOCK_URLS:-}" ] && { [ -z "$strategies" ] || [[ "$strategies" == *lock/redlock* ]]; }; } \
      || [[ "$faults" == *redis-restart* || "$faults" == *all* || "$args" == *" --redis-cluster "* ]]; then
      need redis-server "Redis nodes of the comparison's own (lock/redlock, redis-restart, --redis-cluster)"
    fi
  fi
  if [[ "$args" == *" --redis-cluster "* ]] && ! has redis-cli; then
    need redis-tools "--redis-cluster: redis-cli --cluster create"
  fi
  if [[ "$faults" == *broker-restart* || "$faults" == *all* ]] && ! has rabbitmq-server; then
    need rabbitmq-server "the broker-restart fault's RabbitMQ node"
  fi
}

install() {
  [ ${#packages[@]} -eq 0 ] && return 0
  local sudo=()
  if [ "$(id -u)" != 0 ]; then
    if has sudo; then sudo=(sudo); else sudo=(none); fi
  fi
  if ! has apt-get || [ "${sudo[*]}" = none ]; then
    echo "tools: missing, to install (Debian package names):" >&2
    printf '%s\n' "${reasons[@]}" >&2
    if has apt-get; then
      echo "tools: installing them needs root or sudo: apt-get install ${packages[*]}" >&2
    fi
    return 1
  fi
  echo "tools: installing ${packages[*]} with ${sudo[*]:+sudo }apt-get, for:" >&2
  printf '%s\n' "${reasons[@]}" >&2
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq \
    "${packages[@]}" >/dev/null
  echo "tools: installed ${packages[*]}" >&2
}

case "${1:-}" in
  test) for_tests ;;
  compare) shift; for_compare "$@" ;;
  *) echo "usage: scripts/tools.sh test | compare [loadtest compare arguments]" >&2; exit 2 ;;
esac
install
