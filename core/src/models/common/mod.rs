//! Segment and block bookkeeping shared by every model except `pytorch` (STYLE.md rule 3),
//! one concern per file: [`rounding`] (sizes and the device's page), [`free_key`] (the free
//! index's packed key), [`largest_free`] (the largest free block in O(1)), [`hasher`] (the
//! address hasher), [`arena`] (segments and blocks with address-ordered neighbours, split
//! and merge, the free index, the live map, the counters, the device calls, the layout and
//! a generic invariant check), [`config`] (the `key:value` config parser) and [`policy`]
//! (the one `Allocator` implementation every arena model gets from its policy); `testing`
//! the harness of their unit tests.
//!
//! A model decides *policy* (which free block, when to split, what may merge, when to ask
//! the device); the [`Arena`] keeps the *structure* consistent. Nothing here iterates a
//! hash map, so every model built on it is deterministic.

pub mod arena;
pub mod config;
pub mod free_key;
pub mod hasher;
mod largest_free;
pub mod policy;
pub mod rounding;
#[cfg(test)]
pub mod testing;

pub use arena::{Arena, Block, NIL, Segment, State};
pub use config::{
    ConfigError, changed, fmt_mib, join_options, out_of_range, parse_bool, parse_config, parse_f64,
    parse_mib, parse_pow2, parse_u64,
};
pub use free_key::{FreeKey, StreamLists};
pub use hasher::AddrHasher;
pub use policy::{ArenaPolicy, Refusal};
pub use rounding::{PAGE_BYTES, device_bytes, round_down, round_up};
