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
cargo test --workspace --no-fail-fast "$@"
