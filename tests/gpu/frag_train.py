"""A real training run whose CUDA OOM comes from fragmentation, with allocsim's OOM observer
installed (scripts/gpu-python.sh runs it on the GPU machine).

An MLP (6 layers of 4096, AdamW) trained on batches of varying size (a seeded sequence, as
variable-length batches come), under a per-process cap (--cap-gib) a little above what the
largest step needs live: cached blocks of big steps get split to serve smaller ones, and a
later big step finds its memory in pieces. Nothing here catches the OOM.
"""

import argparse
import random

import allocsim.torch
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--dir", default="oom")
parser.add_argument("--cap-gib", type=float, default=2.2)
args = parser.parse_args()

allocsim.torch.on_oom(dir=args.dir)
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(args.cap_gib * 2**30 / total, 0)

random.seed(0)
torch.manual_seed(0)
width, layers = 4096, 6
model = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.GELU())]).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(60):
    batch = random.choice([384, 1024, 1536, 2560, 3584])
    x = torch.randn(batch, width, device="cuda")
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"step {step}: batch {batch}, reserved {torch.cuda.memory_reserved() / 2**30:.2f} GiB", flush=True)
print("no OOM at this cap")
