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
# TensorPipe is pinned to its TCP transport ("uv") and the channel that sends tensor bytes on
# that same connection ("basic"): gradwire moves bytes over one loopback TCP connection, and
# TensorPipe's defaults on one host (shared-memory transport, cross-memory-attach channel)
# would measure a different path. Set GW_TORCH_RPC_DEFAULT_TRANSPORTS=1 to measure PyTorch's
# defaults instead.
import json
import os
import socket
import subprocess
import sys

import torch

from torch_timing import seconds_per_call
import torch.distributed.rpc as rpc

IN_FLIGHT = 64
SIZES_MIB = (1, 16, 64)


# Returns its argument: defined at module top level so that rank 1, which runs this same
# file as __main__, can unpickle it by name.
def identity(t):
    return t


# TensorPipe's own defaults when the variable is set, else TCP only (see the top comment).
PINNED = {} if os.environ.get("GW_TORCH_RPC_DEFAULT_TRANSPORTS") else {
    "_transports": ["uv"], "_channels": ["basic"]}


def backend_options(port):
    # Generous timeouts: a loaded 2-core machine must not turn a slow call into an error,
    # and the C++ side bounds the whole run with `timeout` anyway.
    return rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=4, rpc_timeout=120, init_method=f"tcp://127.0.0.1:{port}", **PINNED)


def free_port():
    # Port 0 lets the kernel pick; rank 0's store binds it again right after. Another process
    # could take it in between, which is unlikely enough: the run then fails and the bench
    # falls back to published figures.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peer(port):
    rpc.init_rpc("worker1", rank=1, world_size=2, rpc_backend_options=backend_options(port))
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
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--peer", str(port)],
                             stdout=subprocess.DEVNULL)
    try:
        rpc.init_rpc("worker0", rank=0, world_size=2, rpc_backend_options=backend_options(port))
        results = bench()
        results["transport"] = ",".join(PINNED.get("_transports", ["default"]))
        results["channel"] = ",".join(PINNED.get("_channels", ["default"]))
        rpc.shutdown()
        if child.wait(timeout=60) != 0:
            sys.exit(1)
    finally:
        if child.poll() is None:
            child.kill()
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
