//! allocsim-app: the eframe app (desktop and web) and the `allocsim` command line, two
//! products over one engine.
//!
//! - [`engine`]: trace sessions, replays, layouts and searches behind messages, no egui;
//!   the GUI runs it on a thread, the browser in a Web Worker, and its
//!   [`engine::parallel`] runner replays on every core for the CLI too.
//! - [`cli`] (feature `cli`): the `allocsim` command line, its contract in docs/cli.md.
//! - [`gui`] (feature `gui`): the eframe app, desktop and web.
//! - [`heap`]: a counting global allocator for the benchmarks and the browser build.
//!
//! Layers, each may use only those above it: core → `engine` → `cli`, `gui`; `cli` and
//! `gui` never use each other (`scripts/layers.sh` checks it).

#[cfg(feature = "cli")]
pub mod cli;
pub mod engine;
#[cfg(feature = "gui")]
pub mod gui;
pub mod heap;
