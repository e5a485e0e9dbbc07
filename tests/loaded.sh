#!/usr/bin/env bash
# `npm run test:loaded`: the README's test command with every core kept busy by another process, the way a shared
# CI machine or a developer's laptop under a build is. One busy loop per core (`nproc`, or EDGELOOP_LOAD_PROCS),
# each a plain shell spinning at normal priority, so the suite competes for CPU exactly as it would with a
# neighbour's job; the loops are stopped however the suite ends. Extra arguments go to `npm test`.
set -euo pipefail
cd "$(dirname "$0")/.."
procs="${EDGELOOP_LOAD_PROCS:-$(nproc)}"
pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop EXIT INT TERM
for _ in $(seq 1 "$procs"); do
  bash -c 'while :; do :; done' &
  pids+=("$!")
done
echo "test:loaded: ${procs} busy loop(s) running (pids ${pids[*]}); running npm test" >&2
npm test -- "$@"
