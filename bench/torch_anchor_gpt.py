# PyTorch 1.13 on bench_gpt's case: gpt_train's character-level GPT, built from torch.nn
# (MultiheadAttention batch-first with a causal mask, LayerNorm, Linear-GELU-Linear, the head
# tied to the token embedding), trained with gpt_train's recipe (AdamW betas 0.9, 0.99, decay on
# the matrices only; linear warm-up, cosine to min_lr_factor; clip_grad_norm_) on the threads
# the file's metadata gives (one unless it says), with dropout where gpt_train puts it (after
# the embeddings, on the attention probabilities, after each residual branch) when it gives one.
# Reads the initial weights, the batches and the validation windows bench_gpt wrote (argv[1]:
# a safetensors file), trains on every batch in order, and prints one JSON line: tokens/s over
# the fastest 50 consecutive steps after the fifth (as bench_gpt counts), the validation loss
# after 100 and 200 steps and every step's loss.
import json
import math
import struct
import sys
import time

import torch_blas  # first: before torch loads the BLAS
import torch
import torch.nn as nn
import torch.nn.functional as F

UNTIMED = 5
WINDOW = 50
EVAL_AT = (100, 200)
DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64}


def read_safetensors(path):
    """(tensors, metadata) of a safetensors file, with struct + json (no safetensors package)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        data = f.read()
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        flat = torch.frombuffer(bytearray(data[begin:end]), dtype=DTYPES[info["dtype"]])
        tensors[name] = flat.reshape(info["shape"])
    return tensors, metadata


class Block(nn.Module):
    def __init__(self, width, heads, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, dropout=dropout, batch_first=True)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.drop = nn.Dropout(dropout)

    def forward(self, x, causal):
        h = self.ln_1(x)
        x = x + self.drop(self.attn(h, h, h, attn_mask=causal, need_weights=False)[0])
        return x + self.drop(self.mlp(self.ln_2(x)))


class GPT(nn.Module):
    def __init__(self, vocab, context, layers, width, heads, dropout):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, x):
        length = x.shape[1]
        causal = ~torch.ones(length, length, dtype=torch.bool).tril()
        h = self.drop(self.wte(x) + self.wpe(torch.arange(length)))
        for block in self.h:
            h = block(h, causal)
        return self.lm_head(self.ln_f(h))


def warmup_cosine(warmup, total, min_factor):
    """gradwire's optim::warmup_cosine: the LambdaLR factor of each step."""
    def factor(step):
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if step >= total:
            return min_factor
        progress = (step - warmup) / max(1, total - warmup)
        return min_factor + (1 - min_factor) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def main():
    tensors, meta = read_safetensors(sys.argv[1])
    torch.set_num_threads(int(meta.get("threads", 1)))  # OpenBLAS's: its environment, from bench_gpt
    state = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    xs, ys, val_x, val_y = tensors["x"], tensors["y"], tensors["val_x"], tensors["val_y"]
    steps, batch, context = xs.shape
    vocab, width = state["wte.weight"].shape
    layers = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("h."))
    heads = int(meta["heads"])
    model = GPT(vocab, context, layers, width, heads, float(meta.get("dropout", 0)))
    model.load_state_dict(state)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": float(meta["weight_decay"])},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=float(meta["lr"]), betas=(0.9, 0.99))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, warmup_cosine(int(meta["warmup"]), steps, float(meta["min_lr_factor"])))

    def validation_loss():
        model.eval()
        with torch.no_grad():
            losses = [F.cross_entropy(model(vx).reshape(-1, vocab), vy.reshape(-1)).item()
                      for vx, vy in zip(val_x.split(batch), val_y.split(batch))]
        model.train()
        return sum(losses) / len(losses)

    result = {"blas": torch_blas.in_use()}
    seconds = []
    for s in range(steps):
        start = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(xs[s]).reshape(-1, vocab), ys[s].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), float(meta["clip"]))
        opt.step()
        schedule.step()
        result[f"loss_{s}"] = loss.item()
        seconds.append(time.perf_counter() - start)
        if s + 1 in EVAL_AT:
            result[f"val_loss_{s + 1}"] = validation_loss()
    best = min(sum(seconds[s:s + WINDOW]) for s in range(UNTIMED, steps - WINDOW + 1))
    result["tokens_per_s"] = WINDOW * batch * context / best
    print(json.dumps(result))


main()
