"""allocsim.diff and allocsim.ranks (issue 18) against the CLI binary's --json on the
repository's real recordings (tests/traces/diff: capture.py's diff_train at batch 256 and
1024, and at 256 under expandable segments; tests/traces/ranks: a 4-rank DDP run, rank 2 at
8x the batch), with each snapshot given as a path, bytes, a dict or a loaded Snapshot, and
the errors: a corrupt file among the ranks named, an empty directory, different devices."""

import gzip
import json
import pickle
import shutil

import pytest

import allocsim
from conftest import REPO_TRACES, run_cli

DIFF = REPO_TRACES / "diff"
RANKS = REPO_TRACES / "ranks"


def cli_json(*args):
    out = run_cli(*args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def cli_error(*args):
    out = run_cli(*args)
    assert out.returncode == 2 and out.stdout == "", (out.returncode, out.stdout)
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("allocsim: ")
    return line[len("allocsim: "):]


def diff_file(name):
    return str(DIFF / f"{name}.pickle.gz")


def rank_file(r):
    return str(RANKS / f"ddp4_rank{r}.pickle.gz")


def as_dict(path):
    with gzip.open(path, "rb") as f:
        return pickle.load(f)  # our own test file


@pytest.mark.parametrize("align", ["time", "events", "steps"])
def test_diff_equals_the_cli_and_names_the_site_that_grew(align):
    a, b = diff_file("diff_train_bs256"), diff_file("diff_train_bs1024")
    got = allocsim.diff(a, b, align=align)
    assert got == cli_json("diff", a, b, "--align", align)
    assert list(got)[0] == "schema" and got["schema"] == 1
    assert got["a"]["file"] == a and got["b"]["file"] == b
    # Four times the batch: B peaks higher and the site that grew most grew by a positive
    # amount that the by-site rows add up to, as the CLI states.
    assert got["peak_reserved_delta_bytes"] > 0
    top = got["by_site"][0]
    assert top["delta_bytes"] == top["b_bytes"] - top["a_bytes"] > 0
    assert got["summary"].startswith("B peaks")


def test_diff_of_snapshots_in_memory_is_the_diff_of_their_files():
    a, b = diff_file("diff_train_bs256"), diff_file("diff_train_bs256_expand")
    from_files = allocsim.diff(a, b)
    assert from_files == cli_json("diff", a, b)
    assert from_files["settings_differ"], "expandable_segments differs"
    named = allocsim.diff(allocsim.load(a), open(b, "rb").read())
    assert named["a"]["file"] == a and named["b"]["file"] == "<bytes>"
    named["b"]["file"] = b
    assert named == from_files
    from_dicts = allocsim.diff(as_dict(a), as_dict(b))
    assert from_dicts["a"]["file"] == from_dicts["b"]["file"] == "<snapshot dict>"
    from_dicts["a"]["file"], from_dicts["b"]["file"] = a, b
    assert from_dicts == from_files


def test_diff_of_one_snapshot_under_two_settings():
    a = diff_file("diff_train_bs256")
    snap = allocsim.load(a)
    got = allocsim.diff(snap, snap, config_b="expandable_segments:True", align="events")
    assert got == cli_json("diff", a, a, "--config-b", "expandable_segments:True", "--align", "events")
    assert got["b"]["config"] == "expandable_segments:True"
    assert got["a"]["config"] != got["b"]["config"]


def test_diff_capacity_is_an_option_as_on_the_command_line():
    a, b = diff_file("diff_train_bs256"), diff_file("diff_train_bs1024")
    got = allocsim.diff(a, b, capacity="none")
    assert got == cli_json("diff", a, b, "--capacity", "none")


def test_ranks_of_a_directory_equal_the_cli_and_name_the_outlier():
    got = allocsim.ranks(RANKS, min_capacity=False)
    assert got == cli_json("ranks", str(RANKS), "--no-min-capacity")
    assert [r["rank"] for r in got["ranks"]] == [0, 1, 2, 3]
    assert got["outlier"]["rank"] == 2 and got["outlier"]["file"] == rank_file(2)
    assert got["outlier"]["above_median_bytes"] > 0.1 * got["median_peak_reserved_bytes"]


def test_ranks_with_a_what_if_and_min_capacity_equal_the_cli():
    files = [rank_file(r) for r in range(4)]
    got = allocsim.ranks(files, what_if="max_split_size_mb:20")
    assert got == cli_json("ranks", *files, "--config", "max_split_size_mb:20")
    assert got["what_if"]["config"] == "max_split_size_mb:20"
    assert all(r["min_capacity_bytes"] for r in got["ranks"])


def test_ranks_in_memory_are_the_ranks_of_their_files():
    files = [rank_file(r) for r in range(4)]
    from_files = allocsim.ranks(files, min_capacity=False)
    mixed = [
        allocsim.load(files[0]),
        allocsim.load(open(files[1], "rb").read(), name=files[1]),
        allocsim.load(as_dict(files[2]), name=files[2]),
        files[3],
    ]
    assert allocsim.ranks(mixed, min_capacity=False) == from_files
    # Unnamed ones are ranked by their position.
    unnamed = allocsim.ranks([as_dict(f) for f in files], min_capacity=False)
    assert [r["file"] for r in unnamed["ranks"]] == ["<snapshot dict>"] * 4
    assert [r["rank"] for r in unnamed["ranks"]] == [0, 1, 2, 3]
    assert unnamed["outlier"]["rank"] == 2
    assert [r["peak_reserved_bytes"] for r in unnamed["ranks"]] == [
        r["peak_reserved_bytes"] for r in from_files["ranks"]
    ]


def test_a_corrupt_file_among_the_ranks_is_named(tmp_path):
    for r in range(4):
        shutil.copy(rank_file(r), tmp_path / f"ddp4_rank{r}.pickle.gz")
    bad = tmp_path / "ddp4_rank1.pickle.gz"
    data = gzip.decompress(bad.read_bytes())
    bad.write_bytes(gzip.compress(data[: len(data) // 2]))
    with pytest.raises(allocsim.AllocsimError) as e:
        allocsim.ranks(tmp_path, min_capacity=False)
    assert e.value.exit_code == 2
    assert str(e.value).startswith(str(bad) + ": ")
    assert str(e.value) == cli_error("ranks", str(tmp_path), "--no-min-capacity")
    # Bytes that are no snapshot fail when loaded, named as bytes.
    with pytest.raises(allocsim.AllocsimError) as e:
        allocsim.ranks([rank_file(0), b"not a snapshot"])
    assert str(e.value).startswith("<bytes>: ") and e.value.exit_code == 2


def test_an_empty_directory_and_different_devices_are_errors(tmp_path):
    with pytest.raises(allocsim.AllocsimError) as e:
        allocsim.ranks(tmp_path)
    assert e.value.exit_code == 2
    assert str(e.value) == cli_error("ranks", str(tmp_path))
    assert "no snapshots" in str(e.value)
    one = b'{"segments": [], "device_traces": [[]]}'
    two = b'{"segments": [], "device_traces": [[], []]}'
    (tmp_path / "a_rank0.json").write_bytes(one)
    (tmp_path / "a_rank1.json").write_bytes(two)
    expected = cli_error("ranks", str(tmp_path))
    assert "snapshots of different devices" in expected
    with pytest.raises(allocsim.AllocsimError) as e:
        allocsim.ranks(tmp_path)
    assert e.value.exit_code == 2 and str(e.value) == expected
    in_memory = [
        allocsim.load(one, name=str(tmp_path / "a_rank0.json")),
        allocsim.load(two, name=str(tmp_path / "a_rank1.json")),
    ]
    with pytest.raises(allocsim.AllocsimError) as e:
        allocsim.ranks(in_memory)
    assert str(e.value) == expected


def test_bad_arguments_are_the_cli_s_errors():
    a = diff_file("diff_train_bs256")
    with pytest.raises(allocsim.AllocsimError) as e:
        allocsim.diff(a, a, align="sideways")
    assert e.value.exit_code == 2 and "sideways" in str(e.value)
    with pytest.raises(allocsim.AllocsimError) as e:
        allocsim.diff(a, "/nonexistent.pickle")
    assert str(e.value) == cli_error("diff", a, "/nonexistent.pickle")
    with pytest.raises(allocsim.AllocsimError) as e:
        allocsim.ranks([rank_file(0)], what_if="no_such_key:1")
    assert e.value.exit_code == 2 and "no_such_key" in str(e.value)
    assert "diff" in allocsim._native.commands() and "ranks" in allocsim._native.commands()
