#!/usr/bin/env bash
# Under OpenMPI's mpirun: `mpirun -np 2` DDP training (over Gloo and over MPI) and `mpirun -np 3` the RPC examples, with a
# job key; the programs take their ranks, world size and master from OpenMPI's variables alone.
# Skips (exit 77) without Debian's openmpi-bin.
#   mpi.sh <build dir>
set -euo pipefail
build=$(readlink -f "$1")
command -v mpirun >/dev/null || { echo "skipped: no mpirun (Debian: openmpi-bin)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
umask 077
python3 -c 'import secrets; print(secrets.token_hex(32))' >"$work/job.key"
export GW_JOB_KEY_FILE=$work/job.key
# As root (CI), OpenMPI wants to be told; two cores: more ranks than cores is fine here.
mpi=(mpirun --oversubscribe -x GW_JOB_KEY_FILE)
[[ $(id -u) == 0 ]] && mpi+=(--allow-run-as-root)

source "$(dirname "$0")/check.sh"

timeout 300 "${mpi[@]}" -np 2 "$build/examples/ddp_train" --epochs 1 --limit 3200 --target 0.5 \
  >"$work/ddp.out" 2>&1 || { echo "FAILED: mpirun ddp_train"; cat "$work/ddp.out"; fail=1; }
check "mpirun -np 2 ddp_train: identical replicas" "parameters identical to rank 0's: yes" 2 \
  "$work/ddp.out"

if [[ -x $build/tests/dist/process_group/mpi_probe ]]; then  # a build with MPI
  timeout 300 "${mpi[@]}" -np 2 "$build/examples/ddp_train" --backend mpi --epochs 1 \
    --limit 3200 --target 0.5 >"$work/ddp_mpi.out" 2>&1 ||
    { echo "FAILED: mpirun ddp_train --backend mpi"; cat "$work/ddp_mpi.out"; fail=1; }
  check "mpirun -np 2 ddp_train --backend mpi: identical replicas" \
    "parameters identical to rank 0's: yes" 2 "$work/ddp_mpi.out"
fi

timeout 300 "${mpi[@]}" -np 3 "$build/examples/rpc_basics" >"$work/rpc.out" 2>&1 ||
  { echo "FAILED: mpirun rpc_basics"; cat "$work/rpc.out"; fail=1; }
check "mpirun -np 3 rpc_basics" "get_worker_info:     WorkerInfo(name=worker2, id=2)" 1 \
  "$work/rpc.out"
exit $fail
