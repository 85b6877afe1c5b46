#!/usr/bin/env bash
# The main job: install the programs the comparison runs that are missing
# (scripts/tools.sh: HAProxy with --haproxy, redis-server for lock/redlock's
# nodes, ...), bring up the services if needed, build in release mode (only
# what changed), and run the strategy comparison. Every argument goes to
# `loadtest compare` (see `scripts/compare.sh --help`, which answers at once
# from the built binary, without starting services or building).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/release-build.sh

help=false
quiet=()
for arg in "$@"; do
  case "$arg" in
    -h|--help|-V|--version) help=true ;;
    --quiet) quiet=(--quiet) ;;
  esac
done

if $help; then
  if [ ! -x target/release/loadtest ]; then
    echo "the help comes from the loadtest binary, which is not built yet: building it first" >&2
    release_build
  fi
  exec target/release/loadtest compare "$@"
fi

bash scripts/tools.sh compare "$@"
bash scripts/services.sh up >&2
release_build "${quiet[@]}"
exec target/release/loadtest compare "$@"
