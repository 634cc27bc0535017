//! The diff's attribution on real traces: at each run's peak the live blocks, traced back
//! to their allocations, add up to exactly the allocated bytes the replay's timeline has
//! there, and the change of peak reserved memory splits exactly into sites and
//! reserved-but-free — for every trace of the repository and of the shared corpus, each
//! against itself under `expandable_segments:True`.

use allocsim_core::diff::{self, Align};
use allocsim_core::models::ModelSpec;
use allocsim_core::session;
use allocsim_core::trace::Trace;

fn check(name: &str, trace: &Trace, failures: &mut Vec<String>) {
    let d = trace.busiest_device();
    let own = ModelSpec::parse("pytorch").unwrap();
    let alt = ModelSpec::parse("pytorch@expandable_segments:True").unwrap();
    let capacity = session::capacity(trace, d, allocsim_core::capacity::CapacityArg::default());
    let runs =
        [&own, &alt].map(|spec| diff::run(name, trace, d, spec, capacity.bytes, Align::Events));
    let [Ok(a), Ok(b)] = runs else {
        failures.push(format!("{name}: a run failed: {runs:?}"));
        return;
    };
    for r in [&a, &b] {
        let c = &r.curve;
        let at = c
            .reserved_bytes
            .iter()
            .position(|&x| x == r.peak_reserved_bytes);
        let expected = at.map_or(0, |k| c.allocated_bytes[k]);
        // A trace whose peak is its start state (every op below it) is checked at op 0.
        if at.is_some() && r.allocated_at_peak_bytes != expected {
            failures.push(format!(
                "{name} ({}): sites add up to {} at the peak, the timeline has {expected}",
                r.config, r.allocated_at_peak_bytes
            ));
        }
        if r.by_site.values().sum::<u64>() != r.allocated_at_peak_bytes {
            failures.push(format!("{name}: the sites' sum is not allocated_at_peak"));
        }
    }
    let x = diff::diff(a, b, Align::Events);
    let sites: i64 = x.by_site.iter().map(|s| s.delta_bytes).sum();
    if sites + x.free_at_peak_delta_bytes != x.peak_reserved_delta_bytes {
        failures.push(format!(
            "{name}: sites {sites} + free {} != reserved {}",
            x.free_at_peak_delta_bytes, x.peak_reserved_delta_bytes
        ));
    }
}

#[test]
fn sites_at_the_peak_add_up_to_the_allocated_bytes_on_real_traces() {
    let mut failures = Vec::new();
    // tests/traces and its diff/ and ranks/ subfolders.
    let repo = allocsim_tests::repo_traces();
    assert!(repo.len() >= 18, "{}", repo.len());
    let shared = allocsim_tests::corpus();
    if shared.is_empty() {
        println!("skipped: the shared corpus (../shared/traces) is absent; repository traces only");
    }
    for t in repo.iter().chain(&shared) {
        let v = session::load(&std::fs::read(&t.path).unwrap(), t.cap_bytes).unwrap();
        check(&t.name, &v.trace, &mut failures);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
