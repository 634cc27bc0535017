"""A real training run that runs out of GPU memory, with allocsim's OOM observer installed
(scripts/gpu-python.sh runs it on the GPU machine).

An MLP (8 layers of 4096) trained with AdamW; the batch doubles every step under a 6 GiB
per-process cap (torch.cuda.set_per_process_memory_fraction), so the program dies of a CUDA
OOM within seconds. Nothing here catches it: PyTorch's own traceback ends the program,
after allocsim's explanation.
"""

import argparse

import allocsim.torch
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--dir", default="oom")
parser.add_argument("--cap-gib", type=float, default=6.0)
args = parser.parse_args()

# Before the first CUDA allocation: the history starts from an empty allocator.
allocsim.torch.on_oom(dir=args.dir)
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(args.cap_gib * 2**30 / total, 0)

width, layers = 4096, 8
model = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.GELU())]).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
batch = 256
for step in range(40):
    x = torch.randn(batch, width, device="cuda")
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    print(f"step {step}: batch {batch}, reserved {torch.cuda.memory_reserved() / 2**30:.2f} GiB", flush=True)
    batch *= 2
print("no OOM: raise the batch or lower --cap-gib")
