//! The CUDA device on a real GPU. Where there is none (CI) every test prints
//! `skipped: <reason>` and returns; on the GPU machine they run for real.
//!
//! Memory is measured with `cuMemGetInfo` through a second handle on the same primary
//! context (the "witness"): it keeps the context alive, so memory only comes back if our
//! code gives it back — the driver's clean-up at context destruction cannot hide a leak.
//! The tests hold one lock, so no two measure the GPU at the same time.

#![allow(clippy::many_single_char_names)]
// short names (r, o, a, p, v) read best in these tests
// Without the `cuda` feature no GPU value can exist: everything after the probe is dead
// code there (and every test prints `skipped: …`).
#![cfg_attr(
    not(feature = "cuda"),
    allow(
        unreachable_code,
        unused_variables,
        unused_mut,
        clippy::diverging_sub_expression
    )
)]

mod common;

use std::sync::{Arc, Mutex, MutexGuard};

use allocsim_core::device::Device;
use allocsim_core::models::{AllocatorKind, ModelSpec};
use allocsim_native::device::CudaDevice;
use allocsim_native::gpu::Gpu;
use allocsim_native::replay::{NoObserver, Observer, Sample};
use allocsim_native::{CudaReplayOptions, Message, Mode, SystemGpu, cuda_replay, open, spawn_live};
use common::{MIB, growing_trace, small_training_trace};

static GPU_LOCK: Mutex<()> = Mutex::new(());

/// The lock and a witness handle on device 0, or None after printing why it is skipped.
fn gpu_or_skip() -> Option<(MutexGuard<'static, ()>, SystemGpu)> {
    let guard = GPU_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match open(0) {
        Ok(g) => Some((guard, g)),
        Err(u) => {
            println!("skipped: {}", u.reason);
            None
        }
    }
}

fn free_now(witness: &SystemGpu) -> u64 {
    witness.mem_get_info().unwrap().0
}

fn opts(mode: Mode, spec: ModelSpec) -> CudaReplayOptions {
    CudaReplayOptions {
        mode,
        spec,
        capacity_bytes: None,
        balloon_free_bytes: None,
        verify_data: true,
        trace_device: 0,
    }
}

fn plain() -> ModelSpec {
    ModelSpec::parse("pytorch").unwrap()
}

fn expandable() -> ModelSpec {
    ModelSpec::with_config(AllocatorKind::Pytorch, "expandable_segments:True")
}

#[test]
fn cuda_alloc_free_and_data_round_trip() {
    let Some((_lock, witness)) = gpu_or_skip() else {
        return;
    };
    println!(
        "device: {:?}, granularity {}",
        witness.info(),
        witness.granularity()
    );
    let before = free_now(&witness);
    let mut dev = CudaDevice::new(open(0).unwrap(), None);
    let a = dev.malloc(64 * MIB, 0).unwrap();
    let b = dev.malloc(MIB + 1, 0).unwrap();
    let used = before - free_now(&witness);
    println!("64 MiB + (1 MiB + 1 B) segments: cuMemGetInfo says {used} bytes used");
    assert!((66 * MIB..=68 * MIB).contains(&used), "used {used}");
    dev.gpu_mut().fill(a, 64 * MIB, 0xDEAD_BEEF).unwrap();
    dev.gpu_mut().fill(b, MIB + 1, 0x0102_0304).unwrap();
    let mut buf = vec![0u8; 8];
    dev.gpu_mut().read(a + 64 * MIB - 8, &mut buf).unwrap();
    assert_eq!(buf, [0xEF, 0xBE, 0xAD, 0xDE, 0xEF, 0xBE, 0xAD, 0xDE]);
    let mut tail = vec![0u8; 5];
    dev.gpu_mut().read(b + MIB - 4, &mut tail).unwrap();
    assert_eq!(
        tail,
        [4, 3, 2, 1, 4],
        "the tail byte past the last whole word is written too"
    );
    dev.free(a, 64 * MIB);
    dev.free(b, MIB + 1);
    assert!(dev.fault().is_none(), "{:?}", dev.fault());
    assert_eq!(free_now(&witness), before);
    assert_eq!(dev.latencies().summary()["alloc"].count, 2);
}

#[test]
fn cuda_vmm_map_unmap_page_by_page() {
    let Some((_lock, witness)) = gpu_or_skip() else {
        return;
    };
    let before = free_now(&witness);
    let mut dev = CudaDevice::new(open(0).unwrap(), None);
    let page = 20 * MIB;
    let base = dev.reserve(50 * page, page, 0).unwrap();
    dev.map(base, 3 * page, 0).unwrap();
    assert!(dev.fault().is_none(), "{:?}", dev.fault());
    assert_eq!(before - free_now(&witness), 3 * page, "three 20 MiB pages");
    // Access was granted: the whole mapped range is writable and reads back.
    dev.gpu_mut().fill(base, 3 * page, 0x5A5A_0001).unwrap();
    let mut buf = vec![0u8; 4];
    dev.gpu_mut().read(base + 3 * page - 4, &mut buf).unwrap();
    assert_eq!(
        u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]),
        0x5A5A_0001
    );
    dev.unmap(base + page, page);
    assert_eq!(
        before - free_now(&witness),
        2 * page,
        "the middle page went back"
    );
    dev.map(base + page, page, 0).unwrap();
    dev.unmap(base, 3 * page);
    assert!(dev.fault().is_none(), "{:?}", dev.fault());
    assert_eq!(free_now(&witness), before);
    dev.release(base, 50 * page);
    assert!(dev.fault().is_none(), "{:?}", dev.fault());
    let l = dev.latencies().summary();
    println!(
        "map p50 {:.1} µs p99 {:.1} µs; unmap p50 {:.1} µs",
        l["map"].p50, l["map"].p99, l["unmap"].p50
    );
    assert_eq!((l["map"].count, l["unmap"].count), (4, 4));
}

#[test]
fn cuda_balloon_makes_the_driver_refuse() {
    let Some((_lock, witness)) = gpu_or_skip() else {
        return;
    };
    let before = free_now(&witness);
    let mut dev = CudaDevice::new(open(0).unwrap(), None);
    let left = dev.inflate_balloon(256 * MIB).unwrap();
    println!(
        "balloon of {} bytes left {left} bytes free (asked 256 MiB)",
        dev.balloon_bytes()
    );
    assert!((256 * MIB..258 * MIB).contains(&left), "left {left}");
    dev.malloc(200 * MIB, 0).unwrap();
    assert!(dev.malloc(100 * MIB, 0).is_err(), "56 MiB are left");
    assert_eq!(dev.driver_refusals(), 1);
    let base = dev.reserve(10 * 20 * MIB, 20 * MIB, 0).unwrap();
    assert!(
        dev.map(base, 60 * MIB, 0).is_err(),
        "three pages do not fit either"
    );
    assert_eq!(dev.driver_refusals(), 2);
    dev.map(base, 40 * MIB, 0).unwrap();
    assert!(dev.fault().is_none(), "{:?}", dev.fault());
    drop(dev);
    assert_eq!(
        free_now(&witness),
        before,
        "balloon, segment and pages all given back"
    );
}

struct PanicAfter(u64);

impl Observer for PanicAfter {
    fn sample(&mut self, s: &Sample) {
        assert!(s.op < self.0, "planned panic at op {}", s.op);
    }
}

#[test]
fn cuda_no_leak_after_a_panic() {
    let Some((_lock, witness)) = gpu_or_skip() else {
        return;
    };
    let before = free_now(&witness);
    let trace = small_training_trace();
    for spec in [plain(), expandable()] {
        let o = CudaReplayOptions {
            balloon_free_bytes: Some(8 << 30),
            ..opts(Mode::Model, spec.clone())
        };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            cuda_replay(open(0).unwrap(), &trace, &o, &mut PanicAfter(20))
        }));
        assert!(
            r.is_err(),
            "{}: the observer panicked mid-replay",
            spec.label()
        );
        assert_eq!(
            free_now(&witness),
            before,
            "{}: memory held at the panic was given back",
            spec.label()
        );
    }
}

#[test]
fn cuda_replay_agrees_with_the_model_and_the_data_check_passes() {
    let Some((_lock, witness)) = gpu_or_skip() else {
        return;
    };
    let before = free_now(&witness);
    let trace = small_training_trace();
    for spec in [plain(), expandable()] {
        let r = cuda_replay(
            open(0).unwrap(),
            &trace,
            &opts(Mode::Model, spec.clone()),
            &mut NoObserver,
        )
        .unwrap();
        println!("{}: {}", spec.label(), serde_json::to_string(&r).unwrap());
        let a = &r.reserved_agreement;
        assert!(a.events_compared > 4);
        assert_eq!(a.events_equal, a.events_compared, "{}: {a:?}", spec.label());
        assert_eq!(r.verify_data.as_ref().unwrap().mismatches, 0);
        assert!(r.verify_data.as_ref().unwrap().blocks_checked > 0);
        assert_eq!(r.leaked_bytes, 0, "{}", spec.label());
    }
    let r = cuda_replay(
        open(0).unwrap(),
        &trace,
        &opts(Mode::Raw, plain()),
        &mut NoObserver,
    )
    .unwrap();
    println!("raw: {}", serde_json::to_string(&r).unwrap());
    assert_eq!(r.verify_data.as_ref().unwrap().mismatches, 0);
    assert_eq!(free_now(&witness), before);
}

#[test]
fn cuda_balloon_replay_refuses_where_the_simulation_does() {
    let Some((_lock, witness)) = gpu_or_skip() else {
        return;
    };
    let before = free_now(&witness);
    for spec in [plain(), expandable()] {
        let o = CudaReplayOptions {
            balloon_free_bytes: Some(100 * MIB),
            ..opts(Mode::Model, spec.clone())
        };
        let r = cuda_replay(open(0).unwrap(), &growing_trace(8), &o, &mut NoObserver).unwrap();
        println!(
            "{}: balloon left {:?}, oom {:?}, first refusal {:?}, driver refusal {:?}, notes {:?}",
            spec.label(),
            r.balloon_free_bytes,
            r.oom,
            r.first_refusal,
            r.driver_refusal,
            r.notes
        );
        let (real, sim) = (r.oom.real_event_index, r.oom.simulated_event_index);
        // 98 MiB usable: three 30 MiB segments fit; as expandable segments the third block
        // needs a fifth 20 MiB page (100 MiB), which does not.
        let expected = if spec.config.is_some() { 2 } else { 3 };
        assert_eq!(sim, Some(expected), "{}", spec.label());
        assert_eq!(real, sim, "{}: {:?}", spec.label(), r.driver_refusal);
        // Measured behind the balloon: within a few pages of what it left.
        let left = r.balloon_free_bytes.unwrap();
        assert!(
            r.simulated_limit_bytes <= left && r.simulated_limit_bytes + 8 * MIB >= left,
            "{} of {left}",
            r.simulated_limit_bytes
        );
    }
    assert_eq!(free_now(&witness), before);
}

/// How much of what `cuMemGetInfo` calls free the driver really hands out, per kind of
/// call: fills the GPU down to `leave` bytes, probes the usable memory, then takes
/// `step`-sized pieces until the driver refuses. Returns (free before, probed usable bytes,
/// bytes obtained, free at the refusal).
fn take_until_refused(leave: u64, step: u64, vmm: bool) -> (u64, u64, u64, u64) {
    let mut dev = CudaDevice::new(open(0).unwrap(), None);
    let free = dev.inflate_balloon(leave).unwrap();
    let usable = dev.probe_usable_bytes().unwrap();
    let mut got = 0;
    if vmm {
        let base = dev.reserve(4096 * step, step, 0).unwrap();
        while got < 4096 * step && dev.map(base + got, step, 0).is_ok() {
            got += step;
        }
    } else {
        while dev.malloc(step, 0).is_ok() {
            got += step;
        }
    }
    assert!(dev.fault().is_none(), "{:?}", dev.fault());
    let at_refusal = dev.first_refusal().map_or(0, |r| r.free_bytes);
    (free, usable, got, at_refusal)
}

#[test]
fn cuda_driver_usable_memory_is_what_the_probe_measures() {
    let Some((_lock, witness)) = gpu_or_skip() else {
        return;
    };
    let before = free_now(&witness);
    let mut table = Vec::new();
    for leave in [100 * MIB, 101 * MIB, 102 * MIB, 103 * MIB, 1024 * MIB] {
        for (step, vmm) in [
            (2 * MIB, false),
            (20 * MIB, false),
            (2 * MIB, true),
            (20 * MIB, true),
        ] {
            let (free, usable, got, left) = take_until_refused(leave, step, vmm);
            println!(
                "headroom: balloon left {free} B free; probe {usable} B (kept back {} B); {} of {} MiB: got {got} B, refused with {left} B free",
                free - usable,
                if vmm {
                    "cuMemCreate+cuMemMap"
                } else {
                    "cuMemAlloc"
                },
                step / MIB,
            );
            table.push((leave, step, vmm, usable, got));
        }
    }
    // The probe's measure is what the driver hands out in any page size, by either kind
    // of call (checked after printing the whole table).
    for (leave, step, vmm, usable, got) in table {
        assert_eq!(
            got,
            usable / step * step,
            "leave {leave}, step {step}, vmm {vmm}"
        );
    }
    assert_eq!(free_now(&witness), before);
}

#[test]
fn cuda_live_runner_headless() {
    let Some((_lock, witness)) = gpu_or_skip() else {
        return;
    };
    let before = free_now(&witness);
    let runner = spawn_live(
        0,
        Arc::new(small_training_trace()),
        opts(Mode::Model, expandable()),
    )
    .unwrap();
    let msgs = runner.wait();
    let Some(Message::Started { device, .. }) = msgs.first() else {
        panic!("{:?}", msgs.first())
    };
    println!("live runner on {}: {} messages", device.name, msgs.len());
    assert_eq!(device.name, witness.info().name);
    assert!(
        msgs.iter()
            .any(|m| matches!(m, Message::Sample(s) if s.real_used_bytes > 0))
    );
    let Some(Message::Done(r)) = msgs.last() else {
        panic!("{:?}", msgs.last())
    };
    assert_eq!(
        r.reserved_agreement.events_equal,
        r.reserved_agreement.events_compared
    );
    assert_eq!(free_now(&witness), before);
}

#[test]
fn cuda_cost_table_is_measured_and_nothing_is_left_behind() {
    let Some((_lock, witness)) = gpu_or_skip() else {
        return;
    };
    let before = free_now(&witness);
    // The measuring handle is closed before the witness looks.
    let m = {
        let mut gpu = open(0).unwrap();
        allocsim_native::cost::measure(
            &mut gpu,
            &allocsim_native::cost::SIZES,
            &allocsim_native::cost::PAGES,
            5,
        )
        .unwrap()
    };
    println!("{}", m.as_rust());
    assert_eq!(m.malloc_us.len(), allocsim_native::cost::SIZES.len());
    assert_eq!(m.map_page_us.len(), 2);
    // Real driver calls take time; none takes a second.
    for s in m.malloc_us.iter().chain(&m.free_us).chain(&m.map_page_us) {
        assert!(s.us > 0.0 && s.max_us < 1e6, "{s:?}");
    }
    assert_eq!(
        free_now(&witness),
        before,
        "everything measured was given back"
    );
}
