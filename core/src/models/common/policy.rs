//! One [`Allocator`] implementation for every model built on the [`Arena`]: a model says
//! only what is its own — where a request goes ([`ArenaPolicy::find`], growing from the
//! device as it must), where a freed block goes ([`ArenaPolicy::put_back`]), what
//! `empty_cache` releases, which free neighbours may stay apart and which further
//! invariants hold — and the generic impl does the rest the same way for all: allocating
//! the found block, the two-step free, the stats, the layout, the checks, the copy, and
//! the `oom` event with its [`OomInfo`], built here and nowhere else.

use super::arena::{Arena, Block};
use super::rounding::MAX_REQUEST_BYTES;
use crate::device::Device;
use crate::models::{
    AllocRequest, Allocator, AllocatorKind, Layout, ModelError, ModelEvent, ModelStats, OomInfo,
};
use crate::snapshot::Action;

/// Why a model could not serve a request: what its [`OomInfo`] says beyond the model's
/// totals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The request as the model rounded it ([`OomInfo::rounded_bytes`]).
    pub rounded_bytes: u64,
    /// The size the `oom` trace event carries (the rounded size unless the model records
    /// the request as asked).
    pub event_bytes: u64,
    /// Bytes the model would have asked the device for ([`OomInfo::alloc_bytes`]).
    pub alloc_bytes: u64,
    /// Whether the model's free blocks could have served such a request at all; if not,
    /// the report counts none of them (a cudaMalloc of its own, an empty bin).
    pub free_blocks_usable: bool,
    /// Why, in the model's own terms.
    pub reason: String,
}

impl Refusal {
    /// A refusal of a request rounded to `rounded_bytes` that needed `alloc_bytes` more.
    #[must_use]
    pub fn new(rounded_bytes: u64, alloc_bytes: u64, reason: String) -> Refusal {
        Refusal {
            rounded_bytes,
            event_bytes: rounded_bytes,
            alloc_bytes,
            free_blocks_usable: true,
            reason,
        }
    }

    /// The `oom` event carries `bytes` instead of the rounded size.
    #[must_use]
    pub fn with_event_bytes(mut self, bytes: u64) -> Refusal {
        self.event_bytes = bytes;
        self
    }

    /// No free block of the model could have served the request.
    #[must_use]
    pub fn without_usable_free_blocks(mut self) -> Refusal {
        self.free_blocks_usable = false;
        self
    }
}

/// The accessors every arena model writes alike, inside its `impl ArenaPolicy`: its
/// `arena` field, and with `cfg` its config's canonical string (`self.cfg.canonical()`).
macro_rules! arena_accessors {
    () => {
        fn arena(&self) -> &$crate::models::common::arena::Arena {
            &self.arena
        }

        fn arena_mut(&mut self) -> &mut $crate::models::common::arena::Arena {
            &mut self.arena
        }
    };
    ($cfg:ident) => {
        $crate::models::common::policy::arena_accessors!();

        fn canonical_config(&self) -> String {
            self.$cfg.canonical()
        }
    };
}
pub(crate) use arena_accessors;

/// What an arena model decides; [`Allocator`] follows from it (`impl<P: ArenaPolicy>
/// Allocator for P`). Object safety is the [`Allocator`]'s: this trait is only ever used
/// through its generic impl.
pub trait ArenaPolicy: Clone + Send + 'static {
    /// Which model this is (its name in the CLI and the JSON).
    const KIND: AllocatorKind;

    /// The model's arena.
    fn arena(&self) -> &Arena;

    /// The model's arena, mutable.
    fn arena_mut(&mut self) -> &mut Arena;

    /// The effective configuration as a canonical `key:value,…` string (empty: defaults;
    /// the default: a model without a config).
    fn canonical_config(&self) -> String {
        String::new()
    }

    /// Find and grow: a free block for `req`, already out of the free index and cut to
    /// the size the model hands out (asking the device for more as the model does), or
    /// why there is none. Mark implementations `#[inline]`: the generic `malloc` is the
    /// only caller, and a separate call costs ~1 % of a replay's instructions.
    fn find(
        &mut self,
        dev: &mut dyn Device,
        req: &AllocRequest,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u32, Refusal>;

    /// Put back: block `i` was just freed (`Free`, neither merged nor indexed).
    fn put_back(&mut self, dev: &mut dyn Device, i: u32, out: &mut Vec<ModelEvent>);

    /// `torch.cuda.empty_cache()`: what the model gives back to the device (default:
    /// nothing).
    fn release_cached(&mut self, dev: &mut dyn Device, out: &mut Vec<ModelEvent>) {
        let _ = (dev, out);
    }

    /// Whether free neighbours `a` < `b` may stay unmerged under the model's rules
    /// (default: never — every free block merges with its free neighbours).
    fn adjacent_free_ok(&self, a: &Block, b: &Block) -> bool {
        let _ = (a, b);
        false
    }

    /// Extra checks: the model's own invariants beyond the arena's.
    fn check_policy(&self) -> Result<(), String> {
        Ok(())
    }

    /// Current totals (default: the arena's, over all free blocks).
    fn totals(&self) -> ModelStats {
        self.arena().stats()
    }
}

impl<P: ArenaPolicy> Allocator for P {
    fn name(&self) -> &'static str {
        P::KIND.name()
    }

    fn kind(&self) -> Option<AllocatorKind> {
        Some(P::KIND)
    }

    fn config_string(&self) -> String {
        self.canonical_config()
    }

    fn malloc(
        &mut self,
        dev: &mut dyn Device,
        req: &AllocRequest,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u64, OomInfo> {
        let found = if req.size_bytes > MAX_REQUEST_BYTES {
            Err(Refusal {
                rounded_bytes: req.size_bytes,
                event_bytes: req.size_bytes,
                alloc_bytes: req.size_bytes,
                free_blocks_usable: false,
                reason: too_large(req.size_bytes),
            })
        } else {
            self.find(dev, req, out)
        };
        match found {
            Ok(i) => {
                let arena = self.arena_mut();
                arena.allocate(i, req.size_bytes, req.stream, out);
                Ok(arena.b(i).addr)
            }
            Err(r) => {
                out.push(ModelEvent {
                    action: Action::Oom,
                    addr: dev.free_bytes(),
                    size: r.event_bytes,
                    stream: req.stream,
                });
                Err(oom_info(self, r))
            }
        }
    }

    fn free(
        &mut self,
        dev: &mut dyn Device,
        addr: u64,
        deferred: bool,
        out: &mut Vec<ModelEvent>,
    ) -> Result<(), ModelError> {
        if let Some(i) = self.arena_mut().release(addr, deferred, out)? {
            self.put_back(dev, i, out);
        }
        Ok(())
    }

    fn complete_free(
        &mut self,
        dev: &mut dyn Device,
        addr: u64,
        out: &mut Vec<ModelEvent>,
    ) -> Result<(), ModelError> {
        let i = self.arena_mut().complete(addr, out)?;
        self.put_back(dev, i, out);
        Ok(())
    }

    fn empty_cache(&mut self, dev: &mut dyn Device, out: &mut Vec<ModelEvent>) {
        self.release_cached(dev, out);
    }

    fn stats(&self) -> ModelStats {
        self.totals()
    }

    fn layout(&self) -> Layout {
        self.arena().layout()
    }

    fn check_invariants(&self) -> Result<(), String> {
        self.arena().check(|a, b| self.adjacent_free_ok(a, b))?;
        self.check_policy()
    }

    fn clone_box(&self) -> Box<dyn Allocator> {
        Box::new(self.clone())
    }
}

/// Why a request above [`MAX_REQUEST_BYTES`] is refused.
#[cold]
#[must_use]
pub fn too_large(size: u64) -> String {
    format!(
        "no device can serve a request of {size} bytes (the largest any model serves is {})",
        crate::units::format_size(MAX_REQUEST_BYTES)
    )
}

/// The one place an arena model's [`OomInfo`] is built: the refusal plus the totals.
#[cold]
fn oom_info<P: ArenaPolicy>(model: &P, r: Refusal) -> OomInfo {
    let st = model.totals();
    let usable = r.free_blocks_usable;
    OomInfo {
        rounded_bytes: r.rounded_bytes,
        alloc_bytes: r.alloc_bytes,
        reserved_bytes: st.reserved_bytes,
        allocated_bytes: st.allocated_bytes,
        largest_free_bytes: if usable { st.largest_free_bytes } else { 0 },
        free_holes: if usable { st.free_holes } else { 0 },
        pool_free_bytes: if usable {
            model.arena().free_bytes()
        } else {
            0
        },
        reason: r.reason,
    }
}
