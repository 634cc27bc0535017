"""The native module (Rust, pyo3): the command line's own code. Use the functions of
``allocsim`` instead; this is what they call."""

from typing import List, Optional

__version__: str

class AllocsimError(Exception):
    """An allocsim error: ``str(e)`` is the command line's one-line message (naming the
    file and, where it applies, the byte offset or event index)."""

    exit_code: int
    """The command line's exit code for it: 2 bad input or usage, 3 the machine lacks
    what is needed."""

class Snapshot:
    """A decoded snapshot (``allocsim.load``): pass it to any function instead of a path
    to decode it once."""

    @property
    def name(self) -> str:
        """What messages and ``validate``'s ``file`` call it."""
    @property
    def nbytes(self) -> int:
        """Its size in bytes as read (compressed or not)."""
    @property
    def device_events(self) -> List[int]:
        """The number of events of each ``device_traces[D]``."""
    @property
    def exact(self) -> bool:
        """Whether allocsim's PyTorch model reproduces every device exactly."""

def decode(data: bytes, name: str) -> Snapshot:
    """Decodes a snapshot's bytes (pickle, JSON, gzip of either)."""

def read(path: str) -> Snapshot:
    """Reads and decodes the snapshot at ``path``."""

def run_json(args: List[str], snapshot: Optional[Snapshot] = None) -> str:
    """Runs a command (``[command, options…, "--", FILE]``) and returns its ``--json``
    object as JSON text."""

def run_json_many(args: List[str], snapshots: List[Optional[Snapshot]]) -> str:
    """Runs a command of several snapshots (``diff``, ``ranks``): ``snapshots[i]``, when
    not None, is the snapshot the i-th FILE argument names (not read); the others are
    read. Returns the ``--json`` object as JSON text."""

def main(argv: List[str]) -> int:
    """Runs the ``allocsim`` command line in this process; returns its exit code."""

def commands() -> List[str]:
    """The commands ``run_json`` runs."""
