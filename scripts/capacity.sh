#!/usr/bin/env bash
# The capacity check of docs/scaling.md: one comparison per CPU budget of the
# service side (BUDGETS, cores, default "0.5 1 1.25 1.5": a limit that binds
# only at the top budget shows only if a budget close below it reaches it,
# docs/scaling.md), each into
# target/capacity/budget-<cores>, then `loadtest project --check` over them
# with the example deployments of deploy/capacity, into target/capacity.
# Every argument goes to each `loadtest compare` (default: the six
# strategies of the check, three rounds). Needs root (the cgroup quota).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

budgets=(${BUDGETS:-0.5 1 1.25 1.5})
args=("$@")
if [ ${#args[@]} -eq 0 ]; then
  args=(--strategies sql,sql/batched,sql/buckets,redis-decr,queue,lock/fenced)
fi
out=target/capacity
rm -rf "$out"
reports=()
for cores in "${budgets[@]}"; do
  status=0
  bash scripts/compare.sh --quiet --service-cpu-budget "$cores" --out "$out/budget-$cores" \
    "${args[@]}" || status=$?
  if [ ! -f "$out/budget-$cores/report.json" ]; then
    echo "the comparison at $cores cores wrote no report (exit $status)" >&2
    exit "${status:-1}"
  fi
  reports+=(--report "$out/budget-$cores/report.json")
done
target/release/loadtest project --check "${reports[@]}" \
  --deployment deploy/capacity/mid-size.toml --deployment deploy/capacity/large.toml \
  --out "$out"
