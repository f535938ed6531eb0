# What the cluster tests share: counting the lines a run printed.
# check <what> <needle> <count> <output file>: prints ok or FAILED (and the output), and sets
# fail=1 on a mismatch.
fail=0
check() {
  local n
  n=$(grep -c -F -- "$2" "$4" || true)
  if [[ $n != "$3" ]]; then
    echo "FAILED: $1: expected $3 lines with '$2', found $n"; cat "$4"; fail=1
  else
    echo "ok: $1"
  fi
}
