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
/// The blockers of an OOM explanation: the live blocks whose absence would let the
/// request fit.
pub const BLOCKER: Color32 = Color32::from_rgb(236, 72, 200);
/// The timeline's reference lines: the live-bytes peak (no allocator needs less) and the
/// offline placement's peak (the best placement knowing every lifetime).
pub const LIVE_PEAK: Color32 = Color32::from_rgb(120, 220, 160);
pub const OFFLINE_PEAK: Color32 = Color32::from_rgb(250, 200, 90);
/// The block or band under the mouse.
/// The stacked view's folded band: allocations too small to draw at this zoom.
pub const FOLDED: Color32 = Color32::from_rgb(92, 98, 112);

pub const HOVER_OUTLINE: Color32 = Color32::WHITE;
/// What the file itself records (drawn until the replays arrive).
pub const RECORDED: Color32 = Color32::from_rgb(190, 196, 210);
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

/// The colour of a memory-map block state ([`crate::engine::wire::block_state`]).
#[must_use]
pub fn block(state: u8) -> Color32 {
    use crate::engine::wire::block_state;
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

/// `Color32::from(Hsva::new(h, s, v, 1.0))` without its three `powf`s: the stacked view
/// colours every allocation at load (a hundred thousand bands), and in wasm those `powf`s
/// were most of a frozen second on the page.
#[allow(clippy::many_single_char_names)] // h, s, v and r, g, b are the colour channels
fn hsv(h: f32, s: f32, v: f32) -> Color32 {
    let [r, g, b] = egui::ecolor::rgb_from_hsv((h, s, v));
    Color32::from_rgb(gamma_u8(r), gamma_u8(g), gamma_u8(b))
}

/// `egui::ecolor::gamma_u8_from_linear_f32` by search in a table of where each output value
/// begins (the conversion is monotonic), built once.
fn gamma_u8(linear: f32) -> u8 {
    static STARTS: std::sync::OnceLock<[f32; 255]> = std::sync::OnceLock::new();
    let starts = STARTS.get_or_init(|| {
        let mut t = [0.0f32; 255];
        for (i, start) in t.iter_mut().enumerate() {
            // The least linear value that converts to at least i + 1, by bisection.
            let want = i + 1;
            let (mut lo, mut hi) = (0.0f32, 1.0f32);
            for _ in 0..40 {
                let mid = 0.5 * (lo + hi);
                if usize::from(egui::ecolor::gamma_u8_from_linear_f32(mid)) >= want {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            *start = hi;
        }
        t
    });
    // At most 255: the table has 255 entries.
    starts.partition_point(|&x| x <= linear) as u8
}

/// Height of one memory-map row, in points.
pub const ROW_HEIGHT: f32 = 18.0;
/// Gap between memory-map rows, in points.
pub const ROW_GAP: f32 = 3.0;
/// Width of the memory map's label column, in points.
pub const LABEL_WIDTH: f32 = 240.0;

/// Says that something is on its way: egui's spinner, except in the browser, where a
/// still mark stands for it. A spinner asks for a frame at every refresh while it is
/// shown, and a frame there is drawn on the CPU (`SwiftShader`), which the engine's worker
/// needs: opening the 1.12 GB snapshot, the GPU process used 18.6 s of CPU drawing
/// frames in 52 s, the engine's worker 12.6 s (2 cores, load 8).
///
/// Natively the mark turns at [`BUSY_FRAMES_PER_S`] frames a second, not at every refresh:
/// while the 1.12 GB snapshot's trace was built beside its main replay, egui's spinner
/// drew 527 frames (1.44 s of frame time on 2 cores at load 5) over the recorded
/// timeline, on the cores the engine needs (`app/benches/open.rs`).
pub fn busy(ui: &mut egui::Ui) -> egui::Response {
    if cfg!(target_arch = "wasm32") {
        return ui.weak("…").on_hover_text("on its way");
    }
    let size = ui.style().spacing.interact_size.y;
    let (rect, response) = ui.allocate_exact_size(egui::vec2(size, size), egui::Sense::hover());
    if ui.is_rect_visible(rect) {
        ui.ctx()
            .request_repaint_after(std::time::Duration::from_secs_f64(
                1.0 / f64::from(BUSY_FRAMES_PER_S),
            ));
        let turn = ui.input(|i| i.time) * 1.5;
        let radius = rect.height() / 2.0 - 2.0;
        let points: Vec<egui::Pos2> = (0..=16)
            .map(|k| {
                let a = (turn + f64::from(k) / 16.0 * 0.8) * std::f64::consts::TAU;
                #[allow(clippy::cast_possible_truncation)] // an angle, in points
                let (y, x) = (a.sin() as f32, a.cos() as f32);
                rect.center() + radius * egui::vec2(x, y)
            })
            .collect();
        let stroke = egui::Stroke::new(2.5, ui.visuals().strong_text_color());
        ui.painter().add(egui::Shape::line(points, stroke));
    }
    response.on_hover_text("on its way")
}

/// Frames a second [`busy`]'s mark asks for natively.
pub const BUSY_FRAMES_PER_S: u32 = 10;

#[cfg(test)]
mod tests {
    use egui::Color32;

    #[test]
    fn gamma_table_is_eguis_conversion() {
        for i in 0..=200_000u32 {
            let l = i as f32 / 200_000.0;
            assert_eq!(
                super::gamma_u8(l),
                egui::ecolor::gamma_u8_from_linear_f32(l),
                "linear {l}"
            );
        }
        assert_eq!(super::gamma_u8(-0.5), 0);
        assert_eq!(super::gamma_u8(1.5), 255);
    }

    #[test]
    fn site_colours_are_eguis_hsva() {
        for key in 0..5000u32 {
            let h = key as f32 / 5000.0;
            let v = 0.62 + 0.25 * ((key % 256) as f32 / 255.0);
            assert_eq!(
                super::hsv(h, 0.55, v),
                Color32::from(egui::ecolor::Hsva::new(h, 0.55, v, 1.0)),
                "h {h} v {v}"
            );
        }
    }
}
