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

/// The space left in `ui`, taken by one widget sensing `sense` and filled with the plot
/// background on GPU layer `fill_layer`: its rectangle, response and painter.
pub(crate) fn plot_area(
    ui: &mut egui::Ui,
    sense: egui::Sense,
    wgpu: bool,
    fill_layer: u64,
) -> (egui::Rect, egui::Response, egui::Painter) {
    let avail = ui.available_rect_before_wrap();
    let (outer, response) = ui.allocate_exact_size(avail.size(), sense);
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
