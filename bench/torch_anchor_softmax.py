# PyTorch 1.13 on bench_core's softmax cases: cross-entropy (mean over the rows) forward and
# backward, and log_softmax forward, of float32 (rows, classes) logits, one thread like
# gradwire's default. Prints microseconds per case as one JSON line.
import json
import sys

import torch_blas  # first: before torch loads the BLAS
import torch

from torch_timing import seconds_per_call

torch.set_num_threads(1)
torch.manual_seed(0)
result = {}
for case in sys.argv[1:]:  # rowsxclasses
    rows, classes = (int(a) for a in case.split("x"))
    logits = torch.randn(rows, classes, requires_grad=True)
    target = torch.randint(0, classes, (rows,))

    def cross_entropy():
        torch.nn.functional.cross_entropy(logits, target).backward()
        logits.grad = None

    def log_softmax():
        with torch.no_grad():
            torch.log_softmax(logits, 1)

    result[f"ce_{case}_us"] = seconds_per_call(cross_entropy) * 1e6
    result[f"lsm_{case}_us"] = seconds_per_call(log_softmax) * 1e6
result["blas"] = torch_blas.in_use()
print(json.dumps(result))
