"""Capture real PyTorch CUDA memory snapshots from small but realistic workloads.

This is the repository's copy of the shared ../shared/capture/capture.py, extended: every
torch.cuda.OutOfMemoryError a workload raises or catches has its text (str(e)) saved in
.stats.json as "oom_messages" (in order), and .stats.json also says the alloc conf in force
("alloc_conf"), the fraction passed to set_per_process_memory_fraction ("memory_fraction", or
null) and the device's "total_memory". New workloads: devfull_oom_expand,
devfull_oom_empty_cache, compile_train_reduce_overhead, graph_freed_empty_cache,
graph_freed_oom, and devfull_oom_msg / gpt2_big_batch_oom_msg (re-recordings with the texts);
for `allocsim diff` diff_train_bs256 / diff_train_bs1024 / diff_train_bs256_expand (one script, two
batch sizes, two settings) and for `allocsim ranks` ddp4 (four DDP ranks at once on one GPU, gloo,
writing ddp4_rank0..3; rank 2 has 8x the batch).
The traces it recorded are in ../tests/traces (README.md there).

Runs where PyTorch and a CUDA GPU are (the GPU machine). Example:
    python3 capture.py all /tmp/snaps                 # every workload below
    python3 capture.py all /tmp/snaps mlp_train       # just one

Each workload runs in a fresh process (so the caching allocator starts empty) with its own
PYTORCH_CUDA_ALLOC_CONF, records the full allocator history from the first CUDA allocation,
and writes <name>.pickle (torch.cuda.memory._dump_snapshot) plus <name>.stats.json
(memory_stats() at the end, the alloc conf, torch version, and whether an OOM was raised).

usage: python3 capture.py all OUTDIR          # run every workload, each in a subprocess
       python3 capture.py one NAME OUTDIR     # run one workload in this process
"""
import json, os, subprocess, sys, time

WORKLOADS = {
    # name: (function[:seed], PYTORCH_CUDA_ALLOC_CONF, record stacks?, per-process memory cap in GiB or None)
    "mlp_train":            ("mlp_train", "", True, None),
    "resnet_bs_change":     ("resnet_bs_change", "", False, None),
    "gpt_varlen_train_s1":  ("gpt_varlen_train:1", "", False, None),
    "gpt_varlen_expand_s2": ("gpt_varlen_train:2", "expandable_segments:True", False, None),
    "gpt_varlen_msplit_s2": ("gpt_varlen_train:2", "max_split_size_mb:64", False, None),
    "gpt_varlen_pow2_s2":   ("gpt_varlen_train:2", "roundup_power2_divisions:4", False, None),
    "kvcache_decode":       ("kvcache_decode:3", "", True, None),
    "kvcache_decode_expand": ("kvcache_decode:3", "expandable_segments:True", False, None),
    "oom_fragmented":       ("oom_fragmented", "", True, 2.0),
    "oom_fragmented_expand": ("oom_fragmented", "expandable_segments:True", True, 2.0),
    "gc_threshold_s2":      ("gpt_varlen_train:2", "garbage_collection_threshold:0.6", False, 3.0),
    "multistream_pub":      ("multistream_prefetch:11", "", True, None),
    "wrapped_history_pub":  ("gpt_varlen_train:8", "", False, None),
    "big_gpt_long_stacks_s9": ("gpt_varlen_long:9", "", True, None),
    "oom_story":            ("oom_story", "", True, 2.2),
    "oom_story_expand":     ("oom_story", "expandable_segments:True", True, 2.2),
    "gc_frees":             ("gc_frees:0", "garbage_collection_threshold:0.5", True, 4.0),
    "msplit_release":       ("msplit_release:0", "max_split_size_mb:64", True, 1.5),
    "empty_cache_train":    ("empty_cache_train:0", "", True, None),
    "cuda_graph_train":     ("cuda_graph_train:0", "", True, None),
    "mempool_use":          ("mempool_use:0", "", True, None),
    "two_gpu_pipeline":     ("two_gpu_pipeline:0", "", True, None),   # needs two GPUs
    # recorded on an H100 80GB without a memory fraction (../traces/incoming/)
    "devfull_oom":          ("devfull_split_oom:1", "", True, None),
    "gpt2_big_batch_oom":   ("gpt2_big_bs_oom", "", True, None),
    "compile_reduce_overhead": ("compile_reduce_overhead2", "", True, None),
    # this repository's additions, recorded on an H100 80GB (../tests/traces/)
    "devfull_oom_msg":      ("devfull_split_oom:1", "", True, None),
    "gpt2_big_batch_oom_msg": ("gpt2_big_bs_oom", "", True, None),
    "devfull_oom_expand":   ("devfull_oom_expand", "expandable_segments:True", True, None),
    "devfull_oom_empty_cache": ("devfull_oom_empty_cache", "", True, None),
    "compile_train_reduce_overhead": ("compile_train_reduce_overhead", "", True, None),
    "graph_freed_empty_cache": ("graph_freed:0", "", True, None),
    "graph_freed_oom":      ("graph_freed:1", "", True, 2.0),
    # issue 18: one training script at two batch sizes and two settings (allocsim diff) ...
    "diff_train_bs256":     ("diff_train:256", "", True, None),
    "diff_train_bs1024":    ("diff_train:1024", "", True, None),
    "diff_train_bs256_expand": ("diff_train:256", "expandable_segments:True", True, None),
    # ... and a 4-rank DDP run on one GPU, gloo, rank 2 with 8x the batch (allocsim ranks):
    # writes ddp4_rank0..3.pickle
    "ddp4":                 ("ddp_train", "", True, None),
    # issue 17: a long run with Python stacks into PyTorch's 2 M-entry ring buffer, which wraps
    # (about 2,000 entries a step); too large to commit: measured on the GPU machine
    # (tests/gpu/big_recording.sh), the figures in the README
    "gpt_long_ring":        ("gpt_long_ring:1600", "", True, None),
    # add your own workloads here: a function below and a line above
}
MAX_ENTRIES = {"wrapped_history_pub": 20000}
# workloads run as WORLD_SIZE processes at once, each writing <name>_rank<r>.pickle
RANKS = {"ddp4": 4}
DDP_OUTLIER_RANK = 2
PER_WORKLOAD_TIMEOUT_S = 300

# The text of every torch.cuda.OutOfMemoryError raised or caught, in order (-> "oom_messages").
OOM_MESSAGES = []


def _oom(e):
    OOM_MESSAGES.append(str(e))
    print(f"  OutOfMemoryError: {str(e)[:160]}...", flush=True)
    return True


def mlp_train(torch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.GELU()) for _ in range(6)], torch.nn.Linear(2048, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(12):
        x = torch.randn(256, 2048, device="cuda")
        y = torch.randint(0, 10, (256,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def gpt_varlen_train(torch, seed):
    import random
    random.seed(seed); torch.manual_seed(seed)
    d, heads, layers, vocab = 768, 12, 6, 16384
    layer = lambda: torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True, norm_first=True)
    class GPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, d)
            self.pos = torch.nn.Embedding(2048, d)
            self.blocks = torch.nn.ModuleList([layer() for _ in range(layers)])
            self.head = torch.nn.Linear(d, vocab, bias=False)
        def forward(self, idx):
            T = idx.shape[1]
            h = self.emb(idx) + self.pos(torch.arange(T, device=idx.device))
            mask = torch.nn.Transformer.generate_square_subsequent_mask(T, device=idx.device)
            for b in self.blocks:
                h = b(h, src_mask=mask, is_causal=True)
            return self.head(h)
    model = GPT().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step in range(40):
        T = random.choice([64, 128, 192, 256, 384, 512, 768, 1024, 1536])
        B = max(1, 8192 // T) if seed % 2 == 0 else random.choice([2, 4, 8, 16])
        idx = torch.randint(0, vocab, (B, T), device="cuda")
        logits = model(idx)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab), idx.view(-1))
        loss.backward()
        opt.step(); opt.zero_grad(set_to_none=True)
        del logits, loss, idx
    torch.cuda.synchronize()


def kvcache_decode(torch, seed):
    import random
    random.seed(seed); torch.manual_seed(seed)
    d, heads, layers = 1024, 16, 8
    hd = d // heads
    w = [(torch.randn(d, 3 * d, device="cuda", dtype=torch.float16) * 0.02, torch.randn(d, d, device="cuda", dtype=torch.float16) * 0.02) for _ in range(layers)]
    for request in range(6):
        B = random.choice([1, 4, 8, 16]); prompt = random.choice([32, 128, 512]); gen = random.choice([64, 128, 256])
        x = torch.randn(B, prompt, d, device="cuda", dtype=torch.float16)
        caches = [None] * layers
        for t in range(gen):
            h = x
            for l, (wqkv, wo) in enumerate(w):
                q, k, v = (h @ wqkv).split(d, dim=-1)
                k = k.view(B, -1, heads, hd).transpose(1, 2); v = v.view(B, -1, heads, hd).transpose(1, 2); q = q.view(B, -1, heads, hd).transpose(1, 2)
                if caches[l] is None:
                    caches[l] = (k, v)
                else:  # the naive growing cache: a fresh, larger tensor at every step
                    caches[l] = (torch.cat([caches[l][0], k], dim=2), torch.cat([caches[l][1], v], dim=2))
                a = torch.nn.functional.scaled_dot_product_attention(q, caches[l][0], caches[l][1], is_causal=(t == 0))
                h = a.transpose(1, 2).reshape(B, -1, d) @ wo
            x = h[:, -1:, :]
        del caches, x, h
    torch.cuda.synchronize()


def resnet_bs_change(torch):
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=100).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step, bs in enumerate([32, 64, 16, 48, 64, 8, 32, 96, 24, 64, 40, 16]):
        x = torch.randn(bs, 3, 160, 160, device="cuda")
        y = torch.randint(0, 100, (bs,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        for bs in [128, 7, 200]:
            model(torch.randn(bs, 3, 160, 160, device="cuda"))
    torch.cuda.synchronize()


def oom_fragmented(torch):
    # The story of the 'OOM despite free memory' question: many mid-size tensors share 20 MiB
    # segments; freeing most of them leaves every segment partly used, so a large request fails.
    keep, drop = [], []
    for i in range(60):                                 # 60 x 4 MiB -> 12 segments of 20 MiB
        t = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
        (keep if i % 5 == 2 else drop).append(t)
    big = [torch.empty(300 << 20, dtype=torch.uint8, device="cuda") for _ in range(5)]  # 1.5 GiB
    del drop
    del big[1], big[3]                                  # 600 MiB cached, but in two 300 MiB pieces
    try:
        torch.empty(500 << 20, dtype=torch.uint8, device="cuda")
        return False
    except torch.cuda.OutOfMemoryError as e:
        return _oom(e)


def multistream_prefetch(torch, seed):
    # Batches are copied in on a side stream and consumed on the default stream; record_stream
    # defers the frees of the side stream's blocks until the consuming work is done.
    torch.manual_seed(seed)
    side = torch.cuda.Stream()
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1000)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sizes = (300, 1500, 96, 640, 2000, 40)
    host = [torch.randn(b, 4096).pin_memory() for b in sizes]
    nxt = None
    for step in range(24):
        with torch.cuda.stream(side):
            x_next = host[step % len(host)].to("cuda", non_blocking=True)
            scratch = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
            del scratch
        torch.cuda.current_stream().wait_stream(side)
        x = x_next
        x.record_stream(torch.cuda.current_stream())
        loss = model(x).square().mean()
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        del x, x_next, loss
    torch.cuda.synchronize()


def gpt_long_ring(torch, steps):
    gpt_varlen_long(torch, 9, steps)


def gpt_varlen_long(torch, seed, global_steps=240):
    # same model as gpt_varlen_train, many more steps: a trace of about half a million events
    import random
    random.seed(seed); torch.manual_seed(seed)
    d, heads, layers, vocab = 512, 8, 6, 8192
    model = torch.nn.ModuleDict(dict(
        emb=torch.nn.Embedding(vocab, d),
        blocks=torch.nn.ModuleList([torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True, norm_first=True) for _ in range(layers)]),
        head=torch.nn.Linear(d, vocab, bias=False))).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step in range(global_steps):
        T = random.choice([64, 96, 128, 256, 320, 512, 640, 1024]); B = random.choice([2, 4, 8, 12])
        idx = torch.randint(0, vocab, (B, T), device="cuda")
        h = model["emb"](idx)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(T, device="cuda")
        for b in model["blocks"]:
            h = b(h, src_mask=mask, is_causal=True)
        loss = torch.nn.functional.cross_entropy(model["head"](h).view(-1, vocab), idx.view(-1))
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        del h, loss, idx, mask
    torch.cuda.synchronize()



def oom_story(torch):
    # "CUDA out of memory" with over a gigabyte free: a cached 2 GiB block is carved into
    # 180 MiB activations; freeing every other one leaves holes no 400 MiB request fits in.
    a = torch.empty(2048 << 20, dtype=torch.uint8, device="cuda")
    del a
    acts = [torch.empty(180 << 20, dtype=torch.uint8, device="cuda") for _ in range(11)]
    for i in range(0, 11, 2):
        acts[i] = None
    try:
        torch.empty(400 << 20, dtype=torch.uint8, device="cuda")
        return False
    except torch.cuda.OutOfMemoryError as e:
        return _oom(e)



def gc_frees(torch, seed):
    # Ever larger temporaries under a memory cap: old cached segments never fit again, and
    # garbage_collection_threshold releases the oldest once reserved passes the threshold.
    import random
    random.seed(seed)
    keep = []
    for i in range(36):
        mb = 40 + 9 * i + random.choice([0, 2, 4])
        t = torch.empty(mb << 20, dtype=torch.uint8, device="cuda")
        if i % 7 == 3:
            keep.append(torch.empty(6 << 20, dtype=torch.uint8, device="cuda"))
        del t
    torch.cuda.synchronize()



def msplit_release(torch, seed):
    # With max_split_size_mb, cached oversize blocks are released one by one
    # (release_available_cached_blocks) when a new segment would pass the cap.
    big = (300, 500, 100)
    xs = [torch.empty(big[0] << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]
    small = [torch.empty(3 << 20, dtype=torch.uint8, device="cuda") for _ in range(5)]
    del xs
    y = torch.empty(big[1] << 20, dtype=torch.uint8, device="cuda")
    zs = [torch.empty(big[2] << 20, dtype=torch.uint8, device="cuda") for _ in range(3)]
    del y, zs[1]
    w = torch.empty((big[2] + 30) << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()



def empty_cache_train(torch, seed):
    # The seeds' advice in practice: del + torch.cuda.empty_cache() inside the training loop.
    import random
    random.seed(seed); torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    for step in range(18):
        bs = random.choice([64, 256, 1024, 2048, 512])
        x = torch.randn(bs, 1024, device="cuda")
        loss = model(x).square().mean()
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        del x, loss
        if step % 3 == 2:
            torch.cuda.empty_cache()
    torch.cuda.synchronize()



def cuda_graph_train(torch, seed):
    # Whole-step CUDA graph capture (the documented recipe): the graph's memory comes from a
    # private pool (segment_pool_id != (0, 0)); replays reuse it; deleting the graph and
    # emptying the cache returns it.
    torch.manual_seed(seed)
    width = 1024
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sx = torch.randn(128, width, device="cuda"); sy = torch.randint(0, 10, (128,), device="cuda")
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(sx), sy).backward(); opt.step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        loss = torch.nn.functional.cross_entropy(model(sx), sy); loss.backward(); opt.step()
    for i in range(8):
        sx.copy_(torch.randn(128, width, device="cuda")); g.replay()
    extra = [torch.randn(256, width, device="cuda") for _ in range(4)]
    del g, loss, extra
    torch.cuda.empty_cache()
    torch.cuda.synchronize()



def mempool_use(torch, seed):
    # torch.cuda.MemPool: allocations inside use_mem_pool go to their own private pool.
    pool = torch.cuda.MemPool()
    a = torch.empty(5 << 20, dtype=torch.uint8, device="cuda")
    with torch.cuda.use_mem_pool(pool):
        xs = [torch.empty((7 + 3 * i) << 20, dtype=torch.uint8, device="cuda") for i in range(6)]
        small = [torch.empty(4096 * (i + 1), dtype=torch.uint8, device="cuda") for i in range(5)]
    b = torch.empty(9 << 20, dtype=torch.uint8, device="cuda")
    del xs[1], xs[3], small
    with torch.cuda.use_mem_pool(pool):
        c = torch.empty(12 << 20, dtype=torch.uint8, device="cuda")
    del xs, c
    del pool
    torch.cuda.empty_cache()
    torch.cuda.synchronize()



def two_gpu_pipeline(torch, seed):
    # Naive model parallelism: first half on cuda:0, second half on cuda:1, varying batches.
    import random
    random.seed(seed); torch.manual_seed(seed)
    w = 2048
    a = torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.GELU(), torch.nn.Linear(w, w)).to("cuda:0")
    b = torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.GELU(), torch.nn.Linear(w, 10)).to("cuda:1")
    opt = torch.optim.AdamW(list(a.parameters()) + list(b.parameters()))
    for step in range(10):
        bs = random.choice([64, 256, 512, 1024])
        x = torch.randn(bs, w, device="cuda:0")
        y = torch.randint(0, 10, (bs,), device="cuda:1")
        loss = torch.nn.functional.cross_entropy(b(a(x).to("cuda:1")), y)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        del x, y, loss
    torch.cuda.synchronize(0); torch.cuda.synchronize(1)



def devfull_split_oom(torch, seed):
    # No memory fraction: the GPU itself is full. A cached block of most of the GPU is carved into
    # pieces, every other piece is freed, and a request bigger than any hole and than what the
    # device has left fails although the freed holes add up to more than it asks.
    free, total = torch.cuda.mem_get_info()
    big = int(free * (0.75 if seed == 0 else 0.7)) & ~((2 << 20) - 1)
    n = 20 if seed == 0 else 14
    a = torch.empty(big, dtype=torch.uint8, device="cuda"); del a
    piece = (big // n) & ~511
    pieces = [torch.empty(piece, dtype=torch.uint8, device="cuda") for _ in range(n)]
    for i in range(1, n, 2):
        pieces[i] = None
    oom = False
    try:
        torch.empty(int(free * 0.3), dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError as e:
        oom = _oom(e)
    torch.cuda.empty_cache()          # the usual first remedy: does not help, the holes are inside a split segment
    try:
        torch.empty(int(free * 0.3), dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError as e:
        oom = _oom(e)
    del pieces                        # what helps: drop the references
    x = torch.empty(int(free * 0.3), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    return oom


def gpt2_big_bs_oom(torch):
    # public twin of the real-model device-full OOM: GPT-2 large-ish, batch too big, halved until it fits
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(14)
    cfg = GPT2Config(n_layer=24, n_embd=2048, n_head=16, vocab_size=50257, n_positions=2048)
    model = GPT2LMHeadModel(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    oom = False; B = 64
    while B >= 1:
        try:
            for step in range(2):
                idx = torch.randint(0, cfg.vocab_size, (B, 1024), device="cuda")
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(input_ids=idx, labels=idx).loss
                loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
                del loss, idx
            break
        except torch.cuda.OutOfMemoryError as e:
            oom = _oom(e); loss = idx = None
            opt.zero_grad(set_to_none=True)
            B //= 2
    torch.cuda.synchronize()
    return oom


def compile_reduce_overhead2(torch):
    # a second cudagraph-trees workload: a small conv net, train-free inference, shapes alternate
    torch.manual_seed(12)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 3, padding=1),
                                torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10)).cuda().eval()
    f = torch.compile(model, mode="reduce-overhead")
    outs = []
    with torch.no_grad():
        for bs in [8, 8, 8, 32, 32, 8, 16, 32, 16, 16, 8]:
            o = f(torch.randn(bs, 3, 64, 64, device="cuda"))
            outs.append(o.clone())
            if len(outs) > 3:
                outs.pop(0)
    torch.cuda.synchronize()


def devfull_oom_expand(torch):
    # devfull_split_oom with expandable_segments:True and no cap: the GPU itself runs out. A
    # mapped block of ~70 % of the GPU is carved into 14 tensors and every other one freed; a
    # request of 70 % fails although 35 % is cached in holes: the malloc's own flush unmaps the
    # holes' pages (segment_unmap inside the malloc), but live tensors + request > the device.
    # The program catches it, asks for 45 % (fits once the holes are unmapped), then cleans up.
    free, total = torch.cuda.mem_get_info()
    big = int(free * 0.7) & ~((2 << 20) - 1)
    n = 14
    a = torch.empty(big, dtype=torch.uint8, device="cuda"); del a
    piece = (big // n) & ~511
    pieces = [torch.empty(piece, dtype=torch.uint8, device="cuda") for _ in range(n)]
    for i in range(1, n, 2):
        pieces[i] = None
    oom = False
    try:
        x = torch.empty(int(free * 0.7), dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError as e:
        oom = _oom(e)
    y = torch.empty(int(free * 0.45), dtype=torch.uint8, device="cuda")   # fits in what is left
    small = [torch.empty(4096 * (i + 1), dtype=torch.uint8, device="cuda") for i in range(8)]
    del pieces, y
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    return oom


def devfull_oom_empty_cache(torch):
    # A device-full OOM the program survives by the usual remedy: catch it, drop references,
    # torch.cuda.empty_cache() (segment_free outside any malloc), retry. No cap.
    free, total = torch.cuda.mem_get_info()
    unit = int(free * 0.08) & ~((2 << 20) - 1)
    live = [torch.empty(unit, dtype=torch.uint8, device="cuda") for _ in range(10)]     # 80 %, a segment each
    smalls = [torch.empty(100 << 10, dtype=torch.uint8, device="cuda") for _ in range(30)]
    del smalls[:20]                                      # the first small segment is all free
    tmp = torch.empty(unit // 2, dtype=torch.uint8, device="cuda"); del tmp
    part = torch.empty(unit // 4, dtype=torch.uint8, device="cuda")   # splits the cached segment: not releasable
    oom = False
    try:
        x = torch.empty(int(free * 0.3), dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError as e:
        oom = _oom(e)
        del live[:4]                                     # 32 % now cached in 4 whole segments
        torch.cuda.empty_cache()                         # ... and given back
        x = torch.empty(int(free * 0.3), dtype=torch.uint8, device="cuda")   # the retry succeeds
    x.fill_(1)
    torch.cuda.synchronize()
    return oom


def compile_train_reduce_overhead(torch):
    # torch.compile(mode="reduce-overhead") TRAINING: forward and backward graphs under CUDA graph
    # trees, the batch size cycling among three values (recompile with a dynamic batch, a graph
    # recorded per size), eager Adam on the graphs' gradient outputs.
    torch.manual_seed(21)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.LayerNorm(1024),
                                torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 10)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    def loss_fn(x, y):
        return torch.nn.functional.cross_entropy(model(x), y)
    f = torch.compile(loss_fn, mode="reduce-overhead")
    for step, bs in enumerate([64, 64, 64, 128, 128, 128, 64, 256, 256, 256, 128, 64, 256, 128, 64, 256]):
        torch.compiler.cudagraph_mark_step_begin()
        x = torch.randn(bs, 512, device="cuda"); y = torch.randint(0, 10, (bs,), device="cuda")
        loss = f(x, y)
        loss.backward()
        opt.step(); opt.zero_grad(set_to_none=True)
        del loss, x, y
    torch.cuda.synchronize()


def graph_freed(torch, seed):
    # A torch.cuda.CUDAGraph captured into its own private pool, replayed, then the graph and its
    # outputs deleted while the default pool also holds cached segments (large, and a partly
    # used small one). torch.cuda.graph's __enter__ itself calls empty_cache(), so the "junk"
    # segments are released at capture start; the default pool's cached segments at the end are
    # the "extra" ones. seed 0: torch.cuda.empty_cache() -> the order in which the default
    # pool's and the freed graph's pool's segments are released (recorded: default large, then
    # the private pool's small segment, then its large ones). seed 1 (under a 2 GiB cap): the
    # 1.6 GiB request fitted as it was (reserved came to 1.99 GiB), and the 1 GiB request's own
    # release_cached_blocks frees the default pool's and the graph pool's segments (segment_free
    # inside the malloc) and still fails (oom).
    torch.manual_seed(seed)
    w = 1024
    model = torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, 10)).cuda()
    static_x = torch.randn(2048, w, device="cuda")
    junk = [torch.empty((24 + 16 * i) << 20, dtype=torch.uint8, device="cuda") for i in range(4)]
    smalls = [torch.empty(8192 * (i + 1), dtype=torch.uint8, device="cuda") for i in range(24)]
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                          # the documented warm-up on a side stream
        for _ in range(2):
            model(static_x).sum()
    torch.cuda.current_stream().wait_stream(s)
    del junk, smalls[::2]                               # cached in the default pool (until capture start)
    keep = torch.empty(2 << 20, dtype=torch.uint8, device="cuda")   # carved from a cached block

    def capture():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):             # the warmed-up stream: its cuBLAS workspace exists
            h = static_x.repeat(1, 16)                  # 128 MiB, private pool
            h2 = h * 2
            del h
            t = h2.sum(1)
            y = model(static_x + t[:, None])
            big_out = h2[:, :2048].contiguous()         # 16 MiB output
            del h2
        return g, (y, big_out, t)

    g, outs = capture()
    for i in range(4):
        static_x.copy_(torch.randn(2048, w, device="cuda"))
        g.replay()
    r = [o.float().sum().item() for o in outs]
    extra = [torch.empty((6 + 5 * i) << 20, dtype=torch.uint8, device="cuda") for i in range(3)]
    del extra                                           # more cached default-pool blocks
    del outs
    del g                                               # the private pool is now freeable
    torch.cuda.synchronize()
    oom = False
    if seed == 0:
        torch.cuda.empty_cache()
    else:
        z = torch.empty(1638 << 20, dtype=torch.uint8, device="cuda")   # fitted without a flush
        try:
            z2 = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError as e:
            oom = _oom(e)
        del z
    torch.cuda.synchronize()
    return oom


def diff_train(torch, batch):
    """The same MLP training at another batch size: per step the input x is batch*4096*4 bytes,
    and each of the 4 hidden Linear+GELU layers keeps batch*4096*4-byte activations for backward."""
    torch.manual_seed(0)
    d = 4096
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.GELU()) for _ in range(4)],
                                torch.nn.Linear(d, 16)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(6):
        x = torch.randn(batch, d, device="cuda")
        y = torch.randint(0, 16, (batch,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def ddp_train(torch):
    """One rank of a DDP run (gloo) on one GPU; rank DDP_OUTLIER_RANK gets 8x the batch."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    d = 2048
    model = torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.GELU(), torch.nn.Linear(d, d), torch.nn.GELU(),
                                torch.nn.Linear(d, 16)).cuda()
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    batch = 2048 if rank == DDP_OUTLIER_RANK else 256
    for step in range(8):
        x = torch.randn(batch, d, device="cuda")
        y = torch.randint(0, 16, (batch,), device="cuda")
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    dist.destroy_process_group()


def run_one(name, outdir):
    import torch
    fn, conf, stacks, cap = WORKLOADS[name]
    torch.cuda.init()
    fraction = None
    if cap:
        total = torch.cuda.get_device_properties(0).total_memory
        fraction = cap * (1 << 30) / total
        torch.cuda.set_per_process_memory_fraction(fraction)
    if stacks:
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=MAX_ENTRIES.get(name, 2_000_000))
    else:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=MAX_ENTRIES.get(name, 2_000_000))
    fname, _, arg = fn.partition(":")
    oom = False
    t0 = time.time()
    try:
        r = globals()[fname](torch, *([int(arg)] if arg else []))
        oom = bool(r)
    except torch.cuda.OutOfMemoryError as e:
        oom = _oom(e)
    elapsed = time.time() - t0
    if name in RANKS:
        name = f"{name}_rank{os.environ['RANK']}"
    torch.cuda.memory._dump_snapshot(os.path.join(outdir, name + ".pickle"))
    torch.cuda.memory._record_memory_history(enabled=None)
    stats = {k: v for k, v in torch.cuda.memory_stats().items()}
    info = {"name": name, "workload": fn, "memory_fraction_cap_gib": cap, "memory_fraction": fraction,
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_ALLOC_CONF", "")),
            "alloc_conf_workload": conf, "oom_messages": OOM_MESSAGES, "python": sys.version.split()[0],
            "torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0),
            "total_memory": torch.cuda.get_device_properties(0).total_memory,
            "oom_raised": oom, "seconds": elapsed, "memory_stats": stats}
    with open(os.path.join(outdir, name + ".stats.json"), "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)
    print(f"{name}: oom={oom} oom_messages={len(OOM_MESSAGES)} {elapsed:.1f}s reserved_peak={stats.get('reserved_bytes.all.peak')} alloc_peak={stats.get('allocated_bytes.all.peak')} retries={stats.get('num_alloc_retries')} ooms={stats.get('num_ooms')}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "one":
        run_one(sys.argv[2], sys.argv[3])
    else:
        outdir = sys.argv[2]
        os.makedirs(outdir, exist_ok=True)
        only = sys.argv[3:] or list(WORKLOADS)
        for name in only:
            env = dict(os.environ)
            conf = WORKLOADS[name][1]
            if conf:
                env["PYTORCH_CUDA_ALLOC_CONF"] = conf
            else:
                env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            env.pop("PYTORCH_ALLOC_CONF", None)
            if name in RANKS:
                world = RANKS[name]
                env.update(WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
                procs = [subprocess.Popen([sys.executable, __file__, "one", name, outdir], env=dict(env, RANK=str(r)))
                         for r in range(world)]
                codes = [p.wait(timeout=PER_WORKLOAD_TIMEOUT_S) for p in procs]
                if any(codes):
                    print(f"{name}: FAILED rc={codes}", flush=True)
                continue
            try:
                r = subprocess.run([sys.executable, __file__, "one", name, outdir], env=env, timeout=PER_WORKLOAD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                print(f"{name}: TIMEOUT after {PER_WORKLOAD_TIMEOUT_S}s", flush=True)
                continue
            if r.returncode:
                print(f"{name}: FAILED rc={r.returncode}", flush=True)
