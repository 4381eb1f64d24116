#!/usr/bin/env bash
# alltoall_perf between two namespaced hosts over one rate-limited rail (perf/README.md figure).
#
#   tests/netns/alltoall_rail.sh [BUILD_DIR] [RATE] [alltoall_perf options...]
#     BUILD_DIR  build tree holding perf/alltoall_perf (default: build-netns next to this repo's
#                root, else build)
#     RATE       rail rate for tc tbf (default 1gbit = 0.125 GB/s)
#     options    default: -b 1M -e 64M -n 10 -w 3
#
# netns.sh makes 2 namespaces (fusco-n0, fusco-n1) and one bridged veth rail fr0 (10.77.0.1 and
# 10.77.0.2), limited to RATE in each direction; rank 0 runs in fusco-n0 and rank 1 in fusco-n1,
# started torchrun-style (RANK, WORLD_SIZE, MASTER_ADDR=10.77.0.1, MASTER_PORT); the id travels over
# TCP on the rail, the data over UCX (tcp) on fr0. With 2 ranks busbw = bytes each rank sends to the
# other per second, i.e. directly comparable to the rail's rate. Everything is torn down at the end.
# Exit 77 if namespaces cannot be made here.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-}
if [ -z "$build" ]; then
  build=$root/build-netns
  [ -x "$build/perf/alltoall_perf" ] || build=$root/build
fi
rate=${2:-1gbit}
shift $(($# > 2 ? 2 : $#))
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-b 1M -e 64M -n 10 -w 3)
bin=$build/perf/alltoall_perf
[ -x "$bin" ] || { echo "alltoall_rail.sh: no $bin (build target alltoall_perf)" >&2; exit 2; }

export RAIL_BIN=$bin
exec "$here/netns.sh" with 2 1 "$rate" -- bash -c '
  common=(env WORLD_SIZE=2 MASTER_ADDR=10.77.0.1 MASTER_PORT=29610 FUSCO_SOCKET_IFNAME=fr0
          FUSCO_NET_DEVICES=fr0 UCX_TLS=tcp,self UCX_NET_DEVICES=fr0 UCX_WARN_UNUSED_ENV_VARS=n)
  echo "# rail: $FUSCO_NETNS_RATE per direction; ranks: 0 in fusco-n0 (10.77.0.1), 1 in fusco-n1 (10.77.0.2)"
  "$FUSCO_NETNS_SCRIPT" run 1 "${common[@]}" RANK=1 "$RAIL_BIN" "$@" >/dev/null &
  r1=$!
  "$FUSCO_NETNS_SCRIPT" run 0 "${common[@]}" RANK=0 "$RAIL_BIN" "$@"
  rc0=$?
  wait $r1
  rc1=$?
  [ $rc0 = 0 ] && [ $rc1 = 0 ] || { echo "alltoall_rail.sh: rank 0 exit $rc0, rank 1 exit $rc1" >&2; exit 1; }
' rail "${args[@]}"
