//! A replay that keeps its outcomes reads what it served an alloc back from them at the
//! alloc's free (`replay::ReplayRun`, the app's and the CLI's replays), where a stepper
//! otherwise keeps its own per-op addresses (`replay::OpStepper`, the sweeps' replays,
//! explain and the CUDA replay). On every trace of the corpus, the repository's and the
//! incoming ones, under no capacity, the capacity as recorded and a tight one (so that
//! the OOM paths run, recorded OOMs the model serves included), each op's outcome is the
//! one a stepper keeping its own addresses gives, and the replay's answer is the one it
//! gives without its outcomes.

use allocsim_core::capacity::CapacityArg;
use allocsim_core::models::ModelSpec;
use allocsim_core::replay::{OpStepper, Outcome, ReplayOptions, Step};
use allocsim_core::session;

#[test]
fn a_replay_reads_what_it_served_from_its_outcomes_as_a_stepper_from_its_addresses() {
    let specs: Vec<ModelSpec> = ["pytorch", "pytorch@expandable_segments:True", "bfc"]
        .iter()
        .map(|s| ModelSpec::parse(s).unwrap())
        .collect();
    let (mut compared, mut tight_ooms) = (0, 0);
    for t in allocsim_tests::corpus()
        .into_iter()
        .chain(allocsim_tests::incoming())
        .chain(allocsim_tests::repo_traces())
    {
        let Ok(v) = session::load(&std::fs::read(&t.path).unwrap(), t.cap_bytes) else {
            continue;
        };
        let d = v.trace.busiest_device();
        let dt = &v.trace.devices[d];
        let recorded = session::capacity(&v.trace, d, CapacityArg::AsRecorded).bytes;
        for spec in &specs {
            let kept = ReplayOptions::default();
            let unlimited = session::replay_device(&v.trace, d, spec, None, kept).unwrap();
            let tight = (unlimited.peak_reserved_bytes / 4 * 3) >> 21 << 21;
            for cap in [None, recorded, Some(tight.max(2 << 20))] {
                let with = session::replay_device(&v.trace, d, spec, cap, kept).unwrap();
                let without = ReplayOptions {
                    keep_timeline: false,
                    ..kept
                };
                let without = session::replay_device(&v.trace, d, spec, cap, without).unwrap();
                let what = format!("{} {} cap {cap:?}", t.name, spec.label());
                assert_eq!(
                    allocsim_tests::replay_summary(&with),
                    allocsim_tests::replay_summary(&without),
                    "{what}"
                );
                // Each op's outcome, against a stepper keeping its own addresses.
                let (mut model, mut dev, preloaded) =
                    session::start_model(&v.trace, d, spec, cap).unwrap();
                let mut stepper = OpStepper::new(dt, preloaded);
                let mut out = Vec::new();
                for k in 0..with.ops_done {
                    out.clear();
                    let want = match stepper.step(dt, k, model.as_mut(), &mut dev, &mut out) {
                        Step::Served(a) => Outcome::Served(a),
                        Step::Oom { .. } => Outcome::Oom,
                        Step::Done => Outcome::None,
                    };
                    assert_eq!(with.outcomes.get(k), Some(want), "{what}: op {k}");
                }
                tight_ooms += usize::from(with.oom.is_some());
                compared += 1;
            }
        }
    }
    assert!(compared >= 60, "{compared} replays compared");
    assert!(tight_ooms >= 20, "{tight_ooms} replays ran out of memory");
}
