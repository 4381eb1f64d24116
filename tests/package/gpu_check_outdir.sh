#!/usr/bin/env bash
# package.gpu_check_outdir: scripts/gpu-check keeps its hands off what it did not make in OUTDIR,
# and refuses an OUTDIR it cannot write (exit 2, one line on stderr) before it looks for a GPU.
# Usage: gpu_check_outdir.sh GPU_CHECK (the script, e.g. scripts/gpu-check of the source tree).
# It runs GPU_CHECK on a fake bundle (shell scripts in place of the programs, enough for the
# bundle's checks) with a fake nvidia-smi that fails, so the check ends at "no GPU" (exit 77) on
# every machine, also on one with a GPU. Runs as root too (an unwritable OUTDIR is one below a
# regular file or in /proc, which root cannot write either).
set -uo pipefail
CHECK=${1:?usage: gpu_check_outdir.sh GPU_CHECK}
CHECK=$(cd "$(dirname "$CHECK")" && pwd)/$(basename "$CHECK")
[ -f "$CHECK" ] || { echo "FAIL: no $CHECK"; exit 1; }
T=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-outdir.XXXXXX")
trap 'rm -rf "$T"' EXIT
FAILS=0
fail() {
  echo "FAIL: $*"
  FAILS=$((FAILS + 1))
}
ok() { echo "ok: $*"; }
not() { ! "$@"; }

# ---- a fake bundle: what gpu-check looks at before it asks for a GPU
B=$T/bundle
mkdir -p "$B/bin" "$B/lib/shim" "$B/python/fusco" "$B/python/tests" "$T/path"
cat >"$B/bin/fusco_gpu_tests" <<'EOF'
#!/bin/sh
# A stand-in for the [gpu] test binary: one test listed, none run.
case "$*" in *--gtest_list_tests*) printf 'GpuFake.\n  Test\n'; exit 0 ;; esac
echo "fake fusco_gpu_tests: not a real bundle" >&2
exit 1
EOF
printf '#!/bin/sh\necho "fusco (fake bundle)"\n' >"$B/bin/fusco_info"
chmod +x "$B/bin/fusco_gpu_tests" "$B/bin/fusco_info"
: >"$B/lib/shim/libnccl.so.2"
: >"$B/python/fusco/__init__.py"
: >"$B/python/tests/harness.py"
: >"$B/python/torch_nccl_backend_check.py"
echo "fusco GPU bundle: fake, made by tests/package/gpu_check_outdir.sh" >"$B/MANIFEST.txt"
# nvidia-smi that finds no GPU, first on PATH
printf '#!/bin/sh\necho "NVIDIA-SMI has failed (fake, tests/package/gpu_check_outdir.sh)"\nexit 9\n' \
  >"$T/path/nvidia-smi"
chmod +x "$T/path/nvidia-smi"
run_check() {  # OUTDIR: runs the check; sets RC, ERR (stderr), OUT (stdout)
  RC=0
  PATH="$T/path:$PATH" GPU_CHECK_BUDGET_SEC=60 "$CHECK" "$B" "$1" >"$T/stdout" 2>"$T/stderr" || RC=$?
  ERR=$(cat "$T/stderr")
  OUT=$(cat "$T/stdout")
}

# expect WHAT CMD...: ok when CMD succeeds, else a failure.
expect() {
  local what=$1
  shift
  if "$@"; then ok "$what"; else fail "$what"; fi
}
holds() { [ "$(cat "$1" 2>/dev/null)" = "$2" ]; }  # FILE TEXT: FILE holds exactly TEXT
exited() {  # CODE: the last run exited CODE (else its output is shown)
  [ "$RC" = "$1" ] && return 0
  echo "  exit $RC; stderr: $ERR"
  echo "  stdout: $OUT"
  return 1
}

# ---- 1. an OUTDIR holding a user's own work/ folder and other files: they stay
O=$T/out
mkdir -p "$O/work/sub"
echo "mine" >"$O/work/keep.txt"
echo "mine too" >"$O/work/sub/deep.txt"
echo "other" >"$O/notes.txt"
echo "old summary" >"$O/summary.txt"  # the check's own file: replaced
run_check "$O"
expect "no GPU: exit 77" exited 77
expect "OUTDIR/work/keep.txt kept" holds "$O/work/keep.txt" mine
expect "OUTDIR/work/sub/deep.txt kept" holds "$O/work/sub/deep.txt" "mine too"
expect "OUTDIR/notes.txt kept" holds "$O/notes.txt" other
expect "summary.txt says 'libraries: ok'" grep -qx "libraries: ok" "$O/summary.txt"
expect "summary.txt says there is no GPU" grep -q "^no GPU: " "$O/summary.txt"
expect "summary.txt is this run's" not grep -q "old summary" "$O/summary.txt"
tar -tzf "$O/all.tar.gz" >"$T/members" 2>&1
expect "all.tar.gz holds the raw logs under work/" grep -qx "work/gpu-check.log" "$T/members"
left=$(cd "$O" && find . -mindepth 1 -maxdepth 1 ! -name work ! -name notes.txt ! -name summary.txt \
  ! -name all.tar.gz ! -name gpu-check.log | sort | tr '\n' ' ')
expect "nothing else left in OUTDIR (left: '$left')" [ -z "$left" ]

# ---- 2. a second run into the same OUTDIR: the same
run_check "$O"
expect "second run: exit 77" exited 77
expect "second run: OUTDIR/work/keep.txt kept" holds "$O/work/keep.txt" mine

# ---- 3. OUTDIR that cannot be a folder or cannot be written: exit 2, one line on stderr
check_refused() {  # WHAT OUTDIR
  run_check "$2"
  if [ "$RC" = 2 ] && [ "$(printf '%s\n' "$ERR" | grep -c .)" = 1 ] && [[ $ERR == gpu-check:* ]]; then
    ok "$1: exit 2: $ERR"
  else
    fail "$1: exit $RC (2 expected) with stderr (one line 'gpu-check: ...' expected): $ERR"
  fi
}
echo "a file" >"$T/afile"
check_refused "OUTDIR is a regular file" "$T/afile"
expect "the regular file is unchanged" holds "$T/afile" "a file"
check_refused "OUTDIR below a regular file" "$T/afile/sub"
[ -d /proc/self ] && check_refused "OUTDIR in /proc (cannot be made)" /proc/fusco-gpu-check-outdir-test
[ -d /proc/self ] && check_refused "OUTDIR an existing folder nobody can write (/proc/self)" /proc/self

if [ "$FAILS" -gt 0 ]; then
  echo "gpu_check_outdir: $FAILS check(s) failed"
  exit 1
fi
echo "gpu_check_outdir: every check passed"
