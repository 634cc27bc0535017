//! Every allocator model over every shared trace (STYLE.md rule 19), and the what-if
//! answers on the seeds' `oom_story` (issue 3).

use allocsim_core::models::{ModelSpec, kind};
use allocsim_core::replay::{ReplayOptions, ReplayResult};
use allocsim_core::session;
use allocsim_core::trace::Trace;
use allocsim_core::whatif::{self, GRID_BYTES};
use allocsim_tests::{CorpusTrace, corpus, skip_without_corpus};

fn load(t: &CorpusTrace) -> Trace {
    let bytes = std::fs::read(&t.path).unwrap();
    session::load(&bytes, t.cap_bytes)
        .unwrap_or_else(|e| panic!("{}: {e}", t.name))
        .trace
}

fn summary(r: &ReplayResult) -> (usize, u64, u64, u64, u64, Option<u64>) {
    (
        r.ops_done,
        r.peak_reserved_bytes,
        r.peak_allocated_bytes,
        r.final_reserved_bytes,
        r.segment_ops,
        r.oom.as_ref().map(|o| o.event_index),
    )
}

#[test]
fn every_model_replays_every_trace_without_breaking_an_invariant() {
    if skip_without_corpus() {
        return;
    }
    let traces = corpus();
    assert!(
        traces.len() >= 24,
        "expected the 24 shared traces, found {}",
        traces.len()
    );
    let mut failures = Vec::new();
    for t in &traces {
        let trace = load(t);
        let d = trace.busiest_device();
        let op_count = trace.devices[d].ops.len();
        // Every event on the small traces; every 997th (a prime) on the big ones.
        let check_every = if op_count < 20_000 { 1 } else { 997 };
        for name in kind::DEFAULT_COMPARE {
            let spec = ModelSpec::parse(name).unwrap();
            let opts = ReplayOptions {
                checkpoint_every: 0,
                max_checkpoints: 0,
                check_every,
                keep_timeline: false,
                keep_requested: false,
                preloaded: false,
            };
            let r = session::replay_device(&trace, d, &spec, t.cap_bytes, opts).unwrap();
            if let Some((k, e)) = &r.invariant_error {
                failures.push(format!("{} / {name}: op {k}: {e}", t.name));
            }
            if r.peak_reserved_bytes < r.peak_allocated_bytes {
                failures.push(format!(
                    "{} / {name}: peak reserved below peak allocated",
                    t.name
                ));
            }
            if let Some(c) = t.cap_bytes
                && r.peak_reserved_bytes > c
            {
                failures.push(format!(
                    "{} / {name}: reserved {} over the cap {c}",
                    t.name, r.peak_reserved_bytes
                ));
            }
            if op_count < 20_000 {
                let again = session::replay_device(&trace, d, &spec, t.cap_bytes, opts).unwrap();
                if summary(&r) != summary(&again) {
                    failures.push(format!("{} / {name}: two replays differ", t.name));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn oom_story() -> Option<(CorpusTrace, Trace)> {
    if skip_without_corpus() {
        return None;
    }
    let t = corpus()
        .into_iter()
        .find(|t| t.name == "oom_story")
        .expect("oom_story in the corpus");
    let trace = load(&t);
    Some((t, trace))
}

#[test]
fn oom_story_default_pytorch_fails_at_the_400_mib_request_and_says_why() {
    let Some((t, trace)) = oom_story() else {
        return;
    };
    let cap = t.cap_bytes.expect("oom_story ran under a cap");
    assert_eq!(cap, (2.2 * f64::from(1u32 << 30)).round() as u64);
    let spec = ModelSpec::parse("pytorch").unwrap();
    let r = session::replay_device(&trace, 0, &spec, Some(cap), whatif::summary_options()).unwrap();
    let o = r.oom.expect("the recorded OOM is reproduced");
    assert_eq!(o.requested_bytes, 400 << 20);
    assert!(!o.fatal, "the program caught it and went on");
    assert!(
        o.explanation.starts_with(
            "Tried to allocate 400.00 MiB; 2.00 GiB reserved by PyTorch, 1.12 GiB of it free in 6 holes, the largest 248.00 MiB"
        ),
        "{}",
        o.explanation
    );
}

#[test]
fn oom_story_compare_shows_which_models_fail_and_where() {
    let Some((t, trace)) = oom_story() else {
        return;
    };
    let specs: Vec<ModelSpec> = kind::DEFAULT_COMPARE
        .iter()
        .map(|s| ModelSpec::parse(s).unwrap())
        .collect();
    let results = whatif::compare(&trace, 0, &specs, t.cap_bytes, &mut |_, _| {}).unwrap();
    let by = |label: &str| {
        results
            .iter()
            .find(|r| {
                if r.config.is_empty() {
                    r.allocator == label
                } else {
                    format!("{}@{}", r.allocator, r.config) == label
                }
            })
            .unwrap_or_else(|| panic!("{label} missing"))
    };
    // Caching allocators whose free 180 MiB holes cannot hold 400 MiB fail at that request.
    for failing in ["pytorch", "bfc", "rmm-pool", "tlsf"] {
        let o = by(failing)
            .oom
            .as_ref()
            .unwrap_or_else(|| panic!("{failing} should fail"));
        assert_eq!(o.requested_bytes, 400 << 20, "{failing}");
        assert!(
            o.explanation
                .contains("would have fit: pytorch@expandable_segments:True"),
            "{failing}: {}",
            o.explanation
        );
    }
    // Unmapping or stitching free pages, or not caching at all, serves it.
    for fitting in [
        "pytorch@expandable_segments:True",
        "vmm-stitch",
        "cuda-malloc",
    ] {
        assert!(
            by(fitting).oom.is_none(),
            "{fitting} should fit: {:?}",
            by(fitting).oom
        );
    }
    // The arena gets half the capacity, the binning resource preallocates its bins, the
    // buddy rounds 180 MiB up to 256 MiB: they fail earlier.
    let recorded = by("pytorch").oom.as_ref().unwrap().event_index;
    for early in ["rmm-arena", "rmm-binning", "buddy"] {
        let o = by(early)
            .oom
            .as_ref()
            .unwrap_or_else(|| panic!("{early} should fail"));
        assert!(o.fatal && o.event_index < recorded, "{early}: {o:?}");
    }
}

#[test]
fn oom_story_recommend_finds_a_config_that_fits() {
    let Some((t, trace)) = oom_story() else {
        return;
    };
    let cap = t.cap_bytes.unwrap();
    let r = whatif::recommend(&trace, 0, Some(cap), &mut |_, _| {}).unwrap();
    assert!(r.default.oom.is_some());
    assert!(whatif::served_all(&r.best), "{:?}", r.best.oom);
    assert_eq!(r.candidates_tried, 168);
    // Expandable segments fit too; the best (least predicted driver time first) costs no
    // more driver time than they do.
    let expandable = ModelSpec::parse("pytorch@expandable_segments:True").unwrap();
    let e = session::replay_device(&trace, 0, &expandable, Some(cap), whatif::summary_options())
        .unwrap();
    assert!(e.oom.is_none());
    assert!(r.best.driver.driver_time_us <= e.driver.driver_time_us);
    assert!(whatif::rank(&r.best) <= whatif::rank(&e));
    let explanation = r.default.oom.unwrap().explanation;
    assert!(
        explanation.contains(&format!("would have fit: pytorch@{}", r.best.config)),
        "{explanation}"
    );
}

#[test]
fn oom_story_min_capacity_agrees_with_replay() {
    let Some((_, trace)) = oom_story() else {
        return;
    };
    for name in kind::DEFAULT_COMPARE {
        let spec = ModelSpec::parse(name).unwrap();
        let m = whatif::min_capacity(&trace, 0, &spec, &mut |_, _| {}).unwrap();
        assert_eq!(m.min_capacity_bytes % GRID_BYTES, 0);
        let at = session::replay_device(
            &trace,
            0,
            &spec,
            Some(m.min_capacity_bytes),
            whatif::summary_options(),
        )
        .unwrap();
        assert!(
            whatif::served_all(&at),
            "{name}: OOM at its min capacity {}",
            m.min_capacity_bytes
        );
        if m.min_capacity_bytes > GRID_BYTES {
            let below = session::replay_device(
                &trace,
                0,
                &spec,
                Some(m.min_capacity_bytes - GRID_BYTES),
                whatif::summary_options(),
            )
            .unwrap();
            assert!(
                !whatif::served_all(&below),
                "{name}: serves every request 2 MiB below {}",
                m.min_capacity_bytes
            );
        }
    }
}
