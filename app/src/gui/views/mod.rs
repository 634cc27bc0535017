//! The app's views, one folder each: its state, what it draws and how. The timeline and
//! the memory map split model (the engine's data) → layout (positions, levels of detail)
//! → paint (our wgpu layers, `render.rs`).

pub mod compare;
pub mod config;
pub mod diff;
#[cfg(feature = "cuda")]
pub mod live;
pub mod map;
pub mod multi;
pub mod oom;
pub mod peak;
pub mod ranks;
pub mod search;
pub mod timeline;
