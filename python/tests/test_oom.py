"""allocsim.torch.on_oom against a fake torch (tests/fake_torch) whose allocation runs out
of memory as PyTorch's does: the snapshot and its sidecar are written, the explanation and
the setting that would have fit are printed before PyTorch's traceback, the original error
still ends the program, and the observer never raises."""

import json
import os
import subprocess
import sys

from conftest import FAKE_TORCH, run_cli, trace

PROGRAM = """
import allocsim.torch, torch
allocsim.torch.on_oom(dir={dir!r})
assert torch.history_calls == [dict(enabled="all", context="all", stacks="python", max_entries=100000, device=None)]
torch.empty(400 << 20)
"""


def run(tmp_path, snapshot):
    env = dict(os.environ, PYTHONPATH=str(FAKE_TORCH), FAKE_TORCH_SNAPSHOT=str(snapshot))
    code = PROGRAM.format(dir=str(tmp_path / "oom"))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_on_oom_explains_before_the_traceback(tmp_path):
    out = run(tmp_path, trace("oom_story.pickle.gz"))
    err = out.stderr
    assert out.returncode == 1, err
    lines = err.splitlines()
    assert lines[-1].startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 400.00 MiB")
    ours = next(i for i, l in enumerate(lines) if l.startswith("allocsim: CUDA out of memory on device 0"))
    traceback = lines.index("Traceback (most recent call last):")
    assert ours < traceback
    text = "\n".join(lines[ours:traceback])
    assert "a request of 400.00 MiB" in text and "6 holes" in text
    assert "With PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:32 every request is served under 2.39 GiB" in text
    assert "capacity as recorded: 2.39 GiB" in text
    (pickle_path,) = (tmp_path / "oom").glob("oom-*-cuda0.pickle")
    assert f"allocsim serve {pickle_path}" in text
    sidecar = json.loads(pickle_path.with_suffix(".json").read_text())
    assert sidecar["total_memory_bytes"] == 150_109_880_320
    assert sidecar["memory_fraction"] == 0.016
    assert sidecar["observer"] == {"alloc_bytes": 400 << 20, "device_limit_bytes": int(150_109_880_320 * 0.016),
                                   "device_free_bytes": 128 << 20}
    assert sidecar["memory_stats"]["num_ooms"] == 1
    assert "PYTORCH_CUDA_ALLOC_CONF" in sidecar and sidecar["torch_version"] == "2.11.0+fake"
    # The dumped snapshot is the one torch gave, and replays exactly.
    v = run_cli("validate", pickle_path, "--json")
    assert v.returncode == 0 and json.loads(v.stdout)["exact"] is True


def test_the_observer_never_raises(tmp_path):
    out = run(tmp_path, "raise")
    lines = out.stderr.splitlines()
    assert out.returncode == 1
    assert "allocsim: could not write or explain this OOM: RuntimeError: fake torch: the snapshot cannot be taken" in lines
    assert lines[-1].startswith("torch.OutOfMemoryError: CUDA out of memory")


def test_a_snapshot_without_history_says_how_to_record(tmp_path):
    import gzip
    import pickle

    with gzip.open(trace("oom_story.pickle.gz"), "rb") as f:
        snap = pickle.load(f)  # our own test file
    snap["device_traces"] = [[]]
    bare = tmp_path / "bare.pickle"
    bare.write_bytes(pickle.dumps(snap))
    out = run(tmp_path, bare)
    assert out.returncode == 1
    assert "the snapshot has no allocator history for this device" in out.stderr
    assert out.stderr.splitlines()[-1].startswith("torch.OutOfMemoryError")
