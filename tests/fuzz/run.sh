#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in build-fuzz/ and runs each for SECONDS (default 60).
#   tests/fuzz/run.sh [SECONDS]          short run (CI)
#   tests/fuzz/run.sh 3600               long run; FUSCO_FUZZ_JOBS=N runs N workers per target
# The corpus grows in build-fuzz/corpus/<target> (seeded from tests/fuzz/corpus/<target>); a crash
# leaves its input in build-fuzz/artifacts/<target>/ and makes this script exit non-zero.
set -u
secs=${1:-60}
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${FUSCO_FUZZ_BUILD:-$root/build-fuzz}
jobs=${FUSCO_FUZZ_JOBS:-1}
targets="fuzz_layout fuzz_moe_plan fuzz_bootstrap_wire"

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DFUSCO_FUZZ=ON -DFUSCO_BUILD_PERF=OFF \
  -DFUSCO_BUILD_EXAMPLES=OFF -DFUSCO_BUILD_TESTS=ON -DFUSCO_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug \
  >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; echo "fuzz: configure failed"; exit 2; }
# shellcheck disable=SC2086
cmake --build "$build" --target $targets -j"${FUSCO_FUZZ_BUILD_JOBS:-2}" || { echo "fuzz: build failed"; exit 2; }

status=0
summary=""
for t in $targets; do
  corpus="$build/corpus/$t"
  art="$build/artifacts/$t"
  mkdir -p "$corpus" "$art"
  log="$build/$t.log"
  extra=()
  [ "$jobs" -gt 1 ] && extra=(-jobs="$jobs" -workers="$jobs")
  echo "fuzz: $t for ${secs}s"
  cd "$build" || exit 2
  "$build/tests/fuzz/$t" "$corpus" "$root/tests/fuzz/corpus/$t" -max_total_time="$secs" \
    -print_final_stats=1 -artifact_prefix="$art/" -rss_limit_mb=2048 -timeout=10 "${extra[@]}" \
    >"$log" 2>&1
  rc=$?
  execs=$(grep -h 'stat::number_of_executed_units' "$log" "$build"/fuzz-*.log 2>/dev/null |
          awk '{s += $2} END {print s + 0}')
  if [ "$rc" -ne 0 ]; then
    status=1
    echo "fuzz: $t FAILED (exit $rc); last lines of $log:"
    tail -40 "$log"
    ls "$art"
  fi
  summary+=$(printf '%-22s %12s executions  %s' "$t" "$execs" "$([ $rc -eq 0 ] && echo ok || echo CRASH)")$'\n'
done
echo "fuzz summary (${secs}s each):"
printf '%s' "$summary"
exit $status
