# What the PyTorch anchor scripts share: the torch.distributed.rpc set-up, a free port, and
# running rank 0 beside a peer process.
#
# TensorPipe is pinned to its TCP transport ("uv") and the channel that sends tensor bytes on
# that same connection ("basic"): gradwire moves bytes over loopback TCP connections, and
# TensorPipe's defaults on one host (shared-memory transport, cross-memory-attach channel)
# would measure a different path. Set GW_TORCH_RPC_DEFAULT_TRANSPORTS=1 to measure PyTorch's
# defaults instead.
import json
import os
import socket
import subprocess
import sys

import torch_blas  # first: before torch loads the BLAS
import torch.distributed.rpc as rpc

PINNED = {} if os.environ.get("GW_TORCH_RPC_DEFAULT_TRANSPORTS") else {
    "_transports": ["uv"], "_channels": ["basic"]}


def backend_options(port, num_worker_threads):
    # Generous timeouts: a loaded 2-core machine must not turn a slow call into an error,
    # and the C++ side bounds the whole run with `timeout` anyway.
    return rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=num_worker_threads, rpc_timeout=120,
        init_method=f"tcp://127.0.0.1:{port}", **PINNED)


def transport_fields():
    # Which path was measured, for the JSON line.
    return {"transport": ",".join(PINNED.get("_transports", ["default"])),
            "channel": ",".join(PINNED.get("_channels", ["default"]))}


def free_port():
    # Port 0 lets the kernel pick; rank 0's store binds it again right after. Another process
    # could take it in between, which is unlikely enough: the run then fails and the bench
    # falls back to published figures.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_with_peers(script, peers, rank0):
    """Starts `script --peer ARGS...` once per argument list in `peers` (ranks 1, 2, ...), runs
    rank0() here, waits for the peers and prints rank0's result, with the BLAS it ran on, as one
    JSON line; exits 1 if a peer failed."""
    children = [subprocess.Popen([sys.executable, os.path.abspath(script), "--peer"] + args,
                                 stdout=subprocess.DEVNULL) for args in peers]
    try:
        results = rank0()
        if any([child.wait(timeout=120) != 0 for child in children]):
            sys.exit(1)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    print(json.dumps({**results, "blas": torch_blas.in_use()}), flush=True)
