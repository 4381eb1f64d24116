#!/usr/bin/env bash
# moe_perf's dedup / balance ablations (docs/PERF.md) between two namespaced hosts over two
# rate-limited rails, every variant in one run (perf/README.md figure).
#
#   tests/netns/moe_ablation.sh [BUILD_DIR] [RATE] [moe_perf options...]
#     BUILD_DIR  build tree holding perf/moe_perf (default: build-netns next to this repo's
#                root, else build)
#     RATE       rate of each rail, per direction, for tc tbf (default 1gbit = 0.125 GB/s)
#     options    default: --dedup none,rank,node --balance static,greedy --pattern single-node
#                --tokens 512 --hidden 1024 -n 3 -w 1 --contenders fusco,limit
#
# netns.sh makes 2 namespaces (fusco-n0, fusco-n1) joined by two bridged veth rails fr0
# (10.77.0.1, 10.77.0.2) and fr1 (10.77.1.1, 10.77.1.2), each limited to RATE in each direction.
# Ranks 0 and 1 run in fusco-n0, ranks 2 and 3 in fusco-n1, started torchrun-style (RANK,
# WORLD_SIZE=4, MASTER_ADDR=10.77.0.1 = node 0 on fr0, MASTER_PORT): the id travels over TCP on fr0,
# data between the two nodes over UCX (tcp) on fr0 and fr1, and inside a node over shared memory
# (each namespace is its own host to fusco, so no FUSCO_LOCAL_SIZE). Rank 0 prints the table and
# the NODE vs NONE, GREEDY vs STATIC and max-rail-bytes ratios; the other ranks' stdout is dropped
# (their errors still show). Everything is torn down at the end (netns.sh with).
# Exit 77 if namespaces cannot be made here; 1 if any rank fails.
# FUSCO_ABLATION_TIMEOUT (seconds, default 900) bounds each rank.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-}
if [ -z "$build" ]; then
  build=$root/build-netns
  [ -x "$build/perf/moe_perf" ] || build=$root/build
fi
rate=${2:-1gbit}
shift $(($# > 2 ? 2 : $#))
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--dedup none,rank,node --balance static,greedy --pattern single-node
                               --tokens 512 --hidden 1024 -n 3 -w 1 --contenders fusco,limit)
bin=$build/perf/moe_perf
[ -x "$bin" ] || { echo "moe_ablation.sh: no $bin (build target moe_perf)" >&2; exit 2; }

export ABL_BIN=$bin ABL_TIMEOUT=${FUSCO_ABLATION_TIMEOUT:-900}
exec "$here/netns.sh" with 2 2 "$rate" -- bash -c '
  common=(env WORLD_SIZE=4 MASTER_ADDR=10.77.0.1 MASTER_PORT=29620 FUSCO_SOCKET_IFNAME=fr0
          FUSCO_NET_DEVICES=fr0,fr1 UCX_TLS=tcp,self UCX_NET_DEVICES=fr0,fr1
          UCX_WARN_UNUSED_ENV_VARS=n)
  echo "# rails: fr0, fr1 at $FUSCO_NETNS_RATE per direction each; ranks 0,1 in fusco-n0" \
       "(10.77.0.1, 10.77.1.1), ranks 2,3 in fusco-n1 (10.77.0.2, 10.77.1.2)"
  echo "# moe_perf $*"
  pids=()
  for r in 3 2 1; do
    "$FUSCO_NETNS_SCRIPT" run $((r / 2)) timeout "$ABL_TIMEOUT" "${common[@]}" RANK=$r \
      LOCAL_RANK=$((r % 2)) "$ABL_BIN" "$@" >/dev/null &
    pids+=($!)
  done
  "$FUSCO_NETNS_SCRIPT" run 0 timeout "$ABL_TIMEOUT" "${common[@]}" RANK=0 LOCAL_RANK=0 \
    "$ABL_BIN" "$@"
  rc=$?
  codes="rank 0 exit $rc"
  i=0
  for r in 3 2 1; do
    wait "${pids[$i]}"
    c=$?
    codes="$codes, rank $r exit $c"
    [ $c = 0 ] || rc=1
    i=$((i + 1))
  done
  [ $rc = 0 ] || { echo "moe_ablation.sh: $codes" >&2; exit 1; }
' ablation "${args[@]}"
