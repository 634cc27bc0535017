"""A stand-in for torch in the tests of allocsim.torch (no GPU, no torch here): just what
allocsim.torch calls, and an allocation that runs out of memory the way PyTorch's CUDA
caching allocator does -- its OOM observers called with (device, alloc, device limit,
device free), then ``torch.OutOfMemoryError`` raised.

The snapshot ``torch.cuda.memory._snapshot()`` returns is a real one, read from the file
named by ``FAKE_TORCH_SNAPSHOT`` (a test fixture of ours: loaded with pickle). With
``FAKE_TORCH_SNAPSHOT=raise`` taking the snapshot fails, as a broken torch would.
"""

import gzip
import os
import pickle
import types

__version__ = "2.11.0+fake"

#: What ``_record_memory_history`` was called with, in order.
history_calls = []
_observers = []

#: The fake GPU: its memory and the cap in force.
TOTAL_MEMORY = 150_109_880_320
MEMORY_FRACTION = 0.016


class OutOfMemoryError(RuntimeError):
    pass


def _attach(observer):
    _observers.append(observer)


_C = types.SimpleNamespace(_cuda_attach_out_of_memory_observer=_attach)


def _snapshot():
    path = os.environ.get("FAKE_TORCH_SNAPSHOT", "")
    if path == "raise":
        raise RuntimeError("fake torch: the snapshot cannot be taken")
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return pickle.load(f)


def _record_memory_history(**kwargs):
    history_calls.append(kwargs)


def memory_stats(device=None):
    return {"num_ooms": 1, "reserved_bytes.all.current": 2 << 30, "allocated_bytes.all.current": 900 << 20}


def get_per_process_memory_fraction(device=None):
    return MEMORY_FRACTION


def get_device_properties(device):
    return types.SimpleNamespace(total_memory=TOTAL_MEMORY, name="Fake GPU")


memory = types.SimpleNamespace(
    _snapshot=_snapshot,
    _record_memory_history=_record_memory_history,
    get_per_process_memory_fraction=get_per_process_memory_fraction,
)
cuda = types.SimpleNamespace(
    memory=memory,
    memory_stats=memory_stats,
    get_device_properties=get_device_properties,
    OutOfMemoryError=OutOfMemoryError,
)


def empty(nbytes, device=0):
    """Allocates ``nbytes`` on the fake GPU: always out of memory, as PyTorch reports it."""
    limit = int(TOTAL_MEMORY * MEMORY_FRACTION)
    free = 128 << 20
    for observer in list(_observers):
        observer(device, nbytes, limit, free)
    raise OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {nbytes / 2**20:.2f} MiB. GPU {device} has a total capacity of "
        f"{TOTAL_MEMORY / 2**30:.2f} GiB of which {free / 2**20:.2f} MiB is free."
    )
