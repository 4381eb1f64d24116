#!/usr/bin/env bash
# `cc prog.c -lnccl` links to libfusco_nccl through the libnccl.so development link, in the build's
# shim directory and in an installed tree (<libdir>/fusco-nccl), as it does with NCCL's packages;
# the program then runs a one-rank ncclAlltoAll through the shim.
# Usage: check_dev_link.sh CC NCCL_INCLUDE_DIR SHIM_DIR NCCL_INSTALL_SCRIPT LIBFUSCO_DIR LIBDIR CMAKE
set -euo pipefail
cc=$1 inc=$2 shim=$3 install_script=$4 fusco_dir=$5 libdir=$6 cmake=$7
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/prog.c" <<'PROG'
#include <nccl.h>
#include <stdio.h>
#include <string.h>
int main(void) {
  int v = 0, in[4] = {1, 2, 3, 4}, out[4];
  ncclUniqueId id;
  ncclComm_t c = NULL;
  memset(out, 0xA5, sizeof(out));
  if (ncclGetVersion(&v) != ncclSuccess || v != NCCL_VERSION_CODE) return 1;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&c, 1, id, 0) != ncclSuccess)
    return 2;
  if (ncclAlltoAll(in, out, 4, ncclInt32, c, NULL) != ncclSuccess) return 3;
  if (memcmp(in, out, sizeof(in)) != 0) return 4;
  if (ncclCommDestroy(c) != ncclSuccess) return 5;
  printf("ok: NCCL %d through %s\n", v, ncclGetErrorString(ncclSuccess));
  return 0;
}
PROG
export FUSCO_NCCL_MEM=host FUSCO_NCCL_MODE=standalone LD_LIBRARY_PATH="$fusco_dir"
run() {  # $1: the directory holding libnccl.so
  [ -L "$1/libnccl.so" ] || { echo "no development link $1/libnccl.so"; exit 1; }
  "$cc" "$tmp/prog.c" -I"$inc" -L"$1" -lnccl -Wl,-rpath,"$1" -Wl,-rpath-link,"$fusco_dir" \
    -o "$tmp/prog"
  "$tmp/prog" || { echo "the program linked with -lnccl in $1 failed: $?"; exit 1; }
}
run "$shim"
"$cmake" -DCMAKE_INSTALL_PREFIX="$tmp/inst" -P "$install_script" >/dev/null
run "$tmp/inst/$libdir/fusco-nccl"
[ "$(readlink "$tmp/inst/$libdir/fusco-nccl/libnccl.so")" = libnccl.so.2 ] || exit 1
echo "cc -lnccl links against the build's shim and the installed one"
