#!/usr/bin/env bash
# Namespaced hosts for fusco tests (docs/TESTING.md, layer 4, label [netns]).
#
# Builds N "nodes" (network namespaces) joined by R "rails" (one bridge per rail in the root
# namespace); each node has one veth per rail, named the same on every node (fr0, fr1, ...) so
# FUSCO_NET_DEVICES / UCX_NET_DEVICES is one list everywhere. Each rail is rate limited with
# `tc tbf` on both ends of every veth (node egress and node ingress), so one node sends and receives
# at most RATE per rail. Addresses are private and only exist inside these namespaces:
#   node n, rail r: device fr<r>, address 10.77.<r>.<n+1>/24 (rank 0's node 0 rail 0 is 10.77.0.1)
#
# Names (PREFIX defaults to "fusco", override with FUSCO_NETNS_PREFIX):
#   namespaces  PREFIX-n<node>            (e.g. fusco-n0; /var/run/netns/fusco-n0 for setns())
#   bridges     PREFIX-br<rail>           (root namespace)
#   host veths  PREFIX-n<node>r<rail>     (root-namespace end, enslaved to the rail's bridge)
#
# Usage:
#   netns.sh up NODES RAILS [RATE]        create (RATE default 1gbit; "0" or "none": no limit)
#   netns.sh down                         remove every namespace / bridge / veth made here
#   netns.sh run NODE cmd [args...]       run cmd inside node NODE's namespace
#   netns.sh with NODES RAILS RATE -- cmd [args...]
#                                         up, run cmd (in the root namespace, with the
#                                         FUSCO_NETNS_* variables below set), always down (trap
#                                         on EXIT INT TERM plus a watchdog that tears down if this
#                                         script is SIGKILLed, e.g. by a ctest timeout); exits
#                                         with cmd's status.
#   netns.sh check                        exit 0 if namespaces can be made here, else 77 + reason
# In `with`, cmd sees FUSCO_NETNS_NODES, FUSCO_NETNS_RAILS, FUSCO_NETNS_RATE, FUSCO_NETNS_SCRIPT
# (this script's path) and FUSCO_NETNS_LIST (comma list of the namespace names, node order).
#
# Exit status 77 (ctest SKIP_RETURN_CODE) with a printed reason when namespaces cannot be created
# (not root, no `ip`/`tc`, no netns/veth/bridge/tbf support).
# One setup at a time: `with` and `up` take an exclusive flock on /run/lock/PREFIX-netns.lock
# (`with` holds it until everything is down again).
set -u

PREFIX=${FUSCO_NETNS_PREFIX:-fusco}
LOCK=${FUSCO_NETNS_LOCK:-/run/lock/${PREFIX}-netns.lock}
SELF=$(readlink -f "$0")

say() { echo "netns.sh: $*" >&2; }
skip() { echo "netns.sh: SKIP: $*" >&2; exit 77; }

ns_name() { echo "${PREFIX}-n$1"; }
br_name() { echo "${PREFIX}-br$1"; }
hv_name() { echo "${PREFIX}-n$1r$2"; }

# Everything this script may have made (also from an earlier run that was killed).
our_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}-n[0-9]+$"; }
our_links() {
  ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
    grep -E "^${PREFIX}-(br[0-9]+|n[0-9]+r[0-9]+|t[0-9]+r[0-9]+)$"
}

do_down() {
  local ns l
  for ns in $(our_namespaces); do
    # A process still inside would keep the namespace's devices alive; there should be none.
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" 2>/dev/null || say "could not delete namespace $ns"
  done
  for l in $(our_links); do ip link del "$l" 2>/dev/null; done
  local left
  left="$(our_namespaces) $(our_links)"
  if [ -n "${left// /}" ]; then
    say "left behind: $left"
    return 1
  fi
  return 0
}

need_tools() {
  [ "$(id -u)" = 0 ] || skip "not root (network namespaces need CAP_SYS_ADMIN/CAP_NET_ADMIN)"
  command -v ip >/dev/null || skip "no 'ip' (iproute2) on this machine"
  command -v tc >/dev/null || skip "no 'tc' (iproute2) on this machine"
  command -v flock >/dev/null || skip "no 'flock' (util-linux) on this machine"
}

# Probes what `up` needs with throw-away names; 77 and a reason if anything is missing.
do_check() {
  need_tools
  local pns="${PREFIX}-probe$$" pbr="${PREFIX}-bp$$" err
  err=$(ip netns add "$pns" 2>&1) || skip "cannot create a network namespace: $err"
  if ! err=$(ip link add "$pbr" type bridge 2>&1); then
    ip netns del "$pns"; skip "cannot create a bridge: $err"
  fi
  if ! err=$(ip link add "${PREFIX}-pv$$" type veth peer name "${PREFIX}-pw$$" 2>&1); then
    ip link del "$pbr"; ip netns del "$pns"; skip "cannot create a veth pair: $err"
  fi
  if ! err=$(tc qdisc add dev "${PREFIX}-pv$$" root tbf rate 1gbit burst 256kb latency 50ms 2>&1); then
    ip link del "${PREFIX}-pv$$"; ip link del "$pbr"; ip netns del "$pns"
    skip "cannot add a tc tbf qdisc: $err"
  fi
  ip link del "${PREFIX}-pv$$"; ip link del "$pbr"; ip netns del "$pns"
  return 0
}

check_int() { [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge "$3" ] && [ "$2" -le "$4" ] ||
  { say "$1 must be an integer in [$3, $4], got '$2'"; exit 2; }; }

# tbf on one device. burst must hold at least one GSO super-packet (64 KiB) and several rate/HZ
# bytes: with a burst near rate/HZ (512 KB at 1 Gbit/s and HZ 250) the bucket runs dry between
# timer ticks and a TCP stream gets about 0.7 of the rate; 2 MB gives 0.95. Over a transfer of T
# bytes the burst lets at most burst/T more through than the rate (under 1% at 256 MiB).
limit_dev() {  # netns-or-empty dev rate
  local nsx=() rate=$3
  [ -n "$1" ] && nsx=(ip netns exec "$1")
  case "$rate" in 0 | none | "") return 0 ;; esac
  "${nsx[@]}" tc qdisc replace dev "$2" root tbf rate "$rate" burst "${FUSCO_NETNS_TBF_BURST:-2mb}" \
    latency "${FUSCO_NETNS_TBF_LATENCY:-50ms}"
}

do_up() {  # NODES RAILS RATE (caller holds the lock)
  local nodes=$1 rails=$2 rate=$3 n r ns br hv tmp
  check_int NODES "$nodes" 1 200
  check_int RAILS "$rails" 1 8
  do_check
  do_down >/dev/null 2>&1 || true  # leftovers of a run that was SIGKILLed
  set -e
  for ((r = 0; r < rails; r++)); do
    br=$(br_name $r)
    ip link add "$br" type bridge
    # No STP/forwarding delay: the port forwards as soon as it is up.
    ip link set "$br" type bridge forward_delay 0 stp_state 0 2>/dev/null || true
    ip link set "$br" up
  done
  for ((n = 0; n < nodes; n++)); do
    ns=$(ns_name $n)
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    for ((r = 0; r < rails; r++)); do
      hv=$(hv_name $n $r)
      tmp="${PREFIX}-t${n}r${r}"
      ip link add "$hv" type veth peer name "$tmp"
      ip link set "$tmp" netns "$ns"
      ip -n "$ns" link set "$tmp" name "fr$r"
      ip -n "$ns" addr add "10.77.$r.$((n + 1))/24" dev "fr$r"
      ip -n "$ns" link set "fr$r" up
      ip link set "$hv" master "$(br_name $r)"
      ip link set "$hv" up
      limit_dev "$ns" "fr$r" "$rate"  # what node n sends on rail r
      limit_dev "" "$hv" "$rate"      # what node n receives on rail r
    done
  done
  set +e
  # Wait until every node reaches node 0 on every rail (bridge ports come up asynchronously).
  local ok tries
  for ((n = 1; n < nodes; n++)); do
    for ((r = 0; r < rails; r++)); do
      ok=0
      for tries in $(seq 1 50); do
        if ip netns exec "$(ns_name $n)" ping -c1 -W1 -q "10.77.$r.1" >/dev/null 2>&1; then
          ok=1; break
        fi
        command -v ping >/dev/null || { ok=1; break; }  # no ping: trust the setup
        sleep 0.1
      done
      [ $ok = 1 ] || { say "node $n cannot reach 10.77.$r.1 on rail $r"; return 1; }
    done
  done
  say "up: $nodes node(s) x $rails rail(s), rate ${rate:-none} per rail and direction" \
      "(namespaces $(our_namespaces | tr '\n' ' '))"
  return 0
}

usage() { sed -n '2,35p' "$SELF" | sed 's/^# \{0,1\}//' >&2; exit 2; }

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  check)
    do_check
    echo "netns.sh: namespaces, bridges, veths and tbf work here"
    ;;
  up)
    [ $# -ge 2 ] || usage
    need_tools
    exec 9>"$LOCK"
    flock -w 300 9 || { say "timed out waiting for $LOCK"; exit 1; }
    # On any failure (also a skip) remove what was made so far; on success leave it up.
    trap 'rc=$?; trap - EXIT; [ $rc = 0 ] || do_down >/dev/null 2>&1; exit $rc' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    do_up "$1" "$2" "${3:-1gbit}"
    ;;
  down)
    need_tools
    do_down
    ;;
  run)
    [ $# -ge 2 ] || usage
    check_int NODE "$1" 0 199
    ns=$(ns_name "$1")
    shift
    [ -e "/var/run/netns/$ns" ] || { say "no namespace $ns (run 'netns.sh up' first)"; exit 1; }
    exec ip netns exec "$ns" "$@"
    ;;
  with)
    [ $# -ge 5 ] && [ "$4" = "--" ] || usage
    nodes=$1 rails=$2 rate=$3
    shift 4
    need_tools
    exec 9>"$LOCK"
    flock -w 300 9 || { say "timed out waiting for $LOCK"; exit 1; }
    child=
    cleanup() {
      trap - EXIT INT TERM
      [ -n "$child" ] && kill -TERM "$child" 2>/dev/null && wait "$child" 2>/dev/null
      do_down || exit 1
    }
    trap 'cleanup' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    # Watchdog: if this script is SIGKILLed (no trap runs), tear down once it is gone. It keeps
    # the lock (fd 9) until then, so no new setup can start in between.
    setsid bash -c 'while kill -0 '$$' 2>/dev/null; do sleep 0.5; done; "$0" down' "$SELF" \
      </dev/null >/dev/null 2>&1 &
    do_up "$nodes" "$rails" "$rate"
    rc=$?
    [ $rc = 0 ] || exit $rc  # 77 (skip) or 1; the trap tears down what was made
    export FUSCO_NETNS_NODES=$nodes FUSCO_NETNS_RAILS=$rails FUSCO_NETNS_RATE=$rate
    export FUSCO_NETNS_SCRIPT=$SELF
    FUSCO_NETNS_LIST=$(for ((n = 0; n < nodes; n++)); do ns_name $n; done | paste -sd,)
    export FUSCO_NETNS_LIST
    "$@" 9>&- &
    child=$!
    wait "$child"
    rc=$?
    child=
    exit $rc
    ;;
  *) usage ;;
esac
