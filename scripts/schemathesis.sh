#!/usr/bin/env bash
# Contract fuzzing of a running service against its own OpenAPI document,
# with schemathesis (a pinned version, installed into a virtualenv of its
# own under target/ on first use).
#
#   scripts/schemathesis.sh install        create target/schemathesis, if missing
#   scripts/schemathesis.sh run URL [...]  fuzz the service at URL (e.g.
#                                          http://127.0.0.1:8080); the admin
#                                          token is SECKILL_ADMIN_TOKEN
#                                          (default dev-admin-token); further
#                                          arguments go to `schemathesis run`
#
# The test suite runs it through app/tests/contract.rs, against a service of
# its own. Every check is on (server errors, status codes, content types,
# headers and bodies against the document, invalid data refused, valid data
# accepted, ...), in every phase (examples, coverage, fuzzing, stateful),
# with a bounded number of examples per operation and a fixed seed.
# scripts/schemathesis.toml names the refusals that depend on what the
# service holds; scripts/schemathesis_hooks.py keeps the sales the fuzzer
# creates from simulating more work than a request may take.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VERSION=4.32.5
VENV=target/schemathesis
BIN="$VENV/bin/schemathesis"

install() {
  if [ -x "$BIN" ] && "$BIN" --version 2>/dev/null | grep -qF "version $VERSION"; then
    return
  fi
  echo "installing schemathesis $VERSION into $VENV" >&2
  # A venv holds absolute paths: one moved or copied from elsewhere (a
  # target/ copied between checkouts) cannot run, so start afresh.
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$VERSION"
}

run() {
  local url=${1:?usage: scripts/schemathesis.sh run URL [schemathesis arguments]}
  shift
  install
  local root
  root=$(pwd)
  # Every phase runs, the stateful one (chains of linked calls: a sale the
  # fuzzer created, bought from, then read through its admin routes and its
  # orders) included; SCHEMATHESIS_PHASES picks fewer. The stateful phase's
  # chains are not reproducible from the seed: a failure it reports names
  # the calls, which is what to replay. It is where a response reaches real
  # data (a sql/batched sale's non-empty `size_counts`, off the document
  # while its integer keys were promised as integer property names) and
  # where a lock sale's purchase may meet its hold bound (`503 busy`, which
  # the purchase documents and scripts/schemathesis.toml accepts).
  # From inside the virtualenv: schemathesis and hypothesis keep their
  # caches (.schemathesis, .hypothesis) in the working directory.
  cd "$VENV"
  SCHEMATHESIS_HOOKS="$root/scripts/schemathesis_hooks.py" \
    "$root/$BIN" --config-file "$root/scripts/schemathesis.toml" run "$url/openapi.json" \
    --url "$url" \
    --header "Authorization: Bearer ${SECKILL_ADMIN_TOKEN:-dev-admin-token}" \
    --checks all \
    --phases "${SCHEMATHESIS_PHASES:-examples,coverage,fuzzing,stateful}" \
    --max-examples "${SCHEMATHESIS_MAX_EXAMPLES:-25}" \
    --seed "${SCHEMATHESIS_SEED:-12}" \
    --workers 1 \
    --request-timeout 15 \
    --no-color \
    "$@"
}

case "${1:-}" in
  install) install ;;
  run) shift; run "$@" ;;
  *) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2 ;;
esac
