//! `allocsim cuda-cost-table [--device N] [--repetitions N] [--json]`: measures on a real
//! GPU the driver latencies of the cost table replays predict driver time from
//! (`allocsim_core::cost`), and prints them as that table's figures. Exit 3 where there is
//! no CUDA driver or GPU, or in a build without the `cuda` feature.

use super::Failure;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The CUDA device ordinal
    #[arg(long, default_value_t = 0)]
    device: u32,
    /// Repetitions of each size (the median is kept)
    #[arg(long, default_value_t = 20)]
    repetitions: usize,
    /// One JSON object on stdout
    #[arg(long)]
    json: bool,
}

#[cfg(not(feature = "cuda"))]
pub fn run(a: &Args) -> Result<u8, Failure> {
    let _ = (a.device, a.repetitions, a.json);
    Err(Failure::unavailable(
        "cuda-cost-table: this build of allocsim has no CUDA support (cargo feature `cuda`)",
    ))
}

#[cfg(feature = "cuda")]
pub fn run(a: &Args) -> Result<u8, Failure> {
    use allocsim_native::cost;

    let mut gpu =
        allocsim_native::open(a.device).map_err(|u| Failure::unavailable(u.to_string()))?;
    let m = cost::measure(&mut gpu, &cost::SIZES, &cost::PAGES, a.repetitions)
        .map_err(|e| Failure::unavailable(format!("cuda-cost-table: {e}")))?;
    if a.json {
        super::print_json(&serde_json::json!({
            "schema": 1,
            "measurement": m,
        }));
        return Ok(0);
    }
    crate::say!(
        "{} ({} repetitions each; medians in µs)",
        m.device.name,
        m.repetitions
    );
    let row = |what: &str, v: &[cost::Sample]| {
        for s in v {
            crate::say!(
                "  {what:<22} {:>12}  {:>9.1}  (min {:.1}, max {:.1})",
                allocsim_core::units::format_size(s.bytes),
                s.us,
                s.min_us,
                s.max_us
            );
        }
    };
    row("cuMemAlloc", &m.malloc_us);
    row("cuMemFree", &m.free_us);
    row("map one page", &m.map_page_us);
    row("unmap one page", &m.unmap_page_us);
    crate::say!();
    crate::say!("As core/src/cost.rs figures:");
    crate::say!("{}", m.as_rust());
    Ok(0)
}
