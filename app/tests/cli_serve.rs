//! `allocsim serve` in a build without the `web-assets` feature (the workspace's own): one
//! line that says how to get the viewer, exit 3, nothing on stdout, whatever FILE is. The
//! serving build is tested from the wheel (`python/tests/test_serve.py`, `web/tests/serve.mjs`).

use std::process::Command;

#[test]
fn serve_without_the_site_says_how_to_get_it() {
    for args in [
        vec!["serve"],
        vec!["serve", "/nonexistent.pickle", "--port", "0"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_allocsim"))
            .args(&args)
            .output()
            .expect("run allocsim");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {err}");
        assert!(out.stdout.is_empty());
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(
            err.starts_with("allocsim: this build of allocsim has no web viewer")
                && err.contains("pip install")
                && err.contains("--features web-assets"),
            "{err}"
        );
    }
}

#[test]
fn serve_port_is_checked_by_the_parser() {
    let out = Command::new(env!("CARGO_BIN_EXE_allocsim"))
        .args(["serve", "--port", "70000"])
        .output()
        .expect("run allocsim");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("70000") && err.ends_with("(see --help)\n"),
        "{err}"
    );
}
