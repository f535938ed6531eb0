# PyTorch 1.13 on bench_dist_autograd's cases: torch.distributed.autograd over
# torch.distributed.rpc (TensorPipe backend) between three worker processes on 127.0.0.1,
# worker0 (rank 0, which drives every case), worker1 and worker2. Measures:
#   one_rpc_iter_us   microseconds per iteration of the distributed autograd design note's
#                     first example, on worker0: in a fresh context, t3 = rpc_sync to worker1
#                     of my_add(t1, t2), t5 = t3 * t4, backward from t5.sum(), get_gradients
#                     (t1, t2, t4: 3x3 leaves made once, outside the timing)
#   e2e_iter_us       microseconds per iteration of the note's simple end to end example, on
#                     worker0: in a fresh context, two rpc.remote calls of random_tensor on
#                     worker1, to_here both, backward from their sum's sum, a new
#                     DistributedOptimizer(SGD, lr 0.05) over the two RRefs, one step
#   ps_samples_per_s  parameter-server training throughput: worker0 holds the MLP
#                     784-256-128-10 (ReLU between, seed 0) as an RRef; worker1 and worker2
#                     are trainers, each running PS_STEPS steps concurrently of: in a fresh
#                     context, forward by rpc_sync on worker0 (through a copy of each weight:
#                     see Net), cross entropy, dist backward, DistributedOptimizer(SGD, lr
#                     0.01) step, on one fixed random batch of PS_BATCH samples of its own
#                     (seeded by its rank); total samples over the wall seconds from worker0
#                     starting both trainers to both finishing (after PS_WARMUP steps each
#                     that are not timed)
# Prints one JSON line:
#   {"one_rpc_iter_us": ..., "e2e_iter_us": ..., "ps_samples_per_s": ..., "ps_trainers": 2,
#    "ps_batch": 64, "transport": ..., "channel": ...}
#
#   torch_anchor_dist_autograd.py              run the benchmark (rank 0; starts ranks 1, 2)
#   torch_anchor_dist_autograd.py --peer P R   be rank R of the run whose store listens on P
#
# TensorPipe runs over TCP as torch_rpc_setup.py pins it.
import sys
import time

import torch_blas  # first: before torch loads the BLAS
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.nn.functional as F
from torch import optim
from torch.distributed.optim import DistributedOptimizer

from torch_rpc_setup import backend_options, free_port, run_with_peers, transport_fields
from torch_timing import seconds_per_call

WORLD_SIZE = 3
# A trainer's train() holds one of its threads while its own nested calls complete.
NUM_THREADS = 8
TRAINERS = ("worker1", "worker2")
PS_BATCH = 64
PS_STEPS = 150  # per trainer, timed: about 3 s on an idle 2-core machine
PS_WARMUP = 5   # per trainer, not timed

# Everything the peers run is defined at module top level so that they, which run this same
# file as __main__, can unpickle it by name.


def my_add(a, b):
    return torch.add(a, b)


def random_tensor():
    return torch.rand((3, 3), requires_grad=True)


# The parameter server's model. Its forward multiplies by a copy of each weight (a clone, which
# autograd sees through, so the gradient still reaches the weight): the two trainers run
# concurrently, and one's optimizer step updating a weight in place while the other's
# backward still needs that weight's saved value would otherwise fail autograd's version
# check ("modified by an inplace operation"), as PyTorch's own parameter-server example does
# with two trainers. Biases are not saved for backward and need no copy.
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(784, 256), nn.ReLU(),
            nn.Linear(256, 128), nn.ReLU(),
            nn.Linear(128, 10))

    def forward(self, x):
        for layer in self.layers:
            if isinstance(layer, nn.Linear):
                x = F.linear(x, layer.weight.clone(), layer.bias)
            else:
                x = layer(x)
        return x

    def parameter_rrefs(self):
        return [rpc.RRef(p) for p in self.parameters()]


# A trainer's optimizer and batch, made on its first train() call and kept for the later
# ones (the warm-up call and the timed call), so that only the steps are timed.
_trainer = {}


def train(model_rref, steps, batch):
    if not _trainer:
        torch.manual_seed(rpc.get_worker_info().id)
        _trainer["opt"] = DistributedOptimizer(
            optim.SGD, model_rref.rpc_sync().parameter_rrefs(), lr=0.01)
        _trainer["x"] = torch.randn(batch, 784)
        _trainer["y"] = torch.randint(0, 10, (batch,))
    opt, x, y = _trainer["opt"], _trainer["x"], _trainer["y"]
    loss = None
    for _ in range(steps):
        with dist_autograd.context() as cid:
            out = model_rref.rpc_sync().forward(x)
            loss = F.cross_entropy(out, y)
            dist_autograd.backward(cid, [loss])
            opt.step(cid)
    return loss.item()


def peer(port, rank):
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=WORLD_SIZE,
                 rpc_backend_options=backend_options(port, NUM_THREADS))
    rpc.shutdown()  # graceful: returns once every rank has finished and shut down too


def bench():
    results = {}

    t1 = torch.rand((3, 3), requires_grad=True)
    t2 = torch.rand((3, 3), requires_grad=True)
    t4 = torch.rand((3, 3), requires_grad=True)

    def one_rpc_iter():
        with dist_autograd.context() as context_id:
            t3 = rpc.rpc_sync("worker1", my_add, args=(t1, t2))
            t5 = torch.mul(t3, t4)
            loss = t5.sum()
            dist_autograd.backward(context_id, [loss])
            dist_autograd.get_gradients(context_id)

    results["one_rpc_iter_us"] = seconds_per_call(one_rpc_iter) * 1e6

    def e2e_iter():
        with dist_autograd.context() as context_id:
            rref1 = rpc.remote("worker1", random_tensor)
            rref2 = rpc.remote("worker1", random_tensor)
            loss = rref1.to_here() + rref2.to_here()
            dist_autograd.backward(context_id, [loss.sum()])
            dist_optim = DistributedOptimizer(optim.SGD, [rref1, rref2], lr=0.05)
            dist_optim.step(context_id)

    results["e2e_iter_us"] = seconds_per_call(e2e_iter) * 1e6

    torch.manual_seed(0)
    model_rref = rpc.remote("worker0", Net)

    def run_trainers(steps):
        futs = [rpc.rpc_async(w, train, args=(model_rref, steps, PS_BATCH)) for w in TRAINERS]
        torch.futures.wait_all(futs)

    run_trainers(PS_WARMUP)
    start = time.perf_counter()
    run_trainers(PS_STEPS)
    elapsed = time.perf_counter() - start
    results["ps_samples_per_s"] = len(TRAINERS) * PS_STEPS * PS_BATCH / elapsed
    results["ps_trainers"] = len(TRAINERS)
    results["ps_batch"] = PS_BATCH
    return results


def main():
    torch.set_num_threads(1)
    if len(sys.argv) == 4 and sys.argv[1] == "--peer":
        peer(int(sys.argv[2]), int(sys.argv[3]))
        return
    port = free_port()

    def rank0():
        rpc.init_rpc("worker0", rank=0, world_size=WORLD_SIZE,
                     rpc_backend_options=backend_options(port, NUM_THREADS))
        results = bench()
        results.update(transport_fields())
        rpc.shutdown()
        return results

    run_with_peers(__file__, [[str(port), str(rank)] for rank in range(1, WORLD_SIZE)], rank0)


if __name__ == "__main__":
    main()
