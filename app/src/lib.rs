//! allocsim-app: the eframe app (desktop and web) and the `allocsim` command line.

pub mod cli;
#[cfg(feature = "gui")]
pub mod gui;
pub mod parallel;
