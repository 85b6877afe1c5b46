#!/usr/bin/env bash
# The main job: bring up the services if needed, build in release mode, and
# run the strategy comparison. Every argument goes to `loadtest compare`
# (see `scripts/compare.sh --help`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/services.sh up >&2
cargo build --release --workspace --quiet
exec target/release/loadtest compare "$@"
