#!/usr/bin/env bash
# Cross-checks the load test's open-arrival latency against a generator
# nobody here wrote: `oha` (the Rust package registry's HTTP load generator,
# installed with `cargo install` into ~/.cargo/bin the first time), at the
# same constant rate against the same kind of sale.
#
#   scripts/crosscheck.sh [RATE] [SECONDS] [STRATEGY]
#
# defaults 1000 buyers a second for 10 s, strategy `sql`. One instance of the
# release build (scripts/serve.sh, development mode) serves both:
#   1. `loadtest compare --target … --profile arrival --arrival-shape constant`:
#      RATE × SECONDS buyers of a sale of one unit — one buys it, every other
#      is answered `409 sold-out` —, latency from each intended arrival;
#   2. `oha -q RATE -z SECONDS --latency-correction`: the same purchase of a
#      sale of the same strategy already sold out, every answer `409
#      sold-out`; oha's latency correction also counts from the intended send.
# Both then time the same path (the strategy refusing a sold-out sale) at the
# same rate, and each prints its p50, p99 and p99.9; docs/report-format.md
# ("Open arrivals") records a run. Outputs: target/crosscheck/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/release-build.sh

rate=${1:-1000}
seconds=${2:-10}
strategy=${3:-sql}
# The version whose options this script uses (`--latency-correction`,
# `--output-format json`).
OHA_VERSION=1.16.0
out=target/crosscheck
mkdir -p "$out"

if ! command -v oha >/dev/null 2>&1; then
  echo "crosscheck: installing oha $OHA_VERSION with cargo install (a few minutes the first time)" >&2
  cargo install --locked --version "$OHA_VERSION" oha
fi
bash scripts/services.sh up >&2
release_build
# Development mode (loopback only), where the short development token is accepted.
export SECKILL_DEV=1 SECKILL_ADMIN_TOKEN=dev-admin-token
bash scripts/serve.sh
trap 'bash scripts/serve.sh stop' EXIT
base=http://127.0.0.1:8080
database=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/seckill}

echo "crosscheck: the load test's arrival profile, $rate buyers/s for $seconds s, $strategy" >&2
target/release/loadtest compare --target "$base" --database-url "$database" \
  --strategies "$strategy" --profile arrival --arrival-shape constant \
  --arrival-rate "$rate" --stock 1 --demand "$((rate * seconds))" --repeat 1 \
  --reference-runs 1 --quiet --out "$out/loadtest" >&2 || true

echo "crosscheck: oha, $rate requests/s for $seconds s against a sold-out $strategy sale" >&2
auth=(-H "Authorization: Bearer $SECKILL_ADMIN_TOKEN" -H 'Content-Type: application/json')
sale=$(curl -sf -X POST "$base/admin/sales" "${auth[@]}" \
  -d "{\"name\":\"crosscheck\",\"stock\":1,\"strategy\":\"$strategy\"}" |
  sed -E 's/.*"id":([0-9]+).*/\1/')
curl -sf -o /dev/null -X POST "$base/sales/$sale/orders" -H 'Content-Type: application/json' \
  -d '{"user_id":1}'
oha --no-tui -q "$rate" -z "${seconds}s" --latency-correction -c 1000 \
  -m POST -H 'Content-Type: application/json' -d '{"user_id":2}' \
  --output-format json "$base/sales/$sale/orders" >"$out/oha.json"

python3 - "$out/loadtest/report.json" "$out/oha.json" <<'EOF'
import json, sys
run = json.load(open(sys.argv[1]))["runs"][0]
ours = run["arrival"]["latency_from_arrival_ms"]
print(f"loadtest arrival: {ours['count']} purchases, late {run['arrival']['late']}, "
      f"p50 {ours['p50']:.2f} ms, p99 {ours['p99']:.2f} ms, p99.9 {ours['p999']:.2f} ms; "
      f"statuses {run['status_counts']}")
oha = json.load(open(sys.argv[2]))
p = oha["latencyPercentiles"]
print(f"oha: {oha['summary']['requestsPerSec']:.0f} requests/s, "
      f"p50 {p['p50'] * 1000:.2f} ms, p99 {p['p99'] * 1000:.2f} ms, p99.9 {p['p99.9'] * 1000:.2f} ms; "
      f"statuses {oha['statusCodeDistribution']}")
EOF
