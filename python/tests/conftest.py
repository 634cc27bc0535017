"""Shared fixtures: the real traces (../shared/traces beside the repository, or
ALLOCSIM_TRACES) and the CLI to compare with (ALLOCSIM_BIN: the Rust binary cargo built;
default: the wheel's own `allocsim` command)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
TRACES = Path(os.environ.get("ALLOCSIM_TRACES", REPO.parent / "shared" / "traces"))
FAKE_TORCH = HERE / "fake_torch"


REPO_TRACES = REPO / "tests" / "traces"


def trace(name):
    """A real snapshot: from the shared traces, else the repository's own copy."""
    for d in (TRACES, REPO_TRACES):
        if (d / name).is_file():
            return d / name
    pytest.skip(f"no {name} in {TRACES} (set ALLOCSIM_TRACES)")


def shared_traces():
    """Every real snapshot of the shared traces (none without them)."""
    return sorted(p.name for p in TRACES.glob("*.pickle.gz")) + sorted(p.name for p in TRACES.glob("*.json") if not p.name.endswith(".stats.json"))


def cli():
    b = os.environ.get("ALLOCSIM_BIN") or shutil.which("allocsim")
    assert b, "no allocsim command: install the wheel or set ALLOCSIM_BIN"
    return b


def run_cli(*args, **kw):
    return subprocess.run([cli(), *map(str, args)], capture_output=True, text=True, **kw)


def wheel_cli():
    """The wheel's console script (beside this interpreter)."""
    b = Path(sys.executable).parent / "allocsim"
    assert b.is_file(), f"the wheel installed no allocsim command beside {sys.executable}"
    return str(b)
