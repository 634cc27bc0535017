//! `allocsim ranks` as outside tests call it, on the real 4-rank DDP run of
//! `tests/traces/ranks/` (capture.py's `ddp_train`, four processes on one GPU, rank 2 at
//! 8× the batch): the rows against each rank's own `memory_stats`, the outlier, the
//! what-if on every rank, ranks from file names, one-line errors with exit 2.

mod common;

use std::path::PathBuf;

use common::{bad_input, json_of, run, temp_dir, u};

fn ranks_dir() -> PathBuf {
    common::repo_traces().join("ranks")
}

fn rank_file(r: u32) -> String {
    ranks_dir()
        .join(format!("ddp4_rank{r}.pickle.gz"))
        .to_str()
        .expect("utf-8 path")
        .to_string()
}

fn memory_stat(r: u32, key: &str) -> u64 {
    let stat = common::memory_stat(&ranks_dir().join(format!("ddp4_rank{r}.stats.json")), key);
    u64::try_from(stat).expect(key)
}

#[test]
fn the_ddp_run_names_rank_2_as_the_outlier() {
    let dir = ranks_dir();
    let v = json_of(&run(&["ranks", dir.to_str().unwrap(), "--json"]));
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "schema",
            "ranks",
            "median_peak_reserved_bytes",
            "outlier",
            "what_if",
            "summary"
        ]
    );
    let rows = v["ranks"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "the .stats.json files are not ranks: {v}");
    for (r, row) in rows.iter().enumerate() {
        let r = u32::try_from(r).unwrap();
        assert_eq!(u(&row["rank"]), u64::from(r));
        assert!(
            row["file"]
                .as_str()
                .unwrap()
                .ends_with(&format!("ddp4_rank{r}.pickle.gz"))
        );
        assert_eq!(
            u(&row["peak_reserved_bytes"]),
            memory_stat(r, "reserved_bytes.all.peak")
        );
        assert_eq!(
            u(&row["peak_allocated_bytes"]),
            memory_stat(r, "allocated_bytes.all.peak")
        );
        assert!(row["oom"].is_null());
        // No capacity was recorded: the smallest that serves every request lies between
        // the live peak and the peak reserved.
        let min = u(&row["min_capacity_bytes"]);
        assert!(min <= u(&row["peak_reserved_bytes"]) && min >= u(&row["peak_allocated_bytes"]));
        assert!(row["what_if"]["served_all"].as_bool().unwrap());
    }
    let median = memory_stat(0, "reserved_bytes.all.peak");
    assert_eq!(u(&v["median_peak_reserved_bytes"]), median);
    let o = &v["outlier"];
    assert_eq!(u(&o["rank"]), 2);
    assert!(
        o["file"]
            .as_str()
            .unwrap()
            .ends_with("ddp4_rank2.pickle.gz")
    );
    assert_eq!(
        u(&o["above_median_bytes"]),
        memory_stat(2, "reserved_bytes.all.peak") - median
    );
    let w = &v["what_if"];
    assert_eq!(w["config"], "expandable_segments:True");
    assert_eq!((u(&w["fits"]), u(&w["ranks"])), (4, 4));
    assert!(
        v["summary"]
            .as_str()
            .unwrap()
            .starts_with("Rank 2 is the outlier")
    );
}

#[test]
fn ranks_come_from_the_names_in_any_order_and_the_text_marks_the_outlier() {
    let out = run(&[
        "ranks",
        &rank_file(3),
        &rank_file(2),
        &rank_file(0),
        &rank_file(1),
        "--no-min-capacity",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("Rank 2 is the outlier: its peak reserved memory is 108.00 MiB above the median of 4 ranks (184.00 MiB"), "{text}");
    assert!(
        text.contains("expandable_segments:True fits on 4/4"),
        "{text}"
    );
    let rows: Vec<&str> = text.lines().filter(|l| l.contains("ddp4_rank")).collect();
    assert_eq!(rows.len(), 4);
    for (r, l) in rows.iter().enumerate() {
        assert!(
            l.trim_start().starts_with(&format!("{r}  ddp4_rank{r}")),
            "{l}"
        );
        assert_eq!(l.ends_with("← outlier"), r == 2, "{l}");
    }
}

#[test]
fn a_what_if_under_a_capacity_counts_the_ranks_it_serves() {
    // 200 MiB: the three ranks at batch 256 fit under expandable segments, rank 2 does not.
    let dir = ranks_dir();
    let v = json_of(&run(&[
        "ranks",
        dir.to_str().unwrap(),
        "--capacity",
        "200MiB",
        "--no-min-capacity",
        "--json",
    ]));
    assert_eq!(u(&v["what_if"]["fits"]), 3);
    let rows = v["ranks"].as_array().unwrap();
    assert!(!rows[2]["what_if"]["served_all"].as_bool().unwrap());
    assert!(rows[2]["oom"]["fatal"].as_bool().unwrap());
    assert!(
        v["what_if"]["sentence"]
            .as_str()
            .unwrap()
            .starts_with("expandable_segments:True fits on 3/4 at 200.00 MiB")
    );
}

#[test]
fn bad_inputs_are_one_line_errors_naming_the_file() {
    let dir = temp_dir("bad");
    std::fs::copy(rank_file(0), dir.join("job_rank0.pickle.gz")).unwrap();
    std::fs::write(dir.join("job_rank1.pickle.gz"), b"\x1f\x8b\x08\x00broken").unwrap();
    bad_input(
        &run(&["ranks", dir.to_str().unwrap()]),
        "job_rank1.pickle.gz",
    );
    let empty = temp_dir("empty");
    std::fs::write(empty.join("notes.txt"), b"no snapshot here").unwrap();
    bad_input(
        &run(&["ranks", empty.to_str().unwrap()]),
        "no snapshots in this directory",
    );
    let devs = temp_dir("devs");
    std::fs::write(
        devs.join("a_rank0.json"),
        br#"{"segments": [], "device_traces": [[]]}"#,
    )
    .unwrap();
    std::fs::write(
        devs.join("a_rank1.json"),
        br#"{"segments": [], "device_traces": [[], []]}"#,
    )
    .unwrap();
    bad_input(
        &run(&["ranks", devs.to_str().unwrap()]),
        "snapshots of different devices",
    );
    bad_input(
        &run(&[
            "ranks",
            &rank_file(0),
            "--config",
            "expandable_segments:Maybe",
        ]),
        "--config",
    );
    for d in [dir, empty, devs] {
        std::fs::remove_dir_all(d).ok();
    }
}
