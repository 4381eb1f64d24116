#!/usr/bin/env bash
# Runs /usr/bin/python3 with the given arguments (the pytest suite or an example) for ctest.
# Debian's python3-torch and python3-pytest are importable by /usr/bin/python3, not necessarily by
# the python3 first on PATH. Exits 77 (ctest: skipped) with the reason when torch or pytest is
# missing there.
set -u
PY=/usr/bin/python3
if [ ! -x "$PY" ]; then
  echo "skipped: $PY does not exist (the PyTorch plugin's tests need Debian's python3-torch)"
  exit 77
fi
for mod in torch pytest; do
  if ! err=$("$PY" -c "import $mod" 2>&1); then
    echo "skipped: $PY cannot import $mod (scripts/install-deps installs python3-torch and" \
         "python3-pytest): $(printf '%s' "$err" | tail -n 1)"
    exit 77
  fi
done
exec "$PY" "$@"
