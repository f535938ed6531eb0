// RPC with what the dist layer adds to it (torch.distributed.rpc.init_rpc with distributed
// autograd in): a program that uses distributed autograd, the DistributedOptimizer, RemoteModule
// or RemoteModule checkpoints starts RPC on every worker with gw::dist::init_rpc.
//
// Mental model: rpc sits below dist and knows nothing of it. An agent takes, in its options, the
// extensions that the layers above hand it (rpc::RpcBackendOptions::extensions); it installs them
// while it is constructed, before any request can arrive. The dist layer's extension gives the
// agent distributed autograd (its context container, the agent's AutogradHook) and registers the
// functions through which other workers' DistributedOptimizer, RemoteModule and checkpoints reach
// this worker, which may never make any of them itself: so every worker of such a job starts RPC
// this way, including a passive parameter server.
//
//   gw::dist::init_rpc("worker{rank}");        // as gw::rpc::init_rpc, same arguments
//   {
//     gw::dist::autograd::Context ctx;
//     Tensor loss = gw::rpc::rpc_sync("worker1", forward, x).sum();
//     gw::dist::autograd::backward(ctx.id(), {loss});
//   }
//   gw::rpc::shutdown();
//
// An agent started with gw::rpc::init_rpc alone refuses distributed autograd: its messages fail
// with an error that names gw::dist::init_rpc. A program that makes its agents itself passes
// `with_dist(options)`.
#pragma once

#include <string>

#include "rpc/agent.h"

namespace gw::dist {

// What dist installs on an agent (an RpcBackendOptions extension).
void extend_agent(rpc::Agent& agent);
// `options` with extend_agent added to its extensions (once, however often it is called).
rpc::RpcBackendOptions with_dist(rpc::RpcBackendOptions options);

// gw::rpc::init_rpc with with_dist(options): see rpc/api.h for the arguments.
void init_rpc(const std::string& name, int rank, int world_size,
              rpc::RpcBackendOptions options = {});
void init_rpc(const std::string& name, rpc::RpcBackendOptions options = {});

}  // namespace gw::dist
