#!/usr/bin/env bash
# sim-grid runs the simulator on the grid of loads, seeds and clusters the
# goals are held on (docs/simulator.md, "The grid"), and prints one row per
# case: each goal met or MISSED, with the figures that decide the waits.
# Usage: scripts/sim-grid.sh [GPU_BROKER] [JOBS]  (defaults: bin/gpu-broker, 100000;
# SIM_GRID_POLICY: another policy directory than ten-tenants)
set -euo pipefail
bin=${1:-bin/gpu-broker}
jobs=${2:-100000}
h100='NVIDIA H100 80GB HBM3'
a100='NVIDIA A100 80GB'
policy=${SIM_GRID_POLICY:-broker/sim/testdata/ten-tenants}
# The small cluster's tenants: ten-tenants scaled to 800 GPUs.
small=$(mktemp -d)
trap 'rm -rf "$small"' EXIT
sed 's/guaranteed = 1000/guaranteed = 80/; s/limit      = 10000/limit      = 800/' "$policy/policy.hcl" > "$small/policy.hcl"

row() { # name policy args...
  local name=$1 pol=$2 out start
  shift 2
  start=$(date +%s)
  out=$("$bin" simulate -policy "$pol" -jobs "$jobs" "$@" 2>/dev/null)
  printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s s |\n' "$name" \
    "$(grep -c ': met$' <<<"$out") of 6" \
    "$(grep ': MISSED$' <<<"$out" | sed 's/ (.*//; s/:.*//' | paste -sd, - | sed 's/,/, /g')" \
    "$(sed -n 's/^guarantee violation: nomad-gpu \([0-9.]* %\).*/\1/p' <<<"$out")" \
    "$(awk -F'  +' '/guarantee violation \(tenant-hours, share\)/ {v=$NF} /no node could make room/ {print $NF " of " v}' <<<"$out" | sed 's/, [0-9.]* %//')" \
    "$(sed -n 's/^GPU-hours lost to preemption: nomad-gpu \([0-9.]* %\).*/\1/p' <<<"$out")" \
    "$(grep 'delay mean / p95 / longest (every wait)' <<<"$out" | awk -F'  +' '{print $NF}')" \
    "$(grep 'jobs evicted max_preemptions times' <<<"$out" | awk -F'  +' '{print $NF}')" \
    "$(( $(date +%s) - start ))"
}

echo "| case ($jobs jobs) | goals met | missed | nomad-gpu violation | of it, no node could make room | GPU-hours lost (of busy) | nomad-gpu delay mean / p95 / longest | evicted max_preemptions times: wait after the last | wall |"
echo "|---|---|---|---|---|---|---|---|---|"
for load in 0.9 1.0 1.1 1.2; do
  for seed in 1 2; do
    row "Philly $load, seed $seed" "$policy" -workload philly -load "$load" -seed "$seed" -nodes "1250x8:$h100"
  done
done
row "Helios 1.2" "$policy" -workload helios -load 1.2 -nodes "1250x8:$h100"
row "Philly 1.0, mixed (625 x 8 H100 + 1,250 x 4 A100)" "$policy" -workload philly -load 1.0 -nodes "625x8:$h100,1250x4:$a100"
row "Philly 1.0, 100 nodes" "$small" -workload philly -load 1.0 -nodes "100x8:$h100"
