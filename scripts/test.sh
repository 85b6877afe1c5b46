#!/usr/bin/env bash
# The test suite: install the programs the tests run that are missing
# (scripts/tools.sh: HAProxy, Chromium, ...), bring up the services if
# needed, then run every test of the workspace against them. Every test
# binary runs even after one failed (`--no-fail-fast`); the exit status is
# still non-zero when any test failed. Arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/tools.sh test
bash scripts/services.sh up >&2
if [ ! -x target/debug/loadtest ] || [ ! -x target/debug/seckill ]; then
  echo "building the test binaries for the first time (about 7 minutes on a 2-core machine, then about 13 of tests; cargo's progress follows)" >&2
fi
# Four test threads per binary unless RUST_TEST_THREADS says otherwise: the
# service's tests mostly wait on the servers (leases, timeouts, restarts), and
# heavy tests still run one at a time (docs/testing.md, "Build time").
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-4}"
# The whole output also goes to target/test.log; when a test failed, what
# each failed test printed comes again at the end, where a log that keeps
# only its tail still shows it.
mkdir -p target
status=0
cargo test --workspace --no-fail-fast "$@" 2>&1 | tee target/test.log || status=$?
if [ "$status" -ne 0 ]; then
  echo "== the failed tests (the whole output is in target/test.log) =="
  # A failed binary prints "failures:", each failed test's output under
  # "---- <name> stdout ----", then "failures:" again with their names; keep
  # the first 60 lines of each test's output.
  awk '/^failures:$/ { inside = 1; next }
       /^test result:/ { inside = 0 }
       inside && /^---- .* ----$/ { shown = 0 }
       inside && shown++ < 60' target/test.log
  echo "== $(grep -c '^---- .* ----$' target/test.log || true) failed tests; exit $status =="
fi
exit "$status"
