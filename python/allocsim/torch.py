"""allocsim at the moment of a CUDA out-of-memory error, inside a PyTorch program.

    import allocsim.torch
    allocsim.torch.on_oom(dir="oom")   # records the allocator's history and watches for OOMs
    train()                            # at an OOM: snapshot + explanation, then PyTorch's error

torch is imported when these functions are called, never by ``import allocsim``.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, TextIO

__all__ = ["record", "on_oom", "DEFAULT_MAX_ENTRIES"]

#: The history ``record`` keeps by default: the last 100,000 allocator events.
DEFAULT_MAX_ENTRIES = 100_000


def _torch() -> Any:
    import torch  # the real one: absolute import

    return torch


def record(max_entries: int = DEFAULT_MAX_ENTRIES, stacks: str = "python", device: Any = None) -> None:
    """Starts the CUDA allocator's memory history the way allocsim reads it best: every
    event (``enabled="all"``: allocations, frees, segment operations, OOMs), each with
    its stack (``stacks="python"``, cheap; ``"all"`` adds C++ frames), the last
    ``max_entries`` kept. Call it before the program's first CUDA allocation, so the
    history starts from an empty allocator (a wrapped history still replays: allocsim
    rebuilds the state before its first event)."""
    torch = _torch()
    torch.cuda.memory._record_memory_history(
        enabled="all", context="all", stacks=stacks, max_entries=max_entries, device=device
    )


def on_oom(
    dir: str = ".",
    *,
    record_history: bool = True,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    stacks: str = "python",
    analyse: bool = True,
    file: Optional[TextIO] = None,
) -> Callable[[int, int, int, int], None]:
    """Attaches an observer to PyTorch's CUDA out-of-memory errors
    (``torch._C._cuda_attach_out_of_memory_observer``); returns it.

    At an OOM, before PyTorch raises its ``OutOfMemoryError``, the observer writes into
    ``dir``:

    - ``oom-<time>-pid<P>-cuda<D>.pickle``: the snapshot (``torch.cuda.memory._snapshot()``,
      pickled as ``_dump_snapshot`` writes it);
    - ``….json`` beside it: the GPU's total memory, the per-process memory fraction,
      ``PYTORCH_CUDA_ALLOC_CONF``, the observer's own arguments and
      ``torch.cuda.memory_stats()``;

    then (``analyse``) replays the snapshot with the capacity as recorded and prints to
    ``file`` (default: stderr) allocsim's explanation, the setting that would have fit and
    the command that opens the snapshot in the viewer. The observer never raises, and
    PyTorch's own error follows as it would have without it.

    ``record_history``: also start the memory history (:func:`record` with ``max_entries``
    and ``stacks``); without a history the snapshot cannot be replayed.
    """
    torch = _torch()
    if record_history:
        record(max_entries=max_entries, stacks=stacks)
    busy = threading.Lock()

    def observer(device: int, alloc: int, device_limit: int, device_free: int) -> None:
        out = file if file is not None else sys.stderr
        # One OOM at a time; an OOM raised while one is being written is left alone.
        if not busy.acquire(blocking=False):
            return
        try:
            _report(torch, dir, analyse, out, device, alloc, device_limit, device_free)
        except BaseException as e:  # never raise from inside PyTorch's allocator
            try:
                print(f"allocsim: could not write or explain this OOM: {type(e).__name__}: {e}", file=out)
            except BaseException:
                pass
        finally:
            busy.release()

    torch._C._cuda_attach_out_of_memory_observer(observer)
    return observer


def _report(
    torch: Any,
    dir: str,
    analyse: bool,
    out: TextIO,
    device: int,
    alloc: int,
    device_limit: int,
    device_free: int,
) -> None:
    snapshot = torch.cuda.memory._snapshot()
    os.makedirs(dir, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = os.path.join(dir, f"oom-{stamp}-pid{os.getpid()}-cuda{device}")
    path = base + ".pickle"
    data = pickle.dumps(snapshot)
    with open(path, "wb") as f:
        f.write(data)
    with open(base + ".json", "w") as f:
        json.dump(_sidecar(torch, path, device, alloc, device_limit, device_free), f, indent=1, default=str)
    _say(out, f"allocsim: CUDA out of memory on device {device}: the snapshot is in {path} (details in {base}.json)")
    if not analyse:
        _say(out, f"  open it in the viewer: allocsim serve {path}")
        return
    import allocsim

    t0 = time.monotonic()
    snap = allocsim.load(data, name=path)
    traces = snap.device_events
    if device >= len(traces) or traces[device] == 0:
        _say(
            out,
            "  the snapshot has no allocator history for this device: start it with "
            "allocsim.torch.record() (or on_oom(record_history=True)) before the first CUDA allocation",
        )
        _say(out, f"  open it in the viewer: allocsim serve {path}")
        return
    e = allocsim.explain(snap, trace_device=device)
    for line in _explanation_lines(e, snap.exact):
        _say(out, "  " + line)
    _say(out, f"  open it in the viewer: allocsim serve {path}")
    _say(out, f"  (allocsim: {time.monotonic() - t0:.1f} s; the full story: allocsim explain {path})")


def _sidecar(torch: Any, path: str, device: int, alloc: int, device_limit: int, device_free: int) -> Dict[str, Any]:
    cuda = torch.cuda

    def attempt(f: Callable[[], Any]) -> Any:
        try:
            return f()
        except Exception as e:  # what cannot be asked is written as such
            return f"unavailable: {type(e).__name__}: {e}"

    return {
        "schema": 1,
        "snapshot": os.path.basename(path),
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "pid": os.getpid(),
        "torch_version": getattr(torch, "__version__", None),
        "device": device,
        "observer": {
            "alloc_bytes": alloc,
            "device_limit_bytes": device_limit,
            "device_free_bytes": device_free,
        },
        "total_memory_bytes": attempt(lambda: cuda.get_device_properties(device).total_memory),
        "memory_fraction": attempt(lambda: cuda.memory.get_per_process_memory_fraction(device)),
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "PYTORCH_ALLOC_CONF": os.environ.get("PYTORCH_ALLOC_CONF"),
        "memory_stats": attempt(lambda: dict(cuda.memory_stats(device))),
    }


def _explanation_lines(e: Dict[str, Any], exact: bool) -> List[str]:
    lines = []
    if not exact:
        lines.append(
            "warning: allocsim's PyTorch model does not reproduce this recording exactly "
            "(allocsim validate says where); what follows may be off"
        )
    lines.append(e["sentence"] + ".")
    for b in e.get("blockers") or []:
        lines.append(b["sentence"] + ".")
    fit = e.get("would_fit")
    if fit:
        lines.append(fit["best_sentence"] + ".")
        lines.append(fit["min_capacity_sentence"] + ".")
    if e.get("capacity_note"):
        lines.append(e["capacity_note"])
    return lines


def _say(out: TextIO, line: str) -> None:
    print(line, file=out)
    out.flush()
