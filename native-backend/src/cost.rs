//! Measures the latencies of core's driver cost table ([`allocsim_core::cost`]) on a GPU:
//! `cuMemAlloc` and `cuMemFree` by size, and per page of an expandable segment
//! `cuMemCreate` + `cuMemMap` + `cuMemSetAccess` and `cuMemUnmap` + `cuMemRelease`
//! (`allocsim cuda-cost-table`). Each figure is the median of the repetitions; a size the
//! device cannot hold is left out.

use std::time::Instant;

use crate::gpu::{DeviceInfo, Gpu, GpuError};

/// The median latency of one operation at one size.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Sample {
    pub bytes: u64,
    /// Median, microseconds.
    pub us: f64,
    /// Smallest and largest of the repetitions.
    pub min_us: f64,
    pub max_us: f64,
}

/// The figures of a cost table, measured.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Measurement {
    pub device: DeviceInfo,
    pub repetitions: usize,
    pub malloc_us: Vec<Sample>,
    pub free_us: Vec<Sample>,
    pub map_page_us: Vec<Sample>,
    pub unmap_page_us: Vec<Sample>,
}

/// The sizes measured by default: the segment sizes PyTorch asks for most (2 MiB small
/// segments, 20 MiB large ones) up to large single tensors.
pub const SIZES: [u64; 5] = [2 << 20, 20 << 20, 256 << 20, 1 << 30, 4 << 30];
/// The expandable-segment pages: small pool 2 MiB, large pool 20 MiB.
pub const PAGES: [u64; 2] = [2 << 20, 20 << 20];

fn sample(bytes: u64, mut times: Vec<f64>) -> Sample {
    times.sort_by(f64::total_cmp);
    Sample {
        bytes,
        us: times[times.len() / 2],
        min_us: times[0],
        max_us: times[times.len() - 1],
    }
}

fn micros(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

/// Times `repetitions` (≥ 1) allocations and frees of each of `sizes`, and mappings and
/// unmappings of each of `pages`, on `gpu`. Everything taken is given back before it
/// returns, also on error.
pub fn measure(
    gpu: &mut dyn Gpu,
    sizes: &[u64],
    pages: &[u64],
    repetitions: usize,
) -> Result<Measurement, GpuError> {
    let reps = repetitions.max(1);
    let (free, _) = gpu.mem_get_info()?;
    let (mut malloc_us, mut free_us) = (Vec::new(), Vec::new());
    for &bytes in sizes.iter().filter(|&&b| b < free / 2) {
        let (mut a, mut f) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
        for _ in 0..reps {
            let t = Instant::now();
            let ptr = gpu.alloc(bytes)?;
            a.push(micros(t));
            let t = Instant::now();
            gpu.free(ptr)?;
            f.push(micros(t));
        }
        malloc_us.push(sample(bytes, a));
        free_us.push(sample(bytes, f));
    }
    let granularity = gpu.granularity().max(1);
    let (mut map_us, mut unmap_us) = (Vec::new(), Vec::new());
    for &page in pages
        .iter()
        .filter(|&&p| p % granularity == 0 && p < free / 2)
    {
        let base = gpu.reserve(page, granularity)?;
        let (mut m, mut u) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
        let mut run = || -> Result<(), GpuError> {
            for _ in 0..reps {
                let t = Instant::now();
                let h = gpu.create(page)?;
                if let Err(e) = gpu
                    .map(base, page, h)
                    .and_then(|()| gpu.set_access(base, page))
                {
                    let _ = gpu.unmap(base, page);
                    let _ = gpu.release(h);
                    return Err(e);
                }
                m.push(micros(t));
                let t = Instant::now();
                gpu.unmap(base, page)?;
                gpu.release(h)?;
                u.push(micros(t));
            }
            Ok(())
        };
        let result = run();
        gpu.address_free(base, page)?;
        result?;
        map_us.push(sample(page, m));
        unmap_us.push(sample(page, u));
    }
    Ok(Measurement {
        device: gpu.info().clone(),
        repetitions: reps,
        malloc_us,
        free_us,
        map_page_us: map_us,
        unmap_page_us: unmap_us,
    })
}

impl Measurement {
    /// The figures as the body of a `CostTable` constant for core/src/cost.rs.
    #[must_use]
    pub fn as_rust(&self) -> String {
        let list = |v: &[Sample]| {
            v.iter()
                .map(|s| format!("({}, {:.1})", s.bytes, s.us))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "measured_on: \"{}\",\nmalloc_us: &[{}],\nfree_us: &[{}],\nmap_page_us: &[{}],\nunmap_page_us: &[{}],",
            self.device.name,
            list(&self.malloc_us),
            list(&self.free_us),
            list(&self.map_page_us),
            list(&self.unmap_page_us)
        )
    }
}
