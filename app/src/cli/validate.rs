//! `allocsim validate FILE [--capacity SIZE] [--json]`.

use allocsim_core::models::pytorch::PyTorchConfig;
use allocsim_core::trace::SnapshotInfo;
use allocsim_core::units::format_size;
use allocsim_core::validate::{DeviceReport, Divergence, Validation};
use serde_json::{Value, json};

use super::{EXIT_DIVERGED, Failure, Input, load_input, parse_size_arg, print_json};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub(super) input: Input,
    /// The per-process memory cap the program ran under (`set_per_process_memory_fraction`), e.g. 2.2GiB
    #[arg(long, value_parser = parse_size_arg, allow_hyphen_values = true)]
    capacity: Option<u64>,
    /// One JSON object on stdout
    #[arg(long)]
    json: bool,
}

fn divergence_json(d: &Divergence) -> Value {
    json!({
        "device": d.device,
        "event_index": d.event_index,
        "recorded": d.recorded,
        "simulated": d.simulated,
        "context": d.context,
    })
}

fn device_json(r: &DeviceReport) -> Value {
    json!({
        "device": r.device,
        "exact": r.exact,
        "events_compared": r.events_compared,
        "events_matched": r.events_matched,
        "end_state_matches": r.end_state_matches,
        "end_state_difference": r.end_state_difference,
        "first_divergence": r.first_divergence.as_ref().map(divergence_json),
        "peak_reserved_bytes": {"recorded": r.peak_reserved_recorded, "simulated": r.peak_reserved_simulated},
        "starts_empty": r.starts_empty,
    })
}

/// What the file holds beyond the device state (host memory, annotations, newer keys):
/// core's summary, plus the keys of its config string this build does not know.
fn snapshot_json(s: &SnapshotInfo) -> Value {
    let mut v = serde_json::to_value(s.extras()).unwrap_or(Value::Null);
    if let (Value::Object(m), Ok(cfg)) = (&mut v, PyTorchConfig::from_settings(&s.settings)) {
        m.insert("unknown_config_keys".into(), json!(cfg.unknown_keys));
    }
    v
}

/// The `--json` object of a validation of `file`.
#[must_use]
pub fn json_of(file: &str, v: &Validation) -> Value {
    let compared: u64 = v.devices.iter().map(|d| d.events_compared).sum();
    let matched: u64 = v.devices.iter().map(|d| d.events_matched).sum();
    let end_ok = v.devices.iter().all(|d| d.end_state_matches);
    let first = v.devices.iter().find_map(|d| d.first_divergence.as_ref());
    let peak_rec: u64 = v
        .devices
        .iter()
        .map(|d| d.peak_reserved_recorded)
        .max()
        .unwrap_or(0);
    let peak_sim: u64 = v
        .devices
        .iter()
        .map(|d| d.peak_reserved_simulated)
        .max()
        .unwrap_or(0);
    let mut inferred = serde_json::Map::new();
    for d in &v.devices {
        for i in &d.inferred {
            let list = inferred
                .entry(i.kind.to_string())
                .or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(l) = list {
                l.push(
                    json!({"device": d.device, "event_index": i.event_index, "detail": i.detail}),
                );
            }
        }
    }
    json!({
        "schema": 1,
        "file": file,
        "exact": v.exact(),
        "events_compared": compared,
        "events_matched": matched,
        "end_state_matches": end_ok,
        "first_divergence": first.map(divergence_json),
        "peak_reserved_bytes": {"recorded": peak_rec, "simulated": peak_sim},
        "devices": v.devices.iter().map(device_json).collect::<Vec<_>>(),
        "inferred": inferred,
        "snapshot": snapshot_json(&v.trace.snapshot),
    })
}

/// The validation `a` asks for.
pub fn outcome(a: &Args) -> Result<Validation, Failure> {
    load_input(&a.input.file, a.input.memory.as_ref(), a.capacity)
}

pub fn run(a: &Args) -> Result<u8, Failure> {
    let v = outcome(a)?;
    let exact = v.exact();
    let first = v.devices.iter().find_map(|d| d.first_divergence.as_ref());
    if a.json {
        print_json(&json_of(&a.input.file.display().to_string(), &v));
    } else {
        crate::say!(
            "{}: {}",
            a.input.file.display(),
            if exact { "EXACT" } else { "DIVERGES" }
        );
        crate::say!(
            "{:<8} {:>10} {:>10} {:>10} {:>16} {:>16}",
            "device",
            "compared",
            "matched",
            "end state",
            "peak recorded",
            "peak simulated"
        );
        for d in &v.devices {
            crate::say!(
                "{:<8} {:>10} {:>10} {:>10} {:>16} {:>16}",
                d.device,
                d.events_compared,
                d.events_matched,
                if d.end_state_matches {
                    "equal"
                } else {
                    "differs"
                },
                format_size(d.peak_reserved_recorded),
                format_size(d.peak_reserved_simulated)
            );
            if let Some(diff) = &d.end_state_difference {
                crate::say!("  end state: {diff}");
            }
        }
        if let Some(d) = first {
            crate::say!(
                "first divergence at device {} event {}: {}",
                d.device,
                d.event_index,
                d.context
            );
            crate::say!("  recorded:  {:?}", d.recorded);
            crate::say!("  simulated: {:?}", d.simulated);
        }
        for d in &v.devices {
            for i in &d.inferred {
                crate::say!(
                    "inferred (device {}, event {}): {}",
                    d.device,
                    i.event_index,
                    i.detail
                );
            }
        }
    }
    Ok(if exact { 0 } else { EXIT_DIVERGED })
}
