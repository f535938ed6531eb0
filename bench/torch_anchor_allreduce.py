# PyTorch 1.13 on bench_process_group's cases: torch.distributed.all_reduce (SUM) of float32
# tensors over the gloo backend between two processes on 127.0.0.1, for each size the C++ side
# measures, with the same iteration counts. Prints one JSON line mapping "allreduce_<bytes>_us"
# to microseconds per all_reduce.
#
#   torch_anchor_allreduce.py SIZE:ITERS ...      run (rank 0; starts rank 1 itself)
#   torch_anchor_allreduce.py --peer PORT SIZE:ITERS ...
import sys
import time

import torch_blas  # first: before torch loads the BLAS
import torch
import torch.distributed as dist

from torch_rpc_setup import free_port, run_with_peers


def run(rank, port, cases):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    results = {}
    for nbytes, iters in cases:
        t = torch.ones(max(nbytes // 4, 1))
        for _ in range(3):
            dist.all_reduce(t)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        results[f"allreduce_{nbytes}_us"] = (time.perf_counter() - start) / iters * 1e6
    dist.barrier()
    dist.destroy_process_group()
    return results


def main():
    torch.set_num_threads(1)
    if sys.argv[1] == "--peer":
        run(1, int(sys.argv[2]), [tuple(map(int, c.split(":"))) for c in sys.argv[3:]])
        return
    cases = [tuple(map(int, c.split(":"))) for c in sys.argv[1:]]
    port = free_port()
    run_with_peers(__file__, [[str(port)] + sys.argv[1:]], lambda: run(0, port, cases))


if __name__ == "__main__":
    main()
