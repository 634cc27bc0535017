//! stdout going away: a reader that closes the pipe early ends the output quietly (no
//! panic, the command's own exit code), and a stdout that cannot be written is one line on
//! stderr and a non-zero exit.

mod common;

use std::process::Stdio;

fn trace() -> String {
    common::repo_trace("gpt2_big_batch_oom_msg.pickle.gz")
}

#[test]
fn a_reader_that_closes_the_pipe_early_ends_the_output_quietly() {
    for args in [
        ["compare", "--json"],
        ["recommend", "--json"],
        ["replay", "--capacity=none"],
    ] {
        let mut child = common::allocsim()
            .args([args[0], &trace(), args[1]])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run allocsim");
        // The reader goes away before the command has printed anything (it first decodes
        // and replays), as `| head -0` would: every write then meets a closed pipe.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.contains("Broken pipe"), "{args:?}: {err}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
    }
}

#[test]
fn a_stdout_that_cannot_be_written_is_one_line_and_a_non_zero_exit() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        println!("skipped: no /dev/full on this system");
        return;
    };
    let out = common::allocsim()
        .args(["replay", &trace()])
        .stdout(full)
        .output()
        .expect("run allocsim");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("allocsim: cannot write the output"),
        "{err}"
    );
}
