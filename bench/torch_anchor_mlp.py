# PyTorch 1.13 on bench_mlp's case: one SGD step of the 784-256-128-10 MLP on a batch of 64,
# single-threaded like gradwire's default. Prints microseconds per step as one JSON line.
import json
import time

import torch

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


def seconds_per_call(f, min_seconds=0.1, trials=5):
    f()
    batch, best = 1, float("inf")
    done = 0
    while done < trials:
        start = time.perf_counter()
        for _ in range(batch):
            f()
        elapsed = time.perf_counter() - start
        if elapsed < min_seconds:
            batch = max(batch * 2, int(batch * min_seconds / (elapsed + 1e-9) * 0.5))
            continue
        best = min(best, elapsed / batch)
        done += 1
    return best


print(json.dumps({"step_us": seconds_per_call(step) * 1e6}))
