"""PyTorch on the same GPU: the anchor of bench_cuda's memory-bound and attention rows.

Each case is the same work as the bench_cuda row of the same name, with the same byte count,
timed with CUDA events (warm-up, then the mean of a batch that lasts at least 50 ms, best of 9
batches), and printed as "cuda/<case>: <value> <unit>": GB/s for the memory-bound cases,
TFLOP/s and MiB for attention. Needs python3 with torch and a GPU; says
why and exits 0 otherwise, so a machine without them skips it.
"""
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"skipped: no torch ({e})")
    sys.exit(0)


def seconds_per_call(f, min_seconds=0.05, trials=9):
    # torch_timing.seconds_per_call's loop, timed by CUDA events; kept here because the GPU
    # bundle (shared/gpu/bundle.sh) carries the bench/*cuda*.py scripts alone.
    f()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    batch, best, done = 1, float("inf"), 0
    while done < trials:
        start.record()
        for _ in range(batch):
            f()
        end.record()
        end.synchronize()
        elapsed = start.elapsed_time(end) / 1e3
        if elapsed < min_seconds:
            batch = max(batch * 2, int(batch * min_seconds / (elapsed + 1e-9) * 0.5))
            continue
        best = min(best, elapsed / batch)
        done += 1
    return best


def report(name, bytes_moved, f):
    print(f"cuda/{name}: {bytes_moved / seconds_per_call(f) / 1e9:.1f} GB/s", flush=True)


def main():
    if not torch.cuda.is_available():
        print("skipped: torch sees no GPU")
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda:0")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    g = torch.Generator(device=dev).manual_seed(3)
    n, f = 64 << 20, 4
    src, dst = torch.ones(n, device=dev), torch.empty(n, device=dev)
    report("copy_ f32 64M (copy kernel)", 2 * f * n, lambda: dst.copy_(src))
    a = torch.randn(n, device=dev, generator=g)
    b = torch.randn(n, device=dev, generator=g)
    report("add f32 64M", 3 * f * n, lambda: a + b)
    report("gelu f32 64M", 2 * f * n, lambda: F.gelu(a))
    report("sum f32 64M", f * n, lambda: a.sum())
    a2 = a.view(16384, 4096)
    report("bias-gradient sum f32 16384x4096, dim 0", f * n, lambda: a2.sum(0))
    del a, b, a2
    x = torch.randn(8192, 8192, device=dev, generator=g)
    report("softmax f32 8192x8192", 2 * f * 8192 * 8192, lambda: torch.softmax(x, -1))
    del x
    rows, h = 8192, 4096
    x = torch.randn(rows, h, device=dev, generator=g)
    w = torch.randn(h, device=dev, generator=g)
    bias = torch.randn(h, device=dev, generator=g)
    gy = torch.randn(rows, h, device=dev, generator=g)
    report("layer_norm f32 8192x4096", 2 * f * rows * h,
           lambda: F.layer_norm(x, (h,), w, bias, 1e-5))
    xl, wl, bl = (t.detach().requires_grad_(True) for t in (x, w, bias))

    def layer_norm_step():
        xl.grad = wl.grad = bl.grad = None
        F.layer_norm(xl, (h,), wl, bl, 1e-5).backward(gy)

    report("layer_norm fwd+bwd f32 8192x4096", 7 * f * rows * h, layer_norm_step)
    del x, gy, xl, wl, bl
    shapes = [(50257, 768), (1024, 768)]
    for _ in range(12):
        shapes += [(768,), (768,), (2304, 768), (2304,), (768, 768), (768,), (768,), (768,),
                   (3072, 768), (3072,), (768, 3072), (768,)]
    shapes += [(768,), (768,)]
    params = [torch.randn(s, device=dev, generator=g).requires_grad_(True) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, device=dev, generator=g)
    elements = sum(p.numel() for p in params)
    for fused in (True, False):
        adam = torch.optim.Adam(params, lr=1e-4, fused=fused, foreach=None if fused else True)
        name = "fused=True" if fused else "foreach=True"
        report(f"Adam step, GPT-2 small (148 tensors, 124M) [{name}]", 7 * f * elements,
               adam.step)
    del params, adam
    rows, classes = 4096, 32000
    logits = torch.randn(rows, classes, device=dev, generator=g).requires_grad_(True)
    target = torch.randint(0, classes, (rows,), device=dev, generator=g)

    def cross_entropy_step():
        logits.grad = None
        F.cross_entropy(logits, target).backward()

    report("cross_entropy fwd+bwd 4096x32000", 3 * f * rows * classes, cross_entropy_step)
    del logits, target
    attention(dev, g)


def attention(dev, g):
    # bench_cuda's attention rows: causal self-attention forward and backward in bfloat16,
    # 16 heads of 64, 16384 tokens, in TFLOP/s of FlashAttention's count; and the memory it
    # holds at its peak beyond its inputs.
    for l in (256, 1024, 4096):
        b, h, e = 16384 // l, 16, 64
        q, k, v = (torch.randn(b, h, l, e, device=dev, generator=g, dtype=torch.bfloat16)
                   .requires_grad_(True) for _ in range(3))
        gout = torch.randn(b, h, l, e, device=dev, generator=g, dtype=torch.bfloat16)

        def step():
            q.grad = k.grad = v.grad = None
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(gout)

        flop = 3.5 * 4.0 * b * h * l * l * e / 2
        seconds = seconds_per_call(step)
        print(f"cuda/attention fwd+bwd bf16 causal, L {l}, 16 heads of 64, 16384 tokens: "
              f"{flop / seconds / 1e12:.1f} TFLOP/s", flush=True)
        q.grad = k.grad = v.grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        extra = (torch.cuda.max_memory_allocated() - base) / 2**20
        print(f"cuda/attention fwd+bwd bf16 causal, L {l}, peak extra memory: {extra:.1f} MiB",
              flush=True)


if __name__ == "__main__":
    main()
