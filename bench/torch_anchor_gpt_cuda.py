"""PyTorch eager on the same GPU: the anchor of gpt_train --device cuda's training speed.

gpt_train's character-level GPT (4 layers, 4 heads, width 128, context 128, batch 32, the head
tied to the token embedding; nn.MultiheadAttention with a causal mask, which PyTorch 2 runs
through scaled_dot_product_attention), trained with AdamW (fused=False: PyTorch's default for
CUDA parameters is foreach) and clip_grad_norm_, reading the loss every step as gpt_train's
progress line does. Random tokens (the speed does not depend on them). Prints
"cuda/gpt step <dtype>: <tokens/s> tokens/s (<ms> ms/step)" for float32 and for bfloat16
autocast, over the fastest 50 consecutive steps after 10. Needs python3 with torch and a GPU;
says why and exits 0 otherwise. Self-contained: the GPU bundle carries bench/*cuda*.py alone.
"""
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"skipped: no torch ({e})")
    sys.exit(0)

VOCAB, CONTEXT, LAYERS, HEADS, WIDTH, BATCH = 80, 128, 4, 4, 128, 32
UNTIMED, WINDOW = 10, 50


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
        self.ln_2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                                 nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x, causal):
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False, is_causal=True)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(CONTEXT, WIDTH)
        self.h = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, x):
        length = x.shape[1]
        causal = ~torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        h = self.wte(x) + self.wpe(torch.arange(length, device=x.device))
        for block in self.h:
            h = block(h, causal)
        return self.lm_head(self.ln_f(h))


def run(dtype):
    torch.manual_seed(0)
    dev = torch.device("cuda:0")
    model = GPT().to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99))
    steps = UNTIMED + 2 * WINDOW
    xs = torch.randint(VOCAB, (steps, BATCH, CONTEXT), device=dev)
    ys = torch.randint(VOCAB, (steps, BATCH, CONTEXT), device=dev)
    seconds = []
    for s in range(steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            logits = model(xs[s])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), ys[s].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss.item()
        seconds.append(time.perf_counter() - start)
    best = min(sum(seconds[s:s + WINDOW]) for s in range(UNTIMED, steps - WINDOW + 1))
    print(f"cuda/gpt step {dtype}: {WINDOW * BATCH * CONTEXT / best:.0f} tokens/s "
          f"({best / WINDOW * 1e3:.3f} ms/step)", flush=True)


def main():
    if not torch.cuda.is_available():
        print("skipped: torch sees no GPU")
        return
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    run("float32")
    run("bfloat16")


if __name__ == "__main__":
    main()
