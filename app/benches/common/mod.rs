//! What the app's benchmarks share.

/// One frame's input to a headless app: a 1600 × 1000 point window, nothing else.
pub fn window_input() -> egui::RawInput {
    egui::RawInput {
        screen_rect: Some(egui::Rect::from_min_size(
            egui::Pos2::ZERO,
            egui::vec2(1600.0, 1000.0),
        )),
        ..egui::RawInput::default()
    }
}
