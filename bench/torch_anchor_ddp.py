# PyTorch 1.13 on bench_ddp's cases: torch.nn.parallel.DistributedDataParallel over the gloo
# backend, two processes on 127.0.0.1, single-threaded like gradwire's default. Prints one JSON
# line:
#   big_local_ms, big_ddp_ms   ms per SGD step of the 784-4096-2560-10 MLP (13.7M parameters)
#                              on a batch of 32, without and with DDP (both ranks stepping),
#                              in alternating rounds, the best round of each
#   mnist_samples_per_s        DDP training throughput of the 784-256-128-10 MLP, batch 32 per
#                              rank, samples per second over both ranks
#
#   torch_anchor_ddp.py               run (rank 0; starts rank 1 itself)
#   torch_anchor_ddp.py --peer PORT   be rank 1
import sys
import time

import torch_blas  # first: before torch loads the BLAS
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from torch_rpc_setup import free_port, run_with_peers

BIG_ROUNDS = 5
BIG_STEPS = 3
MNIST_STEPS = 200
BATCH = 32


def mlp(sizes):
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class Trainer:
    """SGD steps of a model on one fixed batch."""

    def __init__(self, model):
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=0.01)
        self.x = torch.randn(BATCH, 784)
        self.y = torch.randint(0, 10, (BATCH,))

    def step(self):
        self.opt.zero_grad()
        F.cross_entropy(self.model(self.x), self.y).backward()
        self.opt.step()

    def ms_per_step(self, steps):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        return (time.perf_counter() - start) / steps * 1e3


def run(rank, port):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    torch.manual_seed(0)
    # A plain model and a DDP one, timed in alternating rounds (the best round of each).
    local = Trainer(mlp([784, 4096, 2560, 10]))
    ddp = Trainer(nn.parallel.DistributedDataParallel(mlp([784, 4096, 2560, 10])))
    for _ in range(2):
        local.step()
        ddp.step()
    results = {"big_local_ms": 1e30, "big_ddp_ms": 1e30}
    for _ in range(BIG_ROUNDS):
        results["big_local_ms"] = min(results["big_local_ms"], local.ms_per_step(BIG_STEPS))
        results["big_ddp_ms"] = min(results["big_ddp_ms"], ddp.ms_per_step(BIG_STEPS))
    small = Trainer(nn.parallel.DistributedDataParallel(mlp([784, 256, 128, 10])))
    small.step()
    small.step()
    results["mnist_samples_per_s"] = 2 * BATCH / (small.ms_per_step(MNIST_STEPS) / 1e3)
    dist.barrier()
    dist.destroy_process_group()
    return results


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--peer":
        run(1, int(sys.argv[2]))
        return
    port = free_port()
    run_with_peers(__file__, [[str(port)]], lambda: run(0, port))


if __name__ == "__main__":
    main()
