//! A trace built under a capacity. Where the build's model asks for a segment the
//! recording did not have (under a what-if capacity it releases and retries where the
//! program did not), the recorded device hands it a synthetic one, and each must keep
//! its own addresses until the model frees it. The build once gave every event group a
//! fresh copy of the synthetic heap, which handed the same addresses out again: two
//! segments over one range, whose blocks broke the model's free index (building
//! `big_gpt_long_stacks_s9` at 4.6 GiB stopped on the debug assertion "free block of 655360
//! bytes not indexed"). Built here at capacities under each shared trace's peak, in the
//! test profile (`ci`), whose debug assertions check the model's free index as it
//! changes.

use std::path::PathBuf;

use allocsim_core::models::ModelSpec;
use allocsim_core::{session, whatif};

fn traces_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/traces"));
    dir.is_dir().then_some(dir)
}

#[test]
fn every_shared_trace_builds_under_capacities_below_its_peak() {
    let Some(dir) = traces_dir() else {
        println!("skipped: ../shared/traces is absent");
        return;
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("traces")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".pickle.gz"))
        .collect();
    files.sort();
    assert!(files.len() > 20, "the shared traces: {}", files.len());
    let spec = ModelSpec::parse("pytorch").expect("spec");
    for path in files {
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .to_string();
        let bytes = std::fs::read(&path).expect("read");
        let free = session::load(&bytes, None).expect("builds");
        let peak = session::replay_device(&free.trace, 0, &spec, None, whatif::summary_options())
            .expect("replays")
            .peak_reserved_bytes;
        let mut caps = vec![peak * 9 / 10, peak * 3 / 5];
        if name.starts_with("big_gpt_long_stacks_s9") {
            // Where the overlap was found.
            caps.extend([4_939_212_390, 4 << 30]);
        }
        for cap in caps {
            // The inferences may differ (a release the capacity explains); the model's
            // blocks must not overlap.
            let built = session::load(&bytes, Some(cap))
                .unwrap_or_else(|e| panic!("{name} at {cap} bytes: {e}"));
            assert!(!built.trace.devices.is_empty(), "{name} at {cap} bytes");
        }
    }
}
