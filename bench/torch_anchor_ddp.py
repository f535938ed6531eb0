# PyTorch 1.13 on bench_ddp's cases: torch.nn.parallel.DistributedDataParallel over the gloo
# backend, two processes on 127.0.0.1, single-threaded like gradwire's default. Prints one JSON
# line:
#   big_local_ms, big_ddp_ms   ms per SGD step of the 784-4096-2560-10 MLP (13.7M parameters)
#                              on a batch of 32, without and with DDP (both ranks stepping)
#   mnist_samples_per_s        DDP training throughput of the 784-256-128-10 MLP, batch 32 per
#                              rank, samples per second over both ranks
#
#   torch_anchor_ddp.py               run (rank 0; starts rank 1 itself)
#   torch_anchor_ddp.py --peer PORT   be rank 1
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from torch_rpc_setup import free_port, run_with_peer

BIG_STEPS = 10
MNIST_STEPS = 200
BATCH = 32


def mlp(sizes):
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def ms_per_step(model, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(BATCH, 784)
    y = torch.randint(0, 10, (BATCH,))

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(2):
        step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps * 1e3


def run(rank, port):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    torch.manual_seed(0)
    big = mlp([784, 4096, 2560, 10])
    results = {"big_local_ms": ms_per_step(big, BIG_STEPS)}
    results["big_ddp_ms"] = ms_per_step(nn.parallel.DistributedDataParallel(big), BIG_STEPS)
    small = nn.parallel.DistributedDataParallel(mlp([784, 256, 128, 10]))
    results["mnist_samples_per_s"] = 2 * BATCH / (ms_per_step(small, MNIST_STEPS) / 1e3)
    dist.barrier()
    dist.destroy_process_group()
    return results


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--peer":
        run(1, int(sys.argv[2]))
        return
    port = free_port()
    run_with_peer(__file__, [str(port)], lambda: run(0, port))


if __name__ == "__main__":
    main()
