#!/usr/bin/env bash
# Under a real Slurm: starts a one-node cluster on this machine (munged, slurmctld and slurmd
# with a minimal configuration, all in a scratch directory, on free ports), then runs, with a
# job key, `srun -n 2` DDP training (over Gloo, and over MPI with --mpi=pmix) and `srun -n 3`
# the RPC examples: the programs take their ranks, world size and master from Slurm's variables
# alone. Stops the daemons and removes everything at the end. Skips (exit 77) without root or
# Debian's slurmctld, slurmd and munge.
#   slurm.sh <build dir>
set -euo pipefail
build=$(readlink -f "$1")
skip() { echo "skipped: $*"; exit 77; }
[[ $(id -u) == 0 ]] || skip "a Slurm cluster needs root"
for p in munged slurmctld slurmd srun scontrol; do
  command -v "$p" >/dev/null || skip "no $p (Debian: munge, slurmctld, slurmd, slurm-client)"
done

work=$(mktemp -d)
pids=()
# Bounded: a daemon that ignores SIGTERM for 10 s (slurmd waiting on a step daemon that did
# not end) is killed, and so is every step daemon of this cluster (found by its SLURM_CONF).
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for i in $(seq 100); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  for stepd in $(pgrep slurmstepd || true); do
    if tr '\0' '\n' 2>/dev/null <"/proc/$stepd/environ" | grep -qx "SLURM_CONF=$work/slurm.conf"; then
      kill -9 "$stepd" 2>/dev/null || true
    fi
  done
  rm -rf "$work"
}
trap cleanup EXIT
# Slurm's two ports, held while the cluster lives as gwrun holds its master port (store::HeldPort):
# each bound alone on every address below the kernel's ephemeral range, then marked SO_REUSEADDR
# and never listening. No concurrent test can take one before the daemons bind it beside.
python3 - >"$work/ports" <<'PY' &
import random, socket, time
held = []
for _ in range(1000):  # bounded: 10000 ports to draw from
    if len(held) == 2:
        break
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", random.randrange(10000, 20000)))
    except OSError:
        s.close()
        continue
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.append(s)
print(*(s.getsockname()[1] for s in held), flush=True)
time.sleep(3600)  # until the cleanup kills it
PY
pids+=($!)
for i in $(seq 50); do [[ -s $work/ports ]] && break; sleep 0.1; done
read -r ctld_port slurmd_port <"$work/ports" || true
[[ -n ${slurmd_port:-} ]] || { echo "no two free ports for slurmctld and slurmd"; exit 1; }

# munge: its own key, socket and files.
mkdir -p "$work/munge" && chmod 700 "$work/munge"
dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$work/munge/munge.key"
munged --foreground --force --key-file="$work/munge/munge.key" \
  --socket="$work/munge/munge.socket" --pid-file="$work/munge/munged.pid" \
  --log-file="$work/munge/munged.log" --seed-file="$work/munge/munged.seed" \
  >>"$work/munge/munged.log" 2>&1 &
pids+=($!)

host=$(hostname)
mkdir -p "$work/state" "$work/spool"
export SLURM_CONF=$work/slurm.conf
cat >"$SLURM_CONF" <<CONF
ClusterName=gwtest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$work/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=gw Nodes=ALL Default=YES MaxTime=10 State=UP OverSubscribe=FORCE
CONF

for i in $(seq 50); do [[ -S $work/munge/munge.socket ]] && break; sleep 0.1; done
slurmctld -D -i >>"$work/slurmctld.log" 2>&1 &
pids+=($!)
slurmd -D >>"$work/slurmd.log" 2>&1 &
pids+=($!)
# Bounded: the node is up within 30 s or the test fails with the daemons' logs.
for i in $(seq 300); do
  state=$(sinfo -h -o %T 2>/dev/null || true)
  [[ $state == idle* ]] && break
  sleep 0.1
done
if [[ ${state:-} != idle* ]]; then
  echo "the one-node cluster did not come up (state: '${state:-}')"
  tail -20 "$work/slurmctld.log" "$work/slurmd.log" 2>/dev/null
  exit 1
fi

umask 077
key=$work/job.key
python3 -c 'import secrets; print(secrets.token_hex(32))' >"$key"
export GW_JOB_KEY_FILE=$key

source "$(dirname "$0")/check.sh"

timeout 300 srun -n 2 --overcommit "$build/examples/ddp_train" --epochs 1 --limit 3200 \
  --target 0.5 >"$work/ddp.out" 2>&1 || { echo "FAILED: srun ddp_train"; cat "$work/ddp.out"; fail=1; }
check "srun -n 2 ddp_train: identical replicas" "parameters identical to rank 0's: yes" 2 "$work/ddp.out"

# The MPI process group under srun: OpenMPI's ranks from Slurm's PMIx, no mpirun.
if [[ -x $build/tests/dist/process_group/mpi_probe ]] && srun --mpi=list 2>&1 | grep -q pmix; then
  timeout 300 srun --mpi=pmix -n 2 --overcommit "$build/examples/ddp_train" --backend mpi \
    --epochs 1 --limit 3200 --target 0.5 >"$work/ddp_mpi.out" 2>&1 ||
    { echo "FAILED: srun --mpi=pmix ddp_train --backend mpi"; cat "$work/ddp_mpi.out"; fail=1; }
  check "srun --mpi=pmix -n 2 ddp_train --backend mpi: identical replicas" \
    "parameters identical to rank 0's: yes" 2 "$work/ddp_mpi.out"
else
  echo "skipped: srun --mpi=pmix (a build without MPI, or Slurm without its pmix plugin)"
fi

timeout 300 srun -n 3 --overcommit "$build/examples/rpc_basics" >"$work/rpc.out" 2>&1 ||
  { echo "FAILED: srun rpc_basics"; cat "$work/rpc.out"; fail=1; }
check "srun -n 3 rpc_basics" "get_worker_info:     WorkerInfo(name=worker2, id=2)" 1 "$work/rpc.out"
exit $fail
