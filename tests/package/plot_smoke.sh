#!/usr/bin/env bash
# smoke.perf_plot: perf/plot turns fresh -J output of alltoall_perf and moe_perf into PNGs.
# Usage: plot_smoke.sh PLOT ALLTOALL_PERF MOE_PERF WORKDIR. Exits 77 (skipped, reason printed) when
# /usr/bin/python3 cannot import matplotlib (Debian: python3-matplotlib).
set -euo pipefail
plot=$1 a2a=$2 moe=$3 work=$4
if ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  echo "SKIP: /usr/bin/python3 cannot import matplotlib (apt-get install python3-matplotlib)"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
"$a2a" -np 2 -b 1K -e 64K -f 8 -n 2 -w 1 -c 1 -J "$work/a2a.json" >/dev/null
"$moe" -np 2 --tokens 32 --hidden 64 --experts 8 -n 1 -w 0 -c 1 --mpi-launch off \
  --dedup none,rank -J "$work/moe.json" >/dev/null
"$plot" -o "$work/charts" "$work/a2a.json" "$work/moe.json"
for f in "$work"/charts/alltoall_busbw.png "$work"/charts/moe_*.png; do
  [ -s "$f" ] || { echo "FAIL: $f missing or empty"; exit 1; }
  # A PNG starts with \x89PNG.
  [ "$(head -c 4 "$f" | tail -c 3)" = PNG ] || { echo "FAIL: $f is not a PNG"; exit 1; }
  echo "ok: $f"
done
