"""The Python API against the command line: the same JSON objects (the CLI binary cargo
built, ALLOCSIM_BIN), a snapshot passed as bytes or as the dict torch returns, and errors
as AllocsimError with the CLI's own one-line message and exit code."""

import gzip
import json
import pickle
import subprocess
import sys

import pytest

import allocsim
from conftest import run_cli, shared_traces, trace, wheel_cli

ALL = shared_traces() or ["oom_story.pickle.gz", "mlp_train.pickle.gz", "multistream_pub.pickle.gz"]


def cli_json(*args):
    out = run_cli(*args, "--json")
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("name", ALL)
def test_validate_and_replay_equal_the_cli(name):
    path = str(trace(name))
    snap = allocsim.load(path)
    assert allocsim.validate(snap) == cli_json("validate", path)
    assert allocsim.replay(snap) == cli_json("replay", path)
    assert allocsim.validate(path) == allocsim.validate(snap)


# (trace, function, keyword arguments, the same as CLI options)
CASES = [
    ("oom_story.pickle.gz", "explain", {}, []),
    ("oom_story.pickle.gz", "recommend", {}, []),
    ("oom_story.pickle.gz", "recommend", {"capacity": "2.2GiB"}, ["--capacity", "2.2GiB"]),
    ("oom_story.pickle.gz", "compare", {}, []),
    ("oom_story.pickle.gz", "compare", {"allocators": ["pytorch", "bfc", "pytorch@expandable_segments:True"]},
     ["--allocators", "pytorch;bfc;pytorch@expandable_segments:True"]),
    ("oom_story.pickle.gz", "min_capacity", {}, []),
    ("oom_story.pickle.gz", "replay", {"capacity": 3 << 30, "config": "expandable_segments:True"},
     ["--capacity", str(3 << 30), "--config", "expandable_segments:True"]),
    ("oom_story.pickle.gz", "replay", {"capacity": "none", "allocator": "tlsf"}, ["--capacity", "none", "--allocator", "tlsf"]),
    ("oom_story.pickle.gz", "validate", {"capacity": "2.2GiB"}, ["--capacity", "2.2GiB"]),
    ("oom_fragmented.pickle.gz", "explain", {}, []),
    ("oom_fragmented.pickle.gz", "recommend", {"capacity": "2GiB"}, ["--capacity", "2GiB"]),
    ("multistream_pub.pickle.gz", "explain", {"at": 40}, ["--at", "40"]),
    ("multistream_pub.pickle.gz", "min_capacity", {"allocator": "bfc"}, ["--allocator", "bfc"]),
    ("mlp_train.pickle.gz", "compare", {"capacity": "1GiB"}, ["--capacity", "1GiB"]),
    ("two_gpu_pipeline.pickle.gz", "replay", {"trace_device": 1}, ["--trace-device", "1"]),
    ("two_gpu_pipeline.pickle.gz", "explain", {"trace_device": 1}, ["--trace-device", "1"]),
    ("wrapped_history_pub.pickle.gz", "explain", {}, []),
    ("gc_threshold_s2.pickle.gz", "recommend", {}, []),
]


@pytest.mark.parametrize("name,function,kwargs,options", CASES)
def test_each_command_equals_the_cli(name, function, kwargs, options):
    path = str(trace(name))
    got = getattr(allocsim, function)(path, **kwargs)
    assert got == cli_json(function.replace("_", "-"), path, *options)
    assert got["schema"] == 1 and list(got)[0] == "schema"


def oom_story_dict():
    with gzip.open(trace("oom_story.pickle.gz"), "rb") as f:
        return pickle.load(f)  # our own test file


def test_a_snapshot_dict_is_the_file_it_came_from():
    d = oom_story_dict()
    path = str(trace("oom_story.pickle.gz"))
    from_dict = allocsim.validate(d)
    from_file = allocsim.validate(path)
    assert from_dict["file"] == "<snapshot dict>"
    from_dict["file"] = from_file["file"]
    assert from_dict == from_file
    assert allocsim.explain(d) == allocsim.explain(path)
    assert allocsim.load(d, name="mine").name == "mine"
    assert allocsim.load(d).device_events == [38]


def test_bytes_and_json_snapshots():
    raw = trace("oom_story.pickle.gz").read_bytes()
    assert allocsim.replay(raw) == allocsim.replay(bytearray(raw)) == allocsim.replay(str(trace("oom_story.pickle.gz")))
    j = trace("oom_story_as_json.json")
    assert allocsim.replay(j.read_bytes()) == cli_json("replay", str(j))


def test_one_loaded_snapshot_serves_many_calls():
    snap = allocsim.load(str(trace("oom_story.pickle.gz")))
    assert snap.exact and snap.nbytes > 0 and "oom_story" in repr(snap)
    assert allocsim.replay(snap)["oom"] is not None  # as recorded: it runs out of memory
    assert allocsim.replay(snap, capacity="none")["oom"] is None
    assert allocsim.load(snap) is snap


def error_of(call):
    with pytest.raises(allocsim.AllocsimError) as e:
        call()
    return e.value


def cli_error_line(*args):
    out = run_cli(*args)
    assert out.stdout == ""
    line = out.stderr.strip()
    assert line.count("\n") == 0 and line.startswith("allocsim: ")
    return out.returncode, line[len("allocsim: "):]


def test_bad_input_is_the_cli_s_one_line(tmp_path):
    bad = tmp_path / "broken.pickle.gz"
    bad.write_bytes(trace("oom_story.pickle.gz").read_bytes()[:300])
    missing = tmp_path / "missing.pickle"
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"\x80\x04\x95 not really a pickle")
    for path in (bad, missing, garbage):
        e = error_of(lambda: allocsim.validate(str(path)))
        code, line = cli_error_line("validate", path)
        assert (e.exit_code, str(e)) == (code, line) == (2, line)
        assert str(path) in str(e)
    # Options: the CLI's parser and messages.
    story = str(trace("oom_story.pickle.gz"))
    for kwargs, options in [
        ({"capacity": "1.2"}, ["--capacity", "1.2"]),
        ({"allocator": "nosuch"}, ["--allocator", "nosuch"]),
        ({"config": "expandable_segments:Maybe"}, ["--config", "expandable_segments:Maybe"]),
        ({"trace_device": 7}, ["--trace-device", "7"]),
    ]:
        e = error_of(lambda: allocsim.replay(story, **kwargs))
        code, line = cli_error_line("replay", story, *options)
        assert (e.exit_code, str(e)) == (code, line)
        assert e.exit_code == 2


def test_bad_bytes_and_types():
    e = error_of(lambda: allocsim.load(b"GIF89a"))
    assert e.exit_code == 2 and str(e).startswith("<bytes>: not a PyTorch snapshot")
    e = error_of(lambda: allocsim.load({"segments": "nope"}))
    assert str(e).startswith("<snapshot dict>: ")
    # A pickle that would run code is refused, never executed.
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    e = error_of(lambda: allocsim.load(pickle.dumps({"segments": [], "device_traces": [[Evil()]]})))
    assert e.exit_code == 2
    with pytest.raises(TypeError):
        allocsim.load(42)
    with pytest.raises(TypeError):
        allocsim.replay(str(trace("oom_story.pickle.gz")), capacity=True)


def test_import_needs_no_torch():
    code = "import sys, allocsim, allocsim.torch; assert 'torch' not in sys.modules; print(allocsim.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == allocsim.__version__


def test_the_wheel_installs_the_command_line():
    path = str(trace("oom_story.pickle.gz"))
    for argv in ([wheel_cli()], [sys.executable, "-m", "allocsim"]):
        out = subprocess.run([*argv, "validate", path, "--json"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == allocsim.validate(path)
        out = subprocess.run([*argv, "replay", "/nonexistent.pickle"], capture_output=True, text=True)
        assert out.returncode == 2 and out.stderr.startswith("allocsim: /nonexistent.pickle: cannot read")
        out = subprocess.run([*argv, "--version"], capture_output=True, text=True)
        assert out.returncode == 0 and allocsim.__version__ in out.stdout


def test_no_desktop_app_in_the_wheel_points_at_serve():
    out = subprocess.run([wheel_cli()], capture_output=True, text=True)
    assert out.returncode == 3 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "allocsim serve FILE" in out.stderr
