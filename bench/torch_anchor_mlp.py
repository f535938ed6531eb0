# PyTorch 1.13 on bench_mlp's case: one SGD step of the 784-256-128-10 MLP on a batch of 64,
# single-threaded like gradwire's default. Prints microseconds per step as one JSON line.
import json

import torch_blas  # first: before torch loads the BLAS
import torch

from torch_timing import seconds_per_call

torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(784, 256), torch.nn.ReLU(),
    torch.nn.Linear(256, 128), torch.nn.ReLU(),
    torch.nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 784)
y = torch.randint(0, 10, (64,))


def step():
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()


print(json.dumps({"step_us": seconds_per_call(step) * 1e6, "blas": torch_blas.in_use()}))
