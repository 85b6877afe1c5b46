#!/usr/bin/env bash
# The test suite: bring up the services if needed, then run every test of
# the workspace against them. Arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/services.sh up >&2
cargo test --workspace "$@"
