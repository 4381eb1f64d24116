#!/usr/bin/env bash
# Compares the shim's dynamic exports with the functions nccl.h declares: they must be the same.
set -euo pipefail
lib=$1 header=$2
diff <(nm -D --defined-only "$lib" | awk '{print $3}' | sort) \
     <(grep -oE '\bp?nccl[A-Za-z0-9]+\(' "$header" | tr -d '(' | sort -u)
echo "exports match $header"
