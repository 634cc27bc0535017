//! Every colour and size of the app, in one place.

use egui::Color32;

/// Allocated block (live tensor memory).
pub const ALLOCATED: Color32 = Color32::from_rgb(66, 133, 244);
/// Cached free block (reserved, not allocated).
pub const FREE: Color32 = Color32::from_rgb(78, 84, 96);
/// Freed by the program, waiting for other streams.
pub const PENDING_FREE: Color32 = Color32::from_rgb(240, 160, 40);
/// Reserved address space without memory (expandable segments).
pub const UNMAPPED: Color32 = Color32::from_rgb(34, 36, 42);
/// Search matches and the selected call site.
pub const HIGHLIGHT: Color32 = Color32::from_rgb(255, 230, 0);
/// The block or band under the mouse.
pub const HOVER_OUTLINE: Color32 = Color32::WHITE;
/// The cursor line.
pub const CURSOR: Color32 = Color32::from_rgb(255, 80, 80);
/// OOM markers.
pub const OOM: Color32 = Color32::from_rgb(230, 40, 40);
/// The memory cap line.
pub const CAPACITY: Color32 = Color32::from_rgb(200, 200, 200);
/// Plot backgrounds.
pub const PLOT_BG: Color32 = Color32::from_rgb(20, 22, 27);
/// Grid lines and axis text.
pub const GRID: Color32 = Color32::from_rgb(48, 52, 60);
pub const AXIS_TEXT: Color32 = Color32::from_rgb(160, 165, 175);
/// Group header rows of the memory map.
pub const GROUP_HEADER: Color32 = Color32::from_rgb(36, 40, 48);
/// Error banner.
pub const ERROR_BG: Color32 = Color32::from_rgb(90, 24, 24);
pub const OK_TEXT: Color32 = Color32::from_rgb(110, 200, 120);
pub const BAD_TEXT: Color32 = Color32::from_rgb(240, 110, 100);

/// The live CUDA replay's curves: the GPU's real usage, and the simulation run beside it.
pub const LIVE_REAL: Color32 = Color32::from_rgb(245, 245, 245);
pub const LIVE_SIM: Color32 = Color32::from_rgb(150, 190, 255);

/// One colour per compared configuration (slot), repeating.
pub const SLOTS: [Color32; 6] = [
    Color32::from_rgb(66, 133, 244),
    Color32::from_rgb(52, 190, 120),
    Color32::from_rgb(240, 150, 40),
    Color32::from_rgb(200, 90, 220),
    Color32::from_rgb(90, 210, 230),
    Color32::from_rgb(230, 90, 110),
];

/// The colour of compare slot `i`.
#[must_use]
pub fn slot(i: usize) -> Color32 {
    SLOTS[i % SLOTS.len()]
}

/// The colour of a memory-map block state ([`crate::gui::engine::wire::block_state`]).
#[must_use]
pub fn block(state: u8) -> Color32 {
    use crate::gui::engine::wire::block_state;
    match state {
        block_state::ALLOCATED => ALLOCATED,
        block_state::PENDING_FREE => PENDING_FREE,
        block_state::UNMAPPED => UNMAPPED,
        _ => FREE,
    }
}

/// A band's colour from its call site: the same stack always gets the same colour.
#[must_use]
pub fn site(stack: u32, alloc: u32) -> Color32 {
    // Without frames every allocation has stack 0: colour by allocation instead.
    let key = if stack == 0 {
        alloc.wrapping_mul(2_654_435_761)
    } else {
        stack.wrapping_mul(2_246_822_519) ^ 0x9e37_79b9
    };
    let h = (key >> 8) as f32 / (1u32 << 24) as f32;
    let v = 0.62 + 0.25 * ((key & 0xff) as f32 / 255.0);
    hsv(h, 0.55, v)
}

fn hsv(h: f32, s: f32, v: f32) -> Color32 {
    let c = egui::ecolor::Hsva::new(h, s, v, 1.0);
    Color32::from(c)
}

/// Height of one memory-map row, in points.
pub const ROW_HEIGHT: f32 = 18.0;
/// Gap between memory-map rows, in points.
pub const ROW_GAP: f32 = 3.0;
/// Width of the memory map's label column, in points.
pub const LABEL_WIDTH: f32 = 240.0;
