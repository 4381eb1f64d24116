#!/usr/bin/env bash
# package.perf_mps: moe_perf and alltoall_perf's --mps auto|on|off start a private MPS daemon for
# -np ranks that share a GPU, say so (a line, the header, the JSON's "mps"), and stop it at the end,
# also when a rank fails; a SIGTERM to the parent alone stops its ranks and its daemon (also one
# that is still starting) and removes the daemon's folder.
# Usage: perf_mps.sh MOE_PERF ALLTOALL_PERF (the built binaries).
# No GPU is needed: a fake nvidia-cuda-mps-control first on PATH records its calls (-d: the
# CUDA_MPS_PIPE_DIRECTORY it saw, and a listener on the Unix socket
# "$CUDA_MPS_PIPE_DIRECTORY/control" as a daemon's; `quit` on stdin: recorded, control removed, so
# its listener ends), and FUSCO_PERF_FAKE_DEVICES=1 (the binaries' test hook) makes the decision
# see one device and CUDA memory while the ranks run on --mem host. The listener is python3's
# (without python3 the test is skipped: exit 77).
set -uo pipefail
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY FUSCO_PERF_FAKE_DEVICES FAKE_DEVICES
MOE=${1:?usage: perf_mps.sh MOE_PERF ALLTOALL_PERF}
A2A=${2:?usage: perf_mps.sh MOE_PERF ALLTOALL_PERF}
for b in "$MOE" "$A2A"; do [ -x "$b" ] || { echo "FAIL: no $b"; exit 1; }; done
# The interpreter itself, not a shim that needs the PATH the runs do not have.
PY=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null) || PY=
if [ ! -x "$PY" ]; then
  echo "perf_mps: skipped: no python3 (the fake daemon's control socket needs it)"
  exit 77
fi
T=$(mktemp -d "${TMPDIR:-/tmp}/perf-mps.XXXXXX")
trap 'rm -rf "$T"' EXIT
FAILS=0
fail() {
  echo "FAIL: $*"
  FAILS=$((FAILS + 1))
}
ok() { echo "ok: $*"; }
expect() {  # WHAT CMD...: ok when CMD succeeds, else a failure
  local what=$1
  shift
  if "$@"; then ok "$what"; else fail "$what"; fi
}
not() { ! "$@"; }

# ---- a daemon's control socket: listens at PATH until the file is removed (5 minutes at most)
cat >"$T/listen.py" <<'EOF'
import os, socket, sys, time
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(16)
s.settimeout(0.1)
end = time.time() + 300
while os.path.exists(path) and time.time() < end:
    try:
        s.accept()[0].close()
    except OSError:
        pass
EOF
# listen PATH: a live daemon's control socket at PATH, there once this returns
listen() {
  "$PY" "$T/listen.py" "$1" </dev/null >/dev/null 2>&1 &
  for _ in $(seq 1 100); do
    [ -S "$1" ] && return 0
    sleep 0.1
  done
  echo "FAIL: no listener at $1"
  return 1
}
# stale_socket PATH: what a crashed daemon leaves, a socket file that nothing listens on
stale_socket() { "$PY" -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$1"; }

# ---- the fake control program, alone in its PATH folder (it finds its own tools)
mkdir -p "$T/path" "$T/empty" "$T/nopipe"
cat >"$T/path/nvidia-cuda-mps-control" <<'EOF'
#!/bin/sh
# Fake MPS control (tests/package/perf_mps.sh): records each call in $FAKE_MPS_LOG.
PATH=/usr/bin:/bin
if [ "$1" = "-d" ]; then
  echo "start $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY" >>"$FAKE_MPS_LOG"
  [ -z "${FAKE_MPS_START_S:-}" ] || sleep "$FAKE_MPS_START_S"  # a daemon slow to start
  [ -d "$CUDA_MPS_PIPE_DIRECTORY" ] && [ -d "$CUDA_MPS_LOG_DIRECTORY" ] || exit 3
  # The daemon's control socket, listening until `quit` removes it; `-d` itself returns at once.
  "$FAKE_PY" "$FAKE_LISTEN" "$CUDA_MPS_PIPE_DIRECTORY/control" </dev/null >/dev/null 2>&1 &
  exit 0
fi
read -r cmd
echo "$cmd $CUDA_MPS_PIPE_DIRECTORY" >>"$FAKE_MPS_LOG"
[ "$cmd" = quit ] && rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
exit 0
EOF
chmod +x "$T/path/nvidia-cuda-mps-control"
export FAKE_MPS_LOG=$T/calls FAKE_PY=$PY FAKE_LISTEN=$T/listen.py

MOE_ARGS=(-np 2 --tokens 64 --hidden 128 --experts 4 --topk 2 -n 1 -w 0 --mpi-launch off)
A2A_ARGS=(-np 2 -b 1K -e 4K -n 1 -w 0)
J=$T/run.json  # each run's -J file (removed before the run)
# run PATHDIR BIN ARGS...: one run with PATHDIR alone on PATH (the binaries need nothing else);
# sets RC. Its stdout, stderr and the fake's record are in $T/stdout, $T/stderr, $FAKE_MPS_LOG.
# The environment's pipe directory is an empty one (a real daemon at /tmp/nvidia-mps plays no
# part) unless the caller sets CUDA_MPS_PIPE_DIRECTORY.
run() {
  local pathdir=$1 bin=$2
  shift 2
  rm -f "$J"
  : >"$FAKE_MPS_LOG"
  RC=0
  timeout 60 env PATH="$pathdir" FUSCO_PERF_FAKE_DEVICES="${FAKE_DEVICES:-1}" \
    CUDA_MPS_PIPE_DIRECTORY="${CUDA_MPS_PIPE_DIRECTORY:-$T/nopipe}" \
    "$bin" "$@" >"$T/stdout" 2>"$T/stderr" || RC=$?
}
exited() {  # CODE: the last run exited CODE (else its output is shown)
  [ "$RC" = "$1" ] && return 0
  echo "  exit $RC; stderr: $(cat "$T/stderr")"
  echo "  stdout: $(cat "$T/stdout")"
  return 1
}
json_mps() {  # MODE: the last run wrote JSON lines, every one with "mps":"MODE"
  [ -s "$J" ] && not grep -v "\"mps\":\"$1\"" "$J" >/dev/null
}
no_json() { [ ! -s "$J" ]; }
said() { grep -q -- "$1" "$T/stdout"; }         # REGEX: a stdout line matches
called() { grep -qx -- "$1" "$FAKE_MPS_LOG"; }  # LINE: the fake recorded LINE
not_called() { [ ! -s "$FAKE_MPS_LOG" ]; }
private_pipe() { case $1 in /tmp/fusco-mps.*/pipe) return 0 ;; *) return 1 ;; esac; }  # DIR
calls() { tr '\n' ';' <"$FAKE_MPS_LOG"; }
err_line() {  # TEXT...: stderr is one line holding each TEXT
  [ "$(grep -c . "$T/stderr")" = 1 ] || return 1
  for t in "$@"; do grep -qF -- "$t" "$T/stderr" || return 1; done
}
# private NAME [no-header]: the last run started the fake daemon once, in a private folder under
# /tmp with pipe/ and log/; the ranks saw its pipe directory (rank 0's header; no-header: the
# ranks failed before it); `quit` went to the same daemon; the folder is gone.
private() {
  local pipe folder
  pipe=$(sed -n 's/^start \([^ ]*\) .*/\1/p' "$FAKE_MPS_LOG")
  folder=${pipe%/pipe}
  expect "$1: the fake daemon started once (calls: $(calls))" \
    [ "$(grep -c '^start ' "$FAKE_MPS_LOG")" = 1 ]
  expect "$1: in /tmp/fusco-mps.*/ ($folder)" private_pipe "$pipe"
  expect "$1: the daemon saw the folder's log/" called "start $pipe $folder/log"
  expect "$1: the stdout line names the folder" said "^MPS: private daemon for this run ($folder, "
  [ "${2:-}" = no-header ] ||
    expect "$1: rank 0 saw CUDA_MPS_PIPE_DIRECTORY=$pipe (header)" \
      said "^# fusco .*, MPS private (pipe $pipe)\$"
  expect "$1: quit sent to the same daemon" called "quit $pipe"
  expect "$1: the private folder is gone" not test -e "$folder"
  if private_pipe "$pipe" && [ -e "$folder" ]; then rm -rf "$folder"; fi  # /tmp stays clean
}

# ---- 1. --mps on, with the fake: private daemon, started and stopped
run "$T/path" "$MOE" --mem host --mps on "${MOE_ARGS[@]}" -J "$J"
expect "moe on: exit 0" exited 0
private "moe on"
expect "moe on: JSON mps private" json_mps private
run "$T/path" "$A2A" --mem host --mps on "${A2A_ARGS[@]}" -J "$J"
expect "alltoall on: exit 0" exited 0
private "alltoall on"
expect "alltoall on: JSON mps private" json_mps private

# ---- 2. --mps auto (the default), with the fake: the same
run "$T/path" "$MOE" --mem host "${MOE_ARGS[@]}" -J "$J"
expect "moe auto: exit 0" exited 0
private "moe auto"
expect "moe auto: JSON mps private" json_mps private

# ---- 3. --mps off: the fake is never called
run "$T/path" "$MOE" --mem host --mps off "${MOE_ARGS[@]}" -J "$J"
expect "moe off: exit 0" exited 0
expect "moe off: no call to the fake ($(calls))" not_called
expect "moe off: the line says --mps off" said "^MPS: off (--mps off)"
expect "moe off: JSON mps off" json_mps off
run "$T/path" "$A2A" --mem host --mps off "${A2A_ARGS[@]}" -J "$J"
expect "alltoall off: exit 0" exited 0
expect "alltoall off: no call to the fake ($(calls))" not_called
expect "alltoall off: JSON mps off" json_mps off

# ---- 4. no nvidia-cuda-mps-control on PATH: on refuses (exit 2, nothing run), auto time-slices
run "$T/empty" "$MOE" --mem host --mps on "${MOE_ARGS[@]}" -J "$J"
expect "moe on, no control program: exit 2" exited 2
expect "moe on, no control program: one clear line on stderr ($(cat "$T/stderr"))" \
  err_line "--mps on" "nvidia-cuda-mps-control not found"
expect "moe on, no control program: no rank ran" no_json
expect "moe on, no control program: no header" not said "^# fusco"
run "$T/empty" "$A2A" --mem host --mps on "${A2A_ARGS[@]}" -J "$J"
expect "alltoall on, no control program: exit 2" exited 2
expect "alltoall on, no control program: one clear line on stderr" \
  err_line "--mps on" "nvidia-cuda-mps-control not found"
run "$T/empty" "$MOE" --mem host --mps auto "${MOE_ARGS[@]}" -J "$J"
expect "moe auto, no control program: exit 0" exited 0
expect "moe auto, no control program: JSON mps off" json_mps off
expect "moe auto, no control program: the line says why" \
  said "^MPS: off (nvidia-cuda-mps-control not found on PATH), ranks time-slice the GPU"

# ---- 5. auto when the ranks do not share a device (2 ranks, 2 devices): no daemon
FAKE_DEVICES=2 run "$T/path" "$MOE" --mem host "${MOE_ARGS[@]}" -J "$J"
expect "moe auto, 2 ranks on 2 devices: exit 0" exited 0
expect "moe auto, 2 ranks on 2 devices: no call to the fake ($(calls))" not_called
expect "moe auto, 2 ranks on 2 devices: JSON mps off" json_mps off

# ---- 6. a daemon already serves the environment: auto (and on) use it, start none, stop none
mkdir -p "$T/ext"
listen "$T/ext/control"
CUDA_MPS_PIPE_DIRECTORY=$T/ext run "$T/path" "$MOE" --mem host "${MOE_ARGS[@]}" -J "$J"
expect "moe external: exit 0" exited 0
expect "moe external: no call to the fake ($(calls))" not_called
expect "moe external: the line says already running" said "^MPS: already running ($T/ext)"
expect "moe external: the header names its pipe" said "^# fusco .*, MPS external (pipe $T/ext)\$"
expect "moe external: JSON mps external" json_mps external
expect "moe external: its control file is left alone" test -e "$T/ext/control"
CUDA_MPS_PIPE_DIRECTORY=$T/ext run "$T/path" "$A2A" --mem host --mps on "${A2A_ARGS[@]}" -J "$J"
expect "alltoall external (on): exit 0" exited 0
expect "alltoall external (on): no call to the fake ($(calls))" not_called
expect "alltoall external (on): JSON mps external" json_mps external
rm -f "$T/ext/control"  # its listener ends

# ---- 6b. a crashed daemon's control socket (nothing listens), or a plain file there, is no
# daemon: auto starts a private one as in an empty folder, off says --mps off; none is "external"
mkdir -p "$T/stale" "$T/stalefile"
stale_socket "$T/stale/control"
: >"$T/stalefile/control"
CUDA_MPS_PIPE_DIRECTORY=$T/stale run "$T/path" "$MOE" --mem host "${MOE_ARGS[@]}" -J "$J"
expect "moe, stale control socket: exit 0" exited 0
expect "moe, stale control socket: not already running" not said "^MPS: already running"
private "moe, stale control socket"
expect "moe, stale control socket: JSON mps private" json_mps private
CUDA_MPS_PIPE_DIRECTORY=$T/stalefile run "$T/path" "$A2A" --mem host "${A2A_ARGS[@]}" -J "$J"
expect "alltoall, plain control file: exit 0" exited 0
expect "alltoall, plain control file: not already running" not said "^MPS: already running"
private "alltoall, plain control file"
expect "alltoall, plain control file: JSON mps private" json_mps private
CUDA_MPS_PIPE_DIRECTORY=$T/stale run "$T/path" "$MOE" --mem host --mps off "${MOE_ARGS[@]}" -J "$J"
expect "moe off, stale control socket: exit 0" exited 0
expect "moe off, stale control socket: the line says --mps off" said "^MPS: off (--mps off)"
expect "moe off, stale control socket: JSON mps off" json_mps off
expect "moe off, stale control socket: left alone" test -S "$T/stale/control"

# ---- 7. the ranks fail (rank 0 cannot open its -J file): the daemon is stopped all the same
run "$T/path" "$MOE" --mem host --mps on "${MOE_ARGS[@]}" -J "$T/no/such/dir/x.json"
expect "moe, failing ranks: exit 1" exited 1
private "moe, failing ranks" no-header
run "$T/path" "$A2A" --mem host --mps on "${A2A_ARGS[@]}" -J "$T/no/such/dir/x.json"
expect "alltoall, failing ranks: exit 1" exited 1
private "alltoall, failing ranks" no-header

# ---- 8. a daemon that does not start: on refuses (exit 2), auto time-slices; no folder is left
mkdir -p "$T/badpath"
cat >"$T/badpath/nvidia-cuda-mps-control" <<'FAKE'
#!/bin/sh
echo "start $CUDA_MPS_PIPE_DIRECTORY" >>"$FAKE_MPS_LOG"
echo "fake: no GPU" >&2
exit 1
FAKE
chmod +x "$T/badpath/nvidia-cuda-mps-control"
run "$T/badpath" "$MOE" --mem host --mps on "${MOE_ARGS[@]}" -J "$J"
expect "moe on, daemon fails: exit 2" exited 2
expect "moe on, daemon fails: one line with its words ($(cat "$T/stderr"))" \
  err_line "--mps on" "-d exited with status 1" "fake: no GPU"
expect "moe on, daemon fails: no rank ran" no_json
bad_pipe=$(sed -n 's/^start //p' "$FAKE_MPS_LOG")
expect "moe on, daemon fails: tried in /tmp/fusco-mps.*/" private_pipe "$bad_pipe"
expect "moe on, daemon fails: its folder is gone" not test -e "${bad_pipe%/pipe}"
run "$T/badpath" "$MOE" --mem host --mps auto "${MOE_ARGS[@]}" -J "$J"
expect "moe auto, daemon fails: exit 0" exited 0
expect "moe auto, daemon fails: JSON mps off" json_mps off
expect "moe auto, daemon fails: the line says why" \
  said "^MPS: off (.*exited with status 1.*), ranks time-slice the GPU"

# ---- 9. the run is stopped (SIGTERM to its process group, as a scheduler's or timeout's stop
# does; an interactive Ctrl-C sends SIGINT alike, but a script's background job ignores SIGINT):
# the parent stops the daemon before it goes, and exits 128 + 15
: >"$FAKE_MPS_LOG"
: >"$T/stdout"  # emptied before the run: the last run's MPS line is no sign of this one's
RC=0
setsid env PATH="$T/path" FUSCO_PERF_FAKE_DEVICES=1 CUDA_MPS_PIPE_DIRECTORY="$T/nopipe" "$MOE" \
  --mem host --mps on "${MOE_ARGS[@]}" -n 200000 -c 0 >"$T/stdout" 2>"$T/stderr" &
PID=$!
# Stopped once its ranks run (the MPS line is out), however loaded the machine is.
for _ in $(seq 1 600); do
  grep -q "^MPS: " "$T/stdout" 2>/dev/null && break
  sleep 0.1
done
sleep 1
kill -TERM -- "-$PID" 2>/dev/null
wait "$PID" || RC=$?
expect "moe stopped: exit 143" exited 143
private "moe stopped"

# ---- 9b. SIGTERM to the parent alone (Popen.terminate() and job schedulers send it so), with and
# without a daemon: the parent sends SIGTERM to its ranks, stops its daemon, and exits 143 within
# seconds; none of its ranks runs on
alive() {  # PID: it has not ended (a zombie has)
  local st
  st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  case $st in Z*) return 1 ;; *) return 0 ;; esac
}
ends_within() {  # PID SECONDS: PID ends within SECONDS
  local n=0
  while alive "$1" && [ $n -lt $(($2 * 10)) ]; do
    sleep 0.1
    n=$((n + 1))
  done
  not alive "$1"
}
# stop_parent WHAT BIN ARGS...: a long -np 2 run in a process group of its own; once rank 0's
# header is out and both ranks are found, SIGTERM to the parent's pid alone; checks the parent's exit and that both ranks
# ended, then kills whatever of the group is left. Sets RC.
stop_parent() {
  local what=$1 bin=$2 ranks=() p
  shift 2
  : >"$FAKE_MPS_LOG"
  : >"$T/stdout"  # emptied before the run: the last run's header is no sign of this one's
  RC=0
  setsid env PATH="$T/path" FUSCO_PERF_FAKE_DEVICES=1 CUDA_MPS_PIPE_DIRECTORY="$T/nopipe" "$bin" \
    "$@" >"$T/stdout" 2>"$T/stderr" &
  local pid=$!
  for _ in $(seq 1 600); do
    mapfile -t ranks < <(pgrep -P "$pid" -x "$(basename "$bin")")
    grep -q "^# fusco" "$T/stdout" && [ "${#ranks[@]}" = 2 ] && break
    sleep 0.1
  done
  expect "$what: its 2 ranks run (${ranks[*]})" [ "${#ranks[@]}" = 2 ]
  kill -TERM "$pid"
  expect "$what: the parent ended within 10 s" ends_within "$pid" 10
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" || RC=$?
  expect "$what: exit 143" exited 143
  for p in "${ranks[@]}"; do expect "$what: rank pid $p ended" not alive "$p"; done
  kill -KILL -- "-$pid" 2>/dev/null  # what survived (a failed check)
}
stop_parent "moe, SIGTERM to the parent alone" "$MOE" --mem host --mps off "${MOE_ARGS[@]}" \
  -n 200000 -c 0
stop_parent "moe with a daemon, SIGTERM to the parent alone" "$MOE" --mem host --mps on \
  "${MOE_ARGS[@]}" -n 200000 -c 0
private "moe with a daemon, SIGTERM to the parent alone"
stop_parent "alltoall, SIGTERM to the parent alone" "$A2A" --mem host --mps off "${A2A_ARGS[@]}" \
  -n 200000 -c 0

# ---- 9c. SIGTERM to the parent while its daemon starts (a `-d` that takes 3 s): the daemon is
# stopped once up and its /tmp/fusco-mps.* folder removed, no rank runs, exit 143
rm -f "$J"
: >"$FAKE_MPS_LOG"
RC=0
setsid env PATH="$T/path" FUSCO_PERF_FAKE_DEVICES=1 CUDA_MPS_PIPE_DIRECTORY="$T/nopipe" \
  FAKE_MPS_START_S=3 "$MOE" --mem host --mps on "${MOE_ARGS[@]}" -J "$J" >"$T/stdout" \
  2>"$T/stderr" &
PID=$!
for _ in $(seq 1 600); do
  grep -q "^start " "$FAKE_MPS_LOG" && break
  sleep 0.1
done
sleep 0.5  # in the fake's sleep
kill -TERM "$PID"
expect "moe stopped while its daemon starts: the parent ended within 15 s" ends_within "$PID" 15
kill -KILL "$PID" 2>/dev/null
wait "$PID" || RC=$?
expect "moe stopped while its daemon starts: exit 143" exited 143
private "moe stopped while its daemon starts" no-header
expect "moe stopped while its daemon starts: no rank ran" no_json
kill -KILL -- "-$PID" 2>/dev/null  # what survived (a failed check)

# ---- 10. a bad value is refused
run "$T/path" "$MOE" --mps maybe "${MOE_ARGS[@]}"
expect "moe --mps maybe: exit 2" exited 2
run "$T/path" "$A2A" --mps maybe "${A2A_ARGS[@]}"
expect "alltoall --mps maybe: exit 2" exited 2

if [ "$FAILS" -gt 0 ]; then
  echo "perf_mps: $FAILS check(s) failed"
  exit 1
fi
echo "perf_mps: every check passed"
