//! Per-op digests of every model on every shared trace, under three capacities (none, as
//! recorded, and 3/4 of the PyTorch model's unlimited peak, so every model's OOM path
//! runs): each op's outcome, the events the model emitted, its stats after the op,
//! invariants checked every 64 ops, and the final layout, folded into one FNV-1a hash per
//! (trace, model, capacity) and printed one line each. Two builds replay alike when their
//! outputs are equal (a refactor's evidence).
//!
//! `cargo run --release -p allocsim-tests --bin model_digest [-- DIR]` (default: the
//! shared traces; `ALLOCSIM_TRACES` also names the directory).

use std::fmt::Write as _;

use allocsim_core::capacity::CapacityArg;
use allocsim_core::models::{ModelSpec, kind};
use allocsim_core::replay::{OpStepper, Step};
use allocsim_core::session;

/// FNV-1a over the bytes of what was written into it.
struct Fnv(u64);

impl std::fmt::Write for Fnv {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        for b in s.bytes() {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        Ok(())
    }
}

fn main() -> anyhow::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .or_else(allocsim_tests::traces_dir);
    let Some(dir) = dir else {
        println!("skipped: no trace directory");
        return Ok(());
    };
    let mut files: Vec<_> = std::fs::read_dir(&dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let n = p.to_string_lossy();
            n.ends_with(".pickle.gz") || n.ends_with("_as_json.json")
        })
        .collect();
    files.sort();
    let specs: Vec<ModelSpec> = kind::DEFAULT_COMPARE
        .iter()
        .map(|s| ModelSpec::parse(s).map_err(|e| anyhow::anyhow!("{e}")))
        .collect::<anyhow::Result<_>>()?;
    for path in files {
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let bytes = std::fs::read(&path)?;
        let Ok(v) = session::load(&bytes, None) else {
            println!("{name}: does not load");
            continue;
        };
        for d in 0..v.trace.devices.len() {
            let dt = &v.trace.devices[d];
            let recorded = session::capacity(&v.trace, d, CapacityArg::default()).bytes;
            let peak = session::replay_device(
                &v.trace,
                d,
                &specs[0],
                None,
                allocsim_core::whatif::summary_options(),
            )?
            .peak_reserved_bytes;
            let tight = (peak / 4 * 3) >> 21 << 21;
            for (cap, spec) in [None, recorded, Some(tight.max(2 << 20))]
                .into_iter()
                .flat_map(|c| specs.iter().map(move |s| (c, s)))
            {
                let (mut model, mut dev, preloaded) = session::start_model(&v.trace, d, spec, cap)?;
                let mut stepper = OpStepper::new(dt, preloaded);
                let mut out = Vec::new();
                let mut h = Fnv(0xcbf2_9ce4_8422_2325);
                let mut stopped = None;
                for k in 0..dt.ops.len() {
                    out.clear();
                    let step = stepper.step(dt, k, model.as_mut(), &mut dev, &mut out);
                    let _ = write!(h, "{k}:{step:?}|{out:?}|{:?};", model.stats());
                    if k % 64 == 0 {
                        model
                            .check_invariants()
                            .map_err(|e| anyhow::anyhow!("{name} {}: op {k}: {e}", spec.label()))?;
                    }
                    if matches!(step, Step::Oom { fatal: true, .. }) {
                        stopped = Some(k);
                        break;
                    }
                }
                let _ = write!(h, "{:?}", model.layout());
                println!(
                    "{name} device {d} {} cap {cap:?}: {:016x}{}",
                    spec.label(),
                    h.0,
                    stopped.map_or_else(String::new, |k| format!(" (stopped at op {k})"))
                );
            }
        }
    }
    Ok(())
}
