"""PyTorch on the same GPU: the anchor of bench_cuda's "rpc echo" rows.

Two processes (this one as worker0, a spawned worker1), torch.distributed.rpc over TensorPipe
with the device map cuda:0 -> cuda:0, so that CUDA tensors go by TensorPipe's CUDA IPC channel;
an rpc_sync of an identity function on a float32 CUDA tensor of 1 and 64 MiB, timed as
bench_cuda times gradwire's (warm-up, then the mean of a batch lasting at least 0.1 s, best of
5 batches), printed as "cuda/rpc echo <N> MiB ...: <GB/s> GB/s" with GB/s = bytes / round trip.
Needs python3 with torch and a GPU; says why and exits 0 otherwise. Self-contained: the GPU
bundle (shared/gpu/bundle.sh) carries the bench/*cuda*.py scripts alone.
"""
import socket
import sys
import time

try:
    import torch
    import torch.distributed.rpc as rpc
    import torch.multiprocessing as mp
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"skipped: no torch ({e})")
    sys.exit(0)

SIZES_MIB = (1, 64)


def identity(t):
    return t


def options(port, to):
    o = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, init_method=f"tcp://127.0.0.1:{port}")
    o.set_device_map(to, {0: 0})
    return o


def peer(port):
    rpc.init_rpc("worker1", rank=1, world_size=2, rpc_backend_options=options(port, "worker0"))
    rpc.shutdown()  # graceful: returns once worker0 is done


def seconds_per_call(f, min_seconds=0.1, trials=5):
    f()
    torch.cuda.synchronize()
    batch, best, done = 1, float("inf"), 0
    while done < trials:
        start = time.perf_counter()
        for _ in range(batch):
            f()
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if elapsed < min_seconds:
            batch = max(batch * 2, int(batch * min_seconds / (elapsed + 1e-9) * 0.5))
            continue
        best = min(best, elapsed / batch)
        done += 1
    return best


def main():
    if not torch.cuda.is_available():
        print("skipped: torch sees no GPU")
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=peer, args=(port,))
    p.start()
    rpc.init_rpc("worker0", rank=0, world_size=2, rpc_backend_options=options(port, "worker1"))
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    for mib in SIZES_MIB:
        x = torch.ones(mib << 18, device="cuda:0")
        t = seconds_per_call(lambda: rpc.rpc_sync("worker1", identity, args=(x,)))
        print(f"cuda/rpc echo {mib} MiB, cuda:0 -> cuda:0, two processes: "
              f"{(mib << 20) / t / 1e9:.2f} GB/s", flush=True)
    rpc.shutdown()
    p.join(60)


if __name__ == "__main__":
    main()
