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

/// The whole space left in `ui` as a plot that takes clicks and drags, filled with the
/// plot background (in fill layer `fill_layer`): its rectangle, response and painter.
pub fn plot_area_ui(
    ui: &mut egui::Ui,
    wgpu: bool,
    fill_layer: u64,
) -> (egui::Rect, egui::Response, egui::Painter) {
    let avail = ui.available_rect_before_wrap();
    let (outer, response) = ui.allocate_exact_size(avail.size(), egui::Sense::click_and_drag());
    let painter = ui.painter_at(outer);
    crate::gui::render::fill_rect(
        &painter,
        outer,
        crate::gui::theme::PLOT_BG,
        wgpu,
        fill_layer,
    );
    (outer, response, painter)
}
