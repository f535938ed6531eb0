// gw::store::detect_launch_env: who this process is in its job, read from whatever launched it.
//
// A PyTorch program learns its rank from torchrun's variables; the cluster engines set their
// own. This reads, in this order (the first launcher whose variables are present wins, so
// gwrun or torchrun started by srun is gwrun or torchrun):
//
//   gwrun, torchrun,    RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (the last two optional:
//   PyTorchJob ("env")  a PyTorchJob runs one process per pod), MASTER_ADDR, MASTER_PORT
//   OpenMPI (mpirun)    OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; the master is
//                       MASTER_ADDR, else loopback when every rank is on this node; the port
//                       MASTER_PORT, else one derived from the job's id
//   Slurm (srun)        SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), SLURM_LOCALID,
//                       SLURM_STEP_TASKS_PER_NODE with SLURM_NODEID (inside an srun step
//                       only: a batch script is not one of the job's tasks); the master is
//                       MASTER_ADDR, else the first host of SLURM_JOB_NODELIST; the port
//                       MASTER_PORT, else one derived from SLURM_JOB_ID and SLURM_STEP_ID
//
// and, when none of them is there, a job of one process on loopback. Variables that contradict
// each other or are malformed (a RANK without WORLD_SIZE, a rank outside the world, a port
// that is not one) are an InvalidArgumentError naming the variables and their values.
//
//   LaunchEnv env = detect_launch_env();   // under srun -n 4: launcher "slurm", rank 0..3
//   init_rpc("worker" + std::to_string(env.rank), env.rank, env.world_size);
//   // or just gw::rpc::init_rpc("worker{rank}"), which does the same
#pragma once

#include <cstdint>
#include <string>

namespace gw::store {

struct LaunchEnv {
  // "gwrun", "torchrun", "env" (RANK and WORLD_SIZE alone: Kubeflow's PyTorchJob),
  // "openmpi", "slurm", or "none".
  std::string launcher = "none";
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;  // on this node
  std::string master_addr = "127.0.0.1";     // a host name or IP address
  uint16_t master_port = 0;                  // 0: none known (only a job of one may use it)

  // The rendezvous URL of this job: "tcp://master_addr:master_port" ([v6] bracketed).
  std::string init_method() const;
  // One line for logs: "slurm: rank 2 of 4 (local 0 of 2), master node1:29512".
  std::string describe() const;
};

// Reads the environment (see above). Throws InvalidArgumentError on an inconsistent one.
LaunchEnv detect_launch_env();

// The first host of a Slurm node list: "node[07-09,12],gpu1" -> "node07".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace gw::store
