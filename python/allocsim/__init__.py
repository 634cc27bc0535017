"""allocsim: replay PyTorch CUDA memory snapshots through exact allocator models.

Every function takes a snapshot -- a path, the bytes of a snapshot file, the dict
``torch.cuda.memory._snapshot()`` returns, or a :class:`Snapshot` from :func:`load` -- and
the command line's options as keyword arguments, and returns the object the command line
prints with ``--json`` (docs/cli.md), as a dict with the same keys. Errors raise
:class:`AllocsimError` with the command line's one-line message.

``import allocsim`` needs no torch; :mod:`allocsim.torch` imports it when called.
"""

from __future__ import annotations

import json
import os
import pickle
from typing import Any, Dict, Optional, Sequence, Union

from . import _native
from ._native import AllocsimError, Snapshot

__version__: str = _native.__version__

__all__ = [
    "AllocsimError",
    "Snapshot",
    "load",
    "validate",
    "replay",
    "compare",
    "min_capacity",
    "recommend",
    "explain",
]

SnapshotLike = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, Dict[str, Any], Snapshot]
Size = Union[int, str]

#: The name messages give a snapshot passed as bytes or as a dict.
BYTES_NAME = "<bytes>"
DICT_NAME = "<snapshot dict>"


def load(x: SnapshotLike, *, name: Optional[str] = None) -> Snapshot:
    """Decodes a snapshot once, for several calls.

    ``x`` is a path (``.pickle``, ``.pickle.gz``, ``.json``, ``.json.gz``, told apart by
    content), the bytes of such a file, or the dict ``torch.cuda.memory._snapshot()``
    returns. A dict is pickled in memory exactly as ``torch.cuda.memory._dump_snapshot``
    writes it to a file, so it decodes as that file would (no file is written). ``name``
    is what messages and ``validate``'s ``file`` call it (default: the path, ``<bytes>``
    or ``<snapshot dict>``). The snapshot is decoded with allocsim's own decoder: no code
    in a pickle is ever run.
    """
    if isinstance(x, Snapshot):
        return x
    if isinstance(x, (str, os.PathLike)):
        path = os.fspath(x)
        if name is None:
            return _native.read(path)
        with open(path, "rb") as f:
            return _native.decode(f.read(), name)
    if isinstance(x, (bytes, bytearray, memoryview)):
        return _native.decode(bytes(x), name or BYTES_NAME)
    if isinstance(x, dict):
        return _native.decode(pickle.dumps(x), name or DICT_NAME)
    raise TypeError(
        f"allocsim.load: expected a path, bytes, a snapshot dict or an allocsim.Snapshot, not {type(x).__name__}"
    )


def _size(value: Size) -> str:
    # An int is bytes (the CLI's bare numbers must be >= 1 MiB; "B" takes any count).
    if isinstance(value, bool):
        raise TypeError("a size is an int (bytes) or a string such as '2.2GiB' or 'none'")
    return f"{value}B" if isinstance(value, int) else str(value)


def _run(command: str, x: SnapshotLike, options: Dict[str, Any]) -> Dict[str, Any]:
    snap = load(x)
    args = [command]
    for key, value in options.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if key == "capacity":
            value = _size(value)
        elif key == "allocators" and not isinstance(value, str):
            value = ";".join(value)
        args += [flag, str(value)]
    args += ["--", snap.name]
    return json.loads(_native.run_json(args, snap))


def validate(x: SnapshotLike, *, capacity: Optional[Size] = None) -> Dict[str, Any]:
    """``allocsim validate``: replays the recording through the PyTorch model on the
    recorded device and compares every event. ``exact`` says whether every device
    matched; a divergence is a result (``first_divergence``), not an error.

    ``capacity``: the per-process memory cap the program ran under (bytes or ``"2.2GiB"``).
    """
    return _run("validate", x, {"capacity": capacity})


def replay(
    x: SnapshotLike,
    *,
    allocator: Optional[str] = None,
    config: Optional[str] = None,
    capacity: Optional[Size] = None,
    trace_device: Optional[int] = None,
) -> Dict[str, Any]:
    """``allocsim replay``: the requests through one model on the simulated device.

    ``allocator``: ``pytorch`` (default), ``cuda-malloc``, ``bfc``, ``rmm-pool``, … or
    ``NAME@CONFIG``; ``config``: PyTorch's ``key:value,…`` syntax (without it the
    snapshot's own settings); ``capacity``: bytes, ``"2.2GiB"`` or ``"none"`` (default:
    as recorded); ``trace_device``: which ``device_traces[D]`` (default: the busiest).
    """
    return _run(
        "replay",
        x,
        {"allocator": allocator, "config": config, "capacity": capacity, "trace_device": trace_device},
    )


def compare(
    x: SnapshotLike,
    *,
    allocators: Optional[Union[str, Sequence[str]]] = None,
    capacity: Optional[Size] = None,
    trace_device: Optional[int] = None,
) -> Dict[str, Any]:
    """``allocsim compare``: several models or configs side by side, with the best
    possible bounds. ``allocators``: a list of ``NAME`` / ``NAME@CONFIG`` (or one
    ``;``-separated string); default: every model plus expandable segments.
    """
    return _run("compare", x, {"allocators": allocators, "capacity": capacity, "trace_device": trace_device})


def min_capacity(
    x: SnapshotLike,
    *,
    allocator: Optional[str] = None,
    config: Optional[str] = None,
    trace_device: Optional[int] = None,
) -> Dict[str, Any]:
    """``allocsim min-capacity``: the smallest capacity (2 MiB grid) that runs the trace
    without running out of memory."""
    return _run("min-capacity", x, {"allocator": allocator, "config": config, "trace_device": trace_device})


def recommend(
    x: SnapshotLike,
    *,
    capacity: Optional[Size] = None,
    trace_device: Optional[int] = None,
) -> Dict[str, Any]:
    """``allocsim recommend``: sweeps PyTorch's allocator settings at a capacity (default:
    as recorded) and returns the best, the recorded settings' replay and the trade-offs."""
    return _run("recommend", x, {"capacity": capacity, "trace_device": trace_device})


def explain(
    x: SnapshotLike,
    *,
    allocator: Optional[str] = None,
    config: Optional[str] = None,
    capacity: Optional[Size] = None,
    at: Optional[int] = None,
    trace_device: Optional[int] = None,
) -> Dict[str, Any]:
    """``allocsim explain``: why a request did not fit -- at the OOM, at event ``at`` or
    at the peak: the holes, the blocks that pin them, and what would have fit
    (``would_fit``: the best setting and the smallest capacity)."""
    return _run(
        "explain",
        x,
        {"allocator": allocator, "config": config, "capacity": capacity, "at": at, "trace_device": trace_device},
    )
