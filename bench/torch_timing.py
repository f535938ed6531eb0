# The timing loop of the PyTorch anchor scripts, the same as seconds_per_call in harness.h:
# warm up, grow the batch until one lasts min_seconds, return the best mean of `trials` batches.
import time


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
