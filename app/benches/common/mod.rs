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

/// When a headless app's next frame is due, as eframe decides: at once for a repaint asked
/// for from another thread (an engine's answer), after its delay for one a frame asked for
/// (an animation's next step); and a frame every half second regardless, so that a wake
/// missed here cannot stall a bench. Drawing whenever any repaint is pending (or polling)
/// would draw many more frames than the app, on the cores the engine needs.
#[allow(dead_code)] // not every bench paces its frames
pub struct Pacer {
    wake: std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>,
    last: std::time::Instant,
}

#[allow(dead_code)]
impl Pacer {
    /// Takes over `ctx`'s repaint requests; the first frame is due at once.
    pub fn new(ctx: &egui::Context) -> Pacer {
        let wake = std::sync::Arc::new(std::sync::Mutex::new(Some(std::time::Instant::now())));
        let w = wake.clone();
        ctx.set_request_repaint_callback(move |info| ask(&w, info.delay));
        Pacer {
            wake,
            last: std::time::Instant::now(),
        }
    }

    /// Whether a frame is due now (it is then counted as drawn).
    pub fn due(&mut self) -> bool {
        let now = std::time::Instant::now();
        let asked = self
            .wake
            .lock()
            .ok()
            .and_then(|mut w| w.take_if(|at| *at <= now))
            .is_some();
        let due = asked || now - self.last >= std::time::Duration::from_millis(500);
        if due {
            self.last = now;
        }
        due
    }

    /// The repaint a frame's output asks for.
    pub fn drawn(&self, out: &egui::FullOutput) {
        if let Some(v) = out.viewport_output.get(&egui::ViewportId::ROOT)
            && v.repaint_delay < std::time::Duration::MAX
        {
            ask(&self.wake, v.repaint_delay);
        }
    }
}

fn ask(wake: &std::sync::Mutex<Option<std::time::Instant>>, delay: std::time::Duration) {
    let at = std::time::Instant::now() + delay;
    if let Ok(mut w) = wake.lock() {
        *w = Some(w.map_or(at, |x| x.min(at)));
    }
}
