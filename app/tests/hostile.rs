//! The hostile-input suite (issue 19): every case of `hostile_gen` written to a file and
//! run through every command under a memory limit (`ulimit -v`) and a time limit. A
//! refused case must exit 2 with one line on stderr naming the file; a valid one must
//! exit 0 with a consistent answer (peak ≥ final, peak reserved ≥ peak allocated, an OOM
//! for a request no device can serve) under every model.

mod hostile_gen;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hostile_gen::{Case, Expect, cases};

/// Virtual memory each run may map (`ulimit -v`, KiB): 1.5 GiB for inputs of at most a
/// few MB, so a decoder that amplified them would be killed.
const MEMORY_LIMIT_KIB: u64 = 1536 * 1024;
/// Wall-clock limit of one run.
const TIME_LIMIT: Duration = Duration::from_secs(30);

const MODELS: [&str; 9] = [
    "pytorch",
    "cuda-malloc",
    "bfc",
    "rmm-pool",
    "rmm-arena",
    "rmm-binning",
    "buddy",
    "tlsf",
    "vmm-stitch",
];

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `allocsim ARGS` under the memory limit; panics past the time limit.
fn run_limited(args: &[String]) -> Run {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let mut script = format!("ulimit -v {MEMORY_LIMIT_KIB} && exec \"$0\"");
    for i in 1..=args.len() {
        script.push_str(" \"$");
        script.push_str(&i.to_string());
        script.push('"');
    }
    let n = RUNS.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir();
    let (out_path, err_path) = (
        dir.join(format!("allocsim-hostile-{}-{n}.out", std::process::id())),
        dir.join(format!("allocsim-hostile-{}-{n}.err", std::process::id())),
    );
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .arg(env!("CARGO_BIN_EXE_allocsim"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("run allocsim");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > TIME_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("allocsim {args:?} ran past {TIME_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let run = Run {
        code: status.code(),
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    };
    let _ = std::fs::remove_file(&out_path);
    let _ = std::fs::remove_file(&err_path);
    run
}

fn write(case: &Case) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("allocsim-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{}.pickle", case.name));
    std::fs::write(&p, &case.bytes).unwrap();
    p
}

/// The first line of stderr, or the panic's message line.
fn first_line(stderr: &str) -> String {
    let mut lines = stderr.lines();
    let first = lines.next().unwrap_or("").to_string();
    if first.starts_with("thread ") {
        format!("{first} {}", lines.next().unwrap_or(""))
    } else {
        first
    }
}

fn json(r: &Run, what: &str) -> serde_json::Value {
    serde_json::from_str(&r.stdout)
        .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {}", r.stdout))
}

fn u(v: &serde_json::Value, key: &str, what: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{what}: {key} missing in {v}"))
}

/// The commands every case goes through.
fn commands(file: &Path, case: &Case) -> Vec<Vec<String>> {
    let f = file.display().to_string();
    let mut cmds = vec![
        vec!["validate".into(), f.clone(), "--json".into()],
        vec!["compare".into(), f.clone(), "--json".into()],
        vec!["min-capacity".into(), f.clone(), "--json".into()],
        vec!["explain".into(), f.clone(), "--json".into()],
    ];
    for m in MODELS {
        cmds.push(vec![
            "replay".into(),
            f.clone(),
            "--allocator".into(),
            m.into(),
            "--json".into(),
        ]);
        if matches!(case.expect, Expect::Valid { oom: true }) {
            cmds.push(vec![
                "replay".into(),
                f.clone(),
                "--allocator".into(),
                m.into(),
                "--capacity".into(),
                "80GiB".into(),
                "--json".into(),
            ]);
        }
    }
    cmds
}

fn check(case: &Case, file: &Path, args: &[String]) -> Result<(), String> {
    let r = run_limited(args);
    let what = format!("{} / allocsim {}", case.name, args.join(" "));
    let one_line = r.stderr.trim_end().lines().count() <= 1;
    match case.expect {
        Expect::Refused(mention) => {
            if r.code != Some(2)
                || !one_line
                || !r.stderr.contains(&file.display().to_string())
                || !r.stderr.to_lowercase().contains(&mention.to_lowercase())
                || !r.stdout.is_empty()
            {
                return Err(format!(
                    "{what}: expected exit 2, one line naming the file and '{mention}'; got {:?}: {}",
                    r.code,
                    first_line(&r.stderr)
                ));
            }
        }
        Expect::Valid { oom } => {
            let cmd = args[0].as_str();
            // explain on a trace without an OOM may say there is nothing to explain;
            // validate may find the recording inexact (exit 1) — both one line.
            let ok_codes: &[i32] = match cmd {
                "validate" => &[0, 1],
                "explain" | "min-capacity" => &[0, 2],
                _ => &[0],
            };
            if !r.code.is_some_and(|c| ok_codes.contains(&c)) || !one_line {
                return Err(format!(
                    "{what}: got {:?}: {}",
                    r.code,
                    first_line(&r.stderr)
                ));
            }
            if r.code == Some(2) && !r.stderr.contains(&file.display().to_string()) {
                return Err(format!(
                    "{what}: error does not name the file: {}",
                    r.stderr
                ));
            }
            if cmd == "replay" {
                let v = json(&r, &what);
                let (pr, fr, pa) = (
                    u(&v, "peak_reserved_bytes", &what),
                    u(&v, "final_reserved_bytes", &what),
                    u(&v, "peak_allocated_bytes", &what),
                );
                if pr < fr || pr < pa {
                    return Err(format!(
                        "{what}: peak reserved {pr}, final reserved {fr}, peak allocated {pa}"
                    ));
                }
                let ooms = v["ooms"].as_array().map_or(0, Vec::len);
                if oom && ooms == 0 {
                    return Err(format!("{what}: a request no device can serve was served"));
                }
                if !oom && ooms != 0 {
                    return Err(format!("{what}: unexpected OOM"));
                }
            }
        }
    }
    Ok(())
}

#[test]
fn every_hostile_input_is_refused_in_one_line_or_answered_consistently() {
    let only = std::env::var("ALLOCSIM_HOSTILE_ONLY").ok();
    let mut failures = Vec::new();
    for case in cases() {
        if only
            .as_ref()
            .is_some_and(|o| !case.name.contains(o.as_str()))
        {
            continue;
        }
        let file = write(&case);
        for args in commands(&file, &case) {
            if let Err(e) = check(&case, &file, &args) {
                failures.push(e);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn a_100_kb_config_is_refused_in_one_short_line() {
    let case = cases()
        .into_iter()
        .find(|c| c.name == "valid_small")
        .unwrap();
    let file = write(&case);
    let f = file.display().to_string();
    let huge = "x".repeat(100_000);
    for args in [
        vec![
            "replay",
            &f,
            "--config",
            &format!("max_split_size_mb:{huge}"),
        ],
        vec!["replay", &f, "--config", &format!("{huge}:1")],
        vec!["replay", &f, "--allocator", &format!("bfc@{huge}:1")],
        vec!["replay", &f, "--allocator", &huge],
    ] {
        let args: Vec<String> = args.into_iter().map(String::from).collect();
        let r = run_limited(&args);
        assert_eq!(r.code, Some(2), "{}", first_line(&r.stderr));
        assert_eq!(r.stderr.trim_end().lines().count(), 1, "{}", r.stderr.len());
        assert!(r.stderr.len() < 1000, "echoed {} bytes", r.stderr.len());
        assert!(
            r.stderr.contains("bytes]"),
            "says what it left out: {}",
            r.stderr
        );
    }
}
