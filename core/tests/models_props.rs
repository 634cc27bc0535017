//! The shared property suite of every allocator model (STYLE.md rule 11): random
//! alloc/free sequences against a shadow heap. After every step the model's invariants
//! hold, live blocks never overlap and hold their request, blocks tile their segments,
//! the byte counts add up (and reserved memory equals what the device handed out), and
//! the same sequence run twice gives the same addresses, stats and layout.

use std::collections::BTreeMap;

use allocsim_core::device::{Device, SimulatedDevice};
use allocsim_core::models::{AllocRequest, Allocator, LayoutBlockState, ModelSpec, PoolId};
use allocsim_core::snapshot::RawSettings;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

const TOTAL_BYTES: u64 = 64 << 30;
const MIB: u64 = 1 << 20;

/// One generated step.
#[derive(Debug, Clone)]
enum Step {
    Alloc {
        size: u64,
        stream: u64,
    },
    /// Free the live allocation `pick % live`; `deferred`: wait for `Complete`.
    Free {
        pick: usize,
        deferred: bool,
    },
    /// Complete the pending free `pick % pending`.
    Complete {
        pick: usize,
    },
    EmptyCache,
    /// Free an address nothing lives at: must be refused without harm.
    BadFree {
        addr: u64,
    },
}

fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..=4096,
        3 => 4097u64..=(2 * MIB),
        2 => (2 * MIB)..=(40 * MIB),
        1 => prop::sample::select(vec![512, 1 << 20, 2 << 20, 20 << 20, 64 << 20]),
    ]
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        10 => (size_strategy(), 0u64..3).prop_map(|(size, stream)| Step::Alloc { size, stream }),
        7 => (any::<usize>(), prop::bool::weighted(0.15)).prop_map(|(pick, deferred)| Step::Free { pick, deferred }),
        2 => any::<usize>().prop_map(|pick| Step::Complete { pick }),
        1 => Just(Step::EmptyCache),
        1 => (1u64..1 << 40).prop_map(|a| Step::BadFree { addr: a * 256 + 1 }),
    ]
}

fn capacity_strategy() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![
        2 => Just(None),
        1 => Just(Some(64 * MIB)),
        1 => Just(Some(256 * MIB)),
        1 => Just(Some(1200 * MIB)),
    ]
}

/// A live allocation of the shadow heap.
#[derive(Debug, Clone, Copy)]
struct Live {
    size: u64,
    pending: bool,
}

/// What one run produced (compared between two runs of the same input).
#[derive(Debug, PartialEq)]
struct Outcome {
    results: Vec<Option<u64>>,
    stats: Vec<(u64, u64, u64, u64, u64, u64)>,
    layout: String,
}

/// A cache flush synchronises the device (PyTorch's `empty_cache` and its out-of-memory
/// path): pending frees may complete there. Drops the shadow's pending entries the model
/// no longer holds as pending.
fn settle_pending(model: &dyn Allocator, live: &mut BTreeMap<u64, Live>) {
    let pending: std::collections::BTreeSet<u64> = model
        .layout()
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == LayoutBlockState::PendingFree)
        .map(|b| b.addr)
        .collect();
    live.retain(|a, l| !l.pending || pending.contains(a));
}

fn device_used(dev: &SimulatedDevice, cap: Option<u64>) -> u64 {
    cap.unwrap_or(TOTAL_BYTES).min(TOTAL_BYTES) - dev.free_bytes()
}

/// Runs `steps` through the model `spec` names, checking every property after every step.
fn run(spec: &str, steps: &[Step], cap: Option<u64>) -> Result<Outcome, TestCaseError> {
    let spec = ModelSpec::parse(spec).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut model: Box<dyn Allocator> = spec
        .build(&RawSettings::default(), cap)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut dev = SimulatedDevice::new(TOTAL_BYTES, cap);
    let mut out = Vec::new();
    let mut live: BTreeMap<u64, Live> = BTreeMap::new();
    let mut outcome = Outcome {
        results: Vec::new(),
        stats: Vec::new(),
        layout: String::new(),
    };
    for (k, step) in steps.iter().enumerate() {
        out.clear();
        match *step {
            Step::Alloc { size, stream } => {
                let r = model.malloc(
                    &mut dev,
                    &AllocRequest {
                        size_bytes: size,
                        stream,
                        pool: PoolId::DEFAULT,
                    },
                    &mut out,
                );
                settle_pending(model.as_ref(), &mut live);
                match r {
                    Ok(addr) => {
                        let end = addr + size.max(1);
                        if let Some((&a, l)) = live.range(..end).next_back() {
                            prop_assert!(
                                a + l.size.max(1) <= addr,
                                "step {k}: new block {addr:#x}+{size} overlaps live {a:#x}+{}",
                                l.size
                            );
                        }
                        live.insert(
                            addr,
                            Live {
                                size,
                                pending: false,
                            },
                        );
                        outcome.results.push(Some(addr));
                    }
                    Err(info) => {
                        prop_assert!(
                            info.rounded_bytes >= size.min(1),
                            "step {k}: OOM info without a size"
                        );
                        prop_assert!(!info.reason.is_empty());
                        outcome.results.push(None);
                    }
                }
            }
            Step::Free { pick, deferred } => {
                let ready: Vec<u64> = live
                    .iter()
                    .filter(|(_, l)| !l.pending)
                    .map(|(&a, _)| a)
                    .collect();
                if !ready.is_empty() {
                    let a = ready[pick % ready.len()];
                    model
                        .free(&mut dev, a, deferred, &mut out)
                        .map_err(|e| TestCaseError::fail(format!("step {k}: {e}")))?;
                    if deferred {
                        live.get_mut(&a).expect("picked from live").pending = true;
                    } else {
                        live.remove(&a);
                    }
                }
            }
            Step::Complete { pick } => {
                let pending: Vec<u64> = live
                    .iter()
                    .filter(|(_, l)| l.pending)
                    .map(|(&a, _)| a)
                    .collect();
                if !pending.is_empty() {
                    let a = pending[pick % pending.len()];
                    model
                        .complete_free(&mut dev, a, &mut out)
                        .map_err(|e| TestCaseError::fail(format!("step {k}: {e}")))?;
                    live.remove(&a);
                    prop_assert!(
                        model.complete_free(&mut dev, a, &mut out).is_err(),
                        "step {k}: completed twice"
                    );
                }
            }
            Step::EmptyCache => {
                model.empty_cache(&mut dev, &mut out);
                settle_pending(model.as_ref(), &mut live);
            }
            Step::BadFree { addr } => {
                if !live.contains_key(&addr) {
                    prop_assert!(
                        model.free(&mut dev, addr, false, &mut out).is_err(),
                        "step {k}: freed {addr:#x}"
                    );
                }
            }
        }
        model
            .check_invariants()
            .map_err(|e| TestCaseError::fail(format!("step {k} ({step:?}): {e}")))?;
        let st = model.stats();
        let layout = model.layout();
        // Blocks tile segments; segments do not overlap.
        let mut seg_ranges: Vec<(u64, u64)> = Vec::new();
        let mut allocated = 0;
        let mut in_layout: BTreeMap<u64, (u64, LayoutBlockState)> = BTreeMap::new();
        for s in &layout.segments {
            seg_ranges.push((s.addr, s.size_bytes));
            let mut at = s.addr;
            for b in &s.blocks {
                prop_assert_eq!(
                    b.addr,
                    at,
                    "step {}: a gap or overlap in segment {:#x}",
                    k,
                    s.addr
                );
                at += b.size_bytes;
                if b.state == LayoutBlockState::Allocated {
                    allocated += b.size_bytes;
                }
                if matches!(
                    b.state,
                    LayoutBlockState::Allocated | LayoutBlockState::PendingFree
                ) {
                    in_layout.insert(b.addr, (b.size_bytes, b.state));
                }
            }
            prop_assert_eq!(
                at,
                s.addr + s.size_bytes,
                "step {}: blocks do not cover segment {:#x}",
                k,
                s.addr
            );
        }
        seg_ranges.sort_unstable();
        for w in seg_ranges.windows(2) {
            prop_assert!(w[0].0 + w[0].1 <= w[1].0, "step {k}: segments overlap");
        }
        // Every live allocation is a block of the layout, big enough, in the right state.
        prop_assert_eq!(in_layout.len(), live.len(), "step {}: live blocks", k);
        for (a, l) in &live {
            let Some(&(bsize, state)) = in_layout.get(a) else {
                return Err(TestCaseError::fail(format!(
                    "step {k}: live {a:#x} is not in the layout"
                )));
            };
            prop_assert!(
                bsize >= l.size,
                "step {k}: block {a:#x} smaller than its request"
            );
            let want = if l.pending {
                LayoutBlockState::PendingFree
            } else {
                LayoutBlockState::Allocated
            };
            prop_assert_eq!(state, want, "step {}: state of {:#x}", k, a);
        }
        // Byte counts add up.
        let requested: u64 = live.values().map(|l| l.size).sum();
        prop_assert_eq!(st.requested_bytes, requested, "step {}: requested bytes", k);
        prop_assert_eq!(st.allocated_bytes, allocated, "step {}: allocated bytes", k);
        prop_assert!(
            st.reserved_bytes >= st.allocated_bytes,
            "step {k}: reserved < allocated"
        );
        prop_assert_eq!(
            st.reserved_bytes,
            device_used(&dev, cap),
            "step {}: reserved != device memory in use",
            k
        );
        if let Some(c) = cap {
            prop_assert!(st.reserved_bytes <= c, "step {k}: over capacity");
        }
        prop_assert!(
            st.largest_free_bytes <= st.reserved_bytes - st.allocated_bytes,
            "step {k}: largest free > free"
        );
        outcome.stats.push((
            st.reserved_bytes,
            st.allocated_bytes,
            st.requested_bytes,
            st.largest_free_bytes,
            st.free_holes,
            st.segment_ops,
        ));
    }
    outcome.layout = format!("{:?}", model.layout());
    Ok(outcome)
}

fn check(spec: &str, steps: &[Step], cap: Option<u64>) -> Result<(), TestCaseError> {
    let a = run(spec, steps, cap)?;
    let b = run(spec, steps, cap)?;
    prop_assert!(a == b, "{spec}: the same input gave different results");
    Ok(())
}

/// Cases per model: 48, or `PROPTEST_CASES` for a deeper run.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48)
}

/// One property test per model spec.
macro_rules! model_props {
    ($($name:ident => $spec:expr),* $(,)?) => {
        $(
            proptest! {
                #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]
                #[test]
                fn $name(steps in prop::collection::vec(step_strategy(), 1..160), cap in capacity_strategy()) {
                    check($spec, &steps, cap)?;
                }
            }
        )*
    };
}

model_props! {
    pytorch => "pytorch",
    pytorch_expandable => "pytorch@expandable_segments:True",
    pytorch_max_split_gc => "pytorch@max_split_size_mb:32,garbage_collection_threshold:0.6,roundup_power2_divisions:4",
    cuda_malloc => "cuda-malloc",
    bfc => "bfc",
    bfc_prealloc_gc => "bfc@allow_growth:False,garbage_collection:True",
    bfc_gc => "bfc@garbage_collection:True",
    rmm_pool => "rmm-pool",
    rmm_pool_capped => "rmm-pool@initial_pool_size_mb:16,maximum_pool_size_mb:512",
    rmm_arena => "rmm-arena",
    rmm_arena_small => "rmm-arena@arena_size_mb:48",
    rmm_binning => "rmm-binning",
    rmm_binning_small => "rmm-binning@min_size_exponent:9,max_size_exponent:16,blocks_to_preallocate:4",
    buddy => "buddy",
    buddy_small_heaps => "buddy@heap_size_mb:4",
    tlsf => "tlsf",
    tlsf_small_pools => "tlsf@pool_size_mb:4,sli:2",
    vmm_stitch => "vmm-stitch",
}

#[test]
fn every_model_is_covered_by_the_suite() {
    let src = include_str!("models_props.rs");
    for name in allocsim_core::models::MODEL_NAMES {
        assert!(
            src.contains(&format!("=> \"{name}")),
            "{name} has no property test"
        );
    }
}
