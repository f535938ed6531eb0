# PyTorch 1.13 on bench_attention's cases: causal self-attention forward and backward, as
# softmax(q kᵀ / sqrt(E) + causal mask) v (1.13 has no scaled_dot_product_attention), float32,
# one thread like gradwire's default; a case with a third field drops the probabilities with
# that p. Prints microseconds per case as one JSON line.
import json
import sys

import torch_blas  # first: before torch loads the BLAS
import torch

from torch_timing import seconds_per_call

torch.set_num_threads(1)
torch.manual_seed(0)
heads, head_dim = (int(a) for a in sys.argv[1:3])
result = {"blas": torch_blas.in_use()}
for case in sys.argv[3:]:  # batch:length[:dropout]
    fields = case.split(":")
    batch, length = int(fields[0]), int(fields[1])
    dropout = float(fields[2]) if len(fields) > 2 else 0.0
    q, k, v = (torch.randn(batch, heads, length, head_dim, requires_grad=True) for _ in range(3))
    masked = ~torch.ones(length, length, dtype=torch.bool).tril()
    gout = torch.randn(batch, heads, length, head_dim)

    def step():
        s = (q @ k.transpose(-2, -1) / head_dim ** 0.5).masked_fill(masked, float("-inf"))
        p = torch.softmax(s, -1)
        if dropout > 0:
            p = torch.nn.functional.dropout(p, dropout)
        out = p @ v
        out.backward(gout)
        for t in (q, k, v):
            t.grad = None

    result[f"{case}_us"] = seconds_per_call(step) * 1e6
print(json.dumps(result))
