"""allocsim: replay PyTorch CUDA memory snapshots through exact allocator models.

Every function takes a snapshot -- a path, the bytes of a snapshot file, the dict
``torch.cuda.memory._snapshot()`` returns, or a :class:`Snapshot` from :func:`load` -- and
the command line's options as keyword arguments, and returns the object the command line
prints with ``--json`` (docs/cli.md), as a dict with the same keys; :func:`diff` takes two
snapshots and :func:`ranks` a directory or a list of them. Errors raise
:class:`AllocsimError` with the command line's one-line message.

``import allocsim`` needs no torch; :mod:`allocsim.torch` imports it when called.
"""

from __future__ import annotations

import json
import os
import pickle
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

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
    "diff",
    "ranks",
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


def _options(options: Dict[str, Any]) -> List[str]:
    args: List[str] = []
    for key, value in options.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if key == "capacity":
            value = _size(value)
        elif value is True:  # a flag without a value
            args.append(flag)
            continue
        elif key == "allocators" and not isinstance(value, str):
            value = ";".join(value)
        args += [flag, str(value)]
    return args


def _run(command: str, x: SnapshotLike, options: Dict[str, Any]) -> Dict[str, Any]:
    snap = load(x)
    args = [command, *_options(options), "--", snap.name]
    return json.loads(_native.run_json(args, snap))


def _file_or_snapshot(x: SnapshotLike) -> Tuple[str, Optional[Snapshot]]:
    # A path is read by the command itself (several files decode in parallel, and an
    # unreadable one is named as the command line names it); anything else is loaded here.
    if isinstance(x, (str, os.PathLike)):
        return os.fspath(x), None
    snap = load(x)
    return snap.name, snap


def _run_many(command: str, inputs: Sequence[SnapshotLike], options: Dict[str, Any]) -> Dict[str, Any]:
    files = [_file_or_snapshot(x) for x in inputs]
    args = [command, *_options(options), "--", *(name for name, _ in files)]
    return json.loads(_native.run_json_many(args, [snap for _, snap in files]))


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


def diff(
    a: SnapshotLike,
    b: SnapshotLike,
    *,
    align: str = "time",
    config_a: Optional[str] = None,
    config_b: Optional[str] = None,
    capacity: Optional[Size] = None,
) -> Dict[str, Any]:
    """``allocsim diff A B``: two runs on a common axis and what changed at the peak.

    ``a`` and ``b`` are snapshots as every function takes them (a path, bytes, a snapshot
    dict or a :class:`Snapshot`); paths are read in parallel, and one snapshot given twice
    (the same path or the same :class:`Snapshot`) is decoded once -- e.g. under two
    settings. ``align``: ``"time"`` (time since each run's first event), ``"events"``
    (event index) or ``"steps"`` (repeated step markers, else the optimizer's calls);
    ``config_a`` / ``config_b``: the PyTorch settings each run is replayed under
    (PyTorch's defaults plus ``key:value,…``; default: the run's own); ``capacity``:
    bytes, ``"80GiB"`` or ``"none"`` (default: each run's as recorded).

    Returns the ``--json`` object: ``a`` and ``b`` (file, peaks, peak event,
    fragmentation, config), the deltas of the peaks, ``by_site`` (live bytes at the peak
    by allocation site, sorted by growth), ``settings_differ`` and ``summary``.
    """
    return _run_many(
        "diff",
        [a, b],
        {"align": align, "config_a": config_a, "config_b": config_b, "capacity": capacity},
    )


def ranks(
    inputs: Union[SnapshotLike, Sequence[SnapshotLike]],
    *,
    what_if: Optional[str] = None,
    capacity: Optional[Size] = None,
    min_capacity: bool = True,
) -> Dict[str, Any]:
    """``allocsim ranks``: one snapshot per rank, a row each, the outlier and a what-if
    setting tried on every rank; the ranks are replayed in parallel.

    ``inputs``: a directory of snapshots (its ``.pickle``, ``.pickle.gz``, ``.pkl``,
    ``.json`` and ``.json.gz`` files, in name order), or a list of snapshots as every
    function takes them (paths, bytes, dicts, :class:`Snapshot`) or of directories. A
    rank is read from the name (``rank3``, ``_3.``), else it is the position; name an
    in-memory snapshot with ``allocsim.load(x, name="rank3.pickle")``.
    ``what_if``: the PyTorch setting tried on every rank (default
    ``expandable_segments:True``); ``capacity``: bytes, ``"80GiB"`` or ``"none"``
    (default: each rank's as recorded); ``min_capacity=False`` skips each rank's
    smallest-capacity bisection.

    A file that cannot be read or decoded, an empty directory, or snapshots of different
    devices raise :class:`AllocsimError` naming it (``exit_code`` 2).
    """
    if isinstance(inputs, (str, os.PathLike, bytes, bytearray, memoryview, dict, Snapshot)):
        items: List[SnapshotLike] = [inputs]
    else:
        items = list(inputs)
    return _run_many(
        "ranks",
        items,
        {"config": what_if, "capacity": capacity, "no_min_capacity": None if min_capacity else True},
    )
