//! Unit tests of `whatif`.

use super::*;
use crate::workloads;

fn story() -> Trace {
    workloads::generate("oom-story").unwrap()
}

/// Every valid candidate of [`recommend_candidates`] replayed on its own on `device`: its
/// config string, parsed config, effect on the trace and the replay's outcome.
fn each_candidate_alone(
    t: &Trace,
    device: usize,
    capacity: Option<u64>,
) -> Vec<(String, PyTorchConfig, Effect, Outcome)> {
    let sizes = block_sizes(&t.devices[device]);
    recommend_candidates()
        .into_iter()
        .filter_map(|conf| {
            let cfg = PyTorchConfig::parse(&conf).ok()?;
            let gc = conf
                .split(',')
                .find_map(|kv| kv.strip_prefix("garbage_collection_threshold:"));
            let spec = ModelSpec::parse(&format!("pytorch@{conf}")).unwrap();
            let r = session::replay_device(t, device, &spec, capacity, summary_options()).unwrap();
            let e = effect(&cfg, &sizes, capacity, gc);
            Some((conf, cfg, e, outcome(&r)))
        })
        .collect()
}

const CAP: u64 = 2_362_232_013; // round(2.2 × 2^30)

#[test]
fn compare_says_which_models_fit() {
    let specs: Vec<ModelSpec> = ["pytorch", "pytorch@expandable_segments:True", "bfc"]
        .iter()
        .map(|s| ModelSpec::parse(s).unwrap())
        .collect();
    let mut calls = 0;
    let r = compare(&story(), 0, &specs, Some(CAP), &mut |_, _| calls += 1).unwrap();
    assert_eq!(calls, 4);
    assert!(!fits(&r[0]) && served_all(&r[1]));
    let e = &r[0].oom.as_ref().unwrap().explanation;
    assert!(e.starts_with("Tried to allocate 400.00 MiB"), "{e}");
    assert!(
        e.ends_with("would have fit: pytorch@expandable_segments:True"),
        "{e}"
    );
}

#[test]
fn min_capacity_fits_there_and_fails_two_mib_below() {
    let t = story();
    for name in ["pytorch", "bfc", "buddy", "vmm-stitch"] {
        let spec = ModelSpec::parse(name).unwrap();
        let m = min_capacity(&t, 0, &spec, &mut |_, _| {}).unwrap();
        let at =
            session::replay_device(&t, 0, &spec, Some(m.min_capacity_bytes), summary_options())
                .unwrap();
        let below = session::replay_device(
            &t,
            0,
            &spec,
            Some(m.min_capacity_bytes - GRID_BYTES),
            summary_options(),
        )
        .unwrap();
        assert!(served_all(&at), "{name} at {}", m.min_capacity_bytes);
        assert!(!served_all(&below), "{name} below {}", m.min_capacity_bytes);
        assert!(
            m.min_capacity_bytes
                <= m.unlimited_peak_reserved_bytes.div_ceil(GRID_BYTES) * GRID_BYTES,
            "{name}"
        );
    }
}

#[test]
fn recommend_ranks_the_cheaper_driver_work_above_the_lower_peak() {
    let r = recommend(&story(), 0, Some(CAP), &mut |_, _| {}).unwrap();
    assert!(served_all(&r.best));
    // Expandable segments fit with a lower peak, but map and unmap pages all along:
    // more predicted driver time, so ranked below the best.
    let spec = ModelSpec::parse("pytorch@expandable_segments:True").unwrap();
    let expandable =
        session::replay_device(&story(), 0, &spec, Some(CAP), summary_options()).unwrap();
    assert!(served_all(&expandable));
    assert!(expandable.peak_reserved_bytes < r.best.peak_reserved_bytes);
    assert!(expandable.driver.driver_time_us > r.best.driver.driver_time_us);
    assert!(rank(&r.best) < rank(&expandable));
    // The trade-off table is in rank order and starts with the best.
    assert_eq!(r.tradeoffs[0].config, r.best.config);
    for w in r.tradeoffs.windows(2) {
        assert!(rank(&w[0]) <= rank(&w[1]));
    }
    assert!(r.tradeoffs.len() <= TRADEOFF_ROWS);
}

/// What a replay decided, for comparing two of them.
type Outcome = (u64, u64, u64, u64, Option<u64>);

fn outcome(r: &ReplayResult) -> Outcome {
    (
        r.peak_reserved_bytes,
        r.peak_allocated_bytes,
        r.segment_ops,
        (r.driver.driver_time_us * 1000.0).round() as u64,
        r.oom.as_ref().map(|o| o.event_index),
    )
}

#[test]
fn candidates_that_cannot_act_on_the_trace_share_a_replay_and_it_is_theirs() {
    let t = story();
    for capacity in [None, Some(CAP)] {
        // Every candidate replayed on its own: candidates of one effect decide alike.
        let mut seen: Vec<(Effect, Outcome)> = Vec::new();
        let mut twins = 0;
        for (conf, _, e, o) in each_candidate_alone(&t, 0, capacity) {
            match seen.iter().find(|(x, _)| *x == e) {
                Some((_, first)) => {
                    assert_eq!(*first, o, "{conf} at {capacity:?}");
                    twins += 1;
                }
                None => seen.push((e, o)),
            }
        }
        // Without a capacity the GC thresholds cannot act (with one, every setting
        // acts on oom-story: its segments are over 1 GiB, its sizes round apart).
        assert_eq!(twins > 0, capacity.is_none(), "{capacity:?}");
    }
    // Without a capacity every GC candidate shares its twin's replay.
    let r = recommend(&t, 0, None, &mut |_, _| {}).unwrap();
    assert_eq!(r.candidates_tried, 168);
    assert!(
        r.candidates_replayed <= 168 / 3,
        "{}",
        r.candidates_replayed
    );
}

#[test]
fn a_gc_threshold_the_twin_never_crosses_decides_as_the_twin() {
    let t = story();
    for (plain, gc) in [
        ("max_split_size_mb:64", "0.8"),
        ("expandable_segments:True", "0.6"),
        ("", "0.8"),
    ] {
        let twin_conf = plain.to_string();
        let gc_conf = if plain.is_empty() {
            format!("garbage_collection_threshold:{gc}")
        } else {
            format!("{plain},garbage_collection_threshold:{gc}")
        };
        let run = |conf: &str| {
            let spec = ModelSpec::with_config(AllocatorKind::Pytorch, conf);
            session::replay_device(&t, 0, &spec, Some(CAP), summary_options()).unwrap()
        };
        let twin = run(&twin_conf);
        let with_gc = run(&gc_conf);
        let threshold: f64 = gc.parse().unwrap();
        if twin.peak_reserved_bytes as f64 <= threshold * CAP as f64 {
            assert_eq!(outcome(&twin), outcome(&with_gc), "{gc_conf}");
        }
    }
}

#[test]
fn recommend_sweeps_168_configs_and_finds_one_that_fits() {
    assert_eq!(recommend_candidates().len(), 168);
    let r = recommend(&story(), 0, Some(CAP), &mut |_, _| {}).unwrap();
    assert!(!fits(&r.default));
    assert!(served_all(&r.best), "{:?}", r.best.oom);
    assert_eq!(r.candidates_tried, 168);
    let e = r.default.oom.unwrap().explanation;
    assert!(
        e.contains(&format!(
            "would have fit: pytorch@{} (one of",
            r.best.config
        )),
        "{e}"
    );
    // Ties are broken by fewer segment ops, then the shorter config.
    assert!(r.candidates_fitting > 1);
}

#[test]
fn divisions_that_round_every_request_alike_share_a_replay_and_it_is_theirs() {
    // multistream_pub: several `roundup_power2_divisions` round its requests to the same
    // sizes, so they share a replay (keyed by the rounded sizes, not the config array);
    // every candidate replayed on its own decides as the one replayed for its effect.
    let bytes = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/traces/multistream_pub.pickle.gz"
    ))
    .expect("a trace of the repository");
    let trace = session::load(&bytes, None).expect("loads").trace;
    let device = trace.busiest_device();
    let mut seen: Vec<(Effect, Outcome, [u32; 16])> = Vec::new();
    let mut merged_divisions = 0;
    for (conf, cfg, e, o) in each_candidate_alone(&trace, device, None) {
        match seen.iter().find(|(x, ..)| *x == e) {
            Some((_, first, divisions)) => {
                assert_eq!(*first, o, "{conf}");
                // Two division settings that round some request apart from no divisions
                // (the old key, the config array, kept these apart).
                if *divisions != cfg.roundup_power2_divisions && e.rounded.is_some() {
                    merged_divisions += 1;
                }
            }
            None => seen.push((e, o, cfg.roundup_power2_divisions)),
        }
    }
    assert!(
        merged_divisions > 0,
        "no two division settings shared a replay"
    );
    let r = recommend(&trace, device, None, &mut |_, _| {}).unwrap();
    assert_eq!(r.candidates_replayed, seen.len());
}

/// A [`Sweep`] given `R`'s of its batches' settings, each replayed on its own; the named
/// batch's size (the rows replayed under their own name) beside the answer.
fn sweep_alone<R: Swept>(
    t: &Trace,
    device: usize,
    capacity: Option<u64>,
    keep: impl Fn(ReplayResult) -> R,
) -> (Recommendation<R>, usize) {
    let mut sweep: Sweep<R> = Sweep::new(t, device, capacity).unwrap();
    let mut named = 0;
    for b in 0.. {
        let specs = sweep.next_batch();
        if specs.is_empty() {
            break;
        }
        if b > 0 {
            named += specs.len();
        }
        let results = specs
            .iter()
            .map(|s| {
                keep(session::replay_device(t, device, s, capacity, summary_options()).unwrap())
            })
            .collect();
        sweep.give(results).unwrap();
    }
    (sweep.finish().unwrap(), named)
}

#[test]
fn a_sweep_that_keeps_what_replays_decided_names_its_rows_without_replaying_them() {
    // The browser's sweep keeps `SweptReplay`s: a trade-off row whose own replay is not
    // held is its effect's replay renamed, and the answer is the one `recommend` gets by
    // replaying those rows under their own names.
    let bytes = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/traces/multistream_pub.pickle.gz"
    ))
    .expect("a trace of the repository");
    let multistream = session::load(&bytes, None).expect("loads").trace;
    let busiest = multistream.busiest_device();
    let mut renamed = 0;
    for (t, device, capacity) in [
        (story(), 0, Some(CAP)),
        (story(), 0, None),
        (multistream.clone(), busiest, None),
    ] {
        let (full, replayed) = sweep_alone(&t, device, capacity, |r| r);
        let (kept, none) = sweep_alone(&t, device, capacity, |r| SweptReplay::from(&r));
        assert_eq!(none, 0, "{capacity:?}");
        renamed += replayed;
        let swept = |rs: &[ReplayResult]| rs.iter().map(SweptReplay::from).collect::<Vec<_>>();
        assert_eq!(kept.tradeoffs, swept(&full.tradeoffs), "{capacity:?}");
        assert_eq!(kept.best, SweptReplay::from(&full.best));
        assert_eq!(kept.default, SweptReplay::from(&full.default));
        assert_eq!(
            (
                kept.candidates_tried,
                kept.candidates_replayed,
                kept.candidates_fitting
            ),
            (
                full.candidates_tried,
                full.candidates_replayed,
                full.candidates_fitting
            )
        );
        // And the CLI's own path gives the same answer.
        let cli = recommend(&t, device, capacity, &mut |_, _| {}).unwrap();
        assert_eq!(swept(&cli.tradeoffs), swept(&full.tradeoffs));
    }
    assert!(
        renamed > 0,
        "no trade-off row was replayed under its own name"
    );
}
