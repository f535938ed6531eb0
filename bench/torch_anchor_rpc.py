# PyTorch 1.13 on bench_rpc's cases: torch.distributed.rpc (TensorPipe backend) between two
# worker processes on 127.0.0.1. Measures, the way bench_rpc measures gradwire, the latency of
# rpc_sync(min, (1, 2)), the throughput of rpc_async with 64 calls in flight, and float32
# tensor round trips of 1, 16 and 64 MiB through an identity function. Prints one JSON line:
#   {"rpc_sync_us": ..., "async_calls_per_s": ..., "rt_1mib_gbps": ..., "rt_16mib_gbps": ...,
#    "rt_64mib_gbps": ..., "transport": ..., "channel": ...}
#
#   torch_anchor_rpc.py            run the benchmark (rank 0; starts rank 1 itself)
#   torch_anchor_rpc.py --peer P   be rank 1 of the run whose store listens on port P
#
# TensorPipe runs over TCP as torch_rpc_setup.py pins it.
import sys

import torch_blas  # first: before torch loads the BLAS
import torch

from torch_rpc_setup import backend_options, free_port, run_with_peers, transport_fields
from torch_timing import seconds_per_call
import torch.distributed.rpc as rpc

IN_FLIGHT = 64
NUM_THREADS = 4
SIZES_MIB = (1, 16, 64)


# Returns its argument: defined at module top level so that rank 1, which runs this same
# file as __main__, can unpickle it by name.
def identity(t):
    return t


def peer(port):
    rpc.init_rpc("worker1", rank=1, world_size=2,
                 rpc_backend_options=backend_options(port, NUM_THREADS))
    rpc.shutdown()  # graceful: returns once rank 0 has finished and shut down too


def bench():
    results = {}
    results["rpc_sync_us"] = seconds_per_call(
        lambda: rpc.rpc_sync("worker1", min, args=(1, 2))) * 1e6

    def burst():
        futs = [rpc.rpc_async("worker1", min, args=(i, 2)) for i in range(IN_FLIGHT)]
        torch.futures.wait_all(futs)

    results["async_calls_per_s"] = IN_FLIGHT / seconds_per_call(burst)

    for mib in SIZES_MIB:
        x = torch.ones(mib << 18)  # float32: 4 bytes each
        nbytes = x.numel() * x.element_size()
        # Same batch length and trial count as bench_rpc's tensor cases.
        t = seconds_per_call(lambda: rpc.rpc_sync("worker1", identity, args=(x,)), 0.2, 5)
        results[f"rt_{mib}mib_gbps"] = 2.0 * nbytes / t / 1e9
    return results


def main():
    torch.set_num_threads(1)
    if len(sys.argv) == 3 and sys.argv[1] == "--peer":
        peer(int(sys.argv[2]))
        return
    port = free_port()

    def rank0():
        rpc.init_rpc("worker0", rank=0, world_size=2,
                     rpc_backend_options=backend_options(port, NUM_THREADS))
        results = bench()
        results.update(transport_fields())
        rpc.shutdown()
        return results

    run_with_peers(__file__, [[str(port)]], rank0)


if __name__ == "__main__":
    main()
