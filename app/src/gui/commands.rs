//! Keyboard shortcuts, File > Open, and the exports (CSV, JSON).

use crate::engine::wire::Request;
use crate::gui::state;
use crate::gui::{AllocsimApp, PathPrompt};

pub(crate) fn stem(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
    base.split('.').next().unwrap_or(base).to_string()
}

pub(crate) fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl AllocsimApp {
    /// File > Open: the file dialog, or the path field where the dialog could not open.
    pub fn open_file(&mut self, ctx: &egui::Context) {
        match &self.dialog_unavailable {
            Some(reason) => {
                let reason = reason.clone();
                self.path_prompt.get_or_insert_with(|| PathPrompt {
                    reason,
                    text: String::new(),
                });
            }
            None => (self.file_dialog)(ctx, &self.inbox),
        }
    }

    /// Opens the path typed in the path field; the field stays while the path cannot be
    /// read.
    pub fn open_typed_path(&mut self, ctx: &egui::Context) {
        let Some(p) = &self.path_prompt else { return };
        if p.text.trim().is_empty() {
            return;
        }
        #[cfg(not(target_arch = "wasm32"))]
        let opened = crate::gui::io::file_at(&p.text);
        #[cfg(target_arch = "wasm32")]
        let opened = crate::gui::io::read_path(&p.text);
        match opened {
            Ok(f) => {
                self.path_prompt = None;
                self.inbox.push(ctx, Ok(f));
            }
            Err(e) => self.errors.push(e),
        }
    }

    /// Takes the keys that move the cursor (arrows, pages, Home, End: pressed and released)
    /// out of a frame's raw input before egui sees it, where no widget has the keyboard
    /// focus; [`AllocsimApp::keys`] handles them. egui draws one more frame after any frame
    /// with input events, and on a software rasterizer (the browser on `SwiftShader`) that
    /// frame, identical to the one before, costs as much as the frame that shows the key's
    /// layout: taken out, a key costs the one frame that moves the cursor.
    pub(crate) fn take_cursor_keys(&mut self, ctx: &egui::Context, raw: &mut egui::RawInput) {
        if ctx.egui_wants_keyboard_input() || ctx.memory(|m| m.focused().is_some()) {
            return;
        }
        // The integration draws a frame for every input event already (this hook runs in
        // it): the keys are handled in this frame.
        let keys = &mut self.cursor_keys;
        raw.events.retain(|e| {
            let cursor_key = matches!(
                e,
                egui::Event::Key { key, .. } if cursor_step(*key, 0, 0, 0, false).is_some()
            );
            if cursor_key {
                keys.push(e.clone());
            }
            !cursor_key
        });
    }

    /// Takes the files dropped out of a frame's raw input before egui sees them (the
    /// frame's [`AllocsimApp::pump`] opens them), and the files hovered over the window
    /// (the app shows nothing for them). egui draws another frame at once after a frame
    /// with either, and one more every frame while files are hovered: in the browser on a
    /// software rasterizer each is 40-90 ms of the two cores' time, which the drop's frame
    /// spent beside the engine's worker decoding the file just dropped.
    ///
    /// Where [`AllocsimApp::drops`] says so, the frame of a drop draws nothing:
    /// its viewport is marked occluded, over which eframe runs no ui pass and paints
    /// nothing, only the app's `logic` ([`AllocsimApp::open_unpainted`], which opens the
    /// files), keeping the frame's input for the next. What the window shows changes with
    /// the file's recorded timeline, or its progress while it is read.
    pub(crate) fn take_dropped_files(&mut self, raw: &mut egui::RawInput) {
        let dropped = !raw.dropped_files.is_empty();
        self.dropped.append(&mut raw.dropped_files);
        raw.hovered_files.clear();
        if dropped && self.drops.unpainted {
            raw.viewports
                .entry(egui::ViewportId::ROOT)
                .or_default()
                .occluded = Some(true);
            self.drops.pending = true;
        }
    }

    /// Opens the files of a drop whose frame is left unpainted ([`Self::take_dropped_files`]),
    /// as that frame's pass would have (eframe's `logic`, run with no ui pass over an
    /// occluded viewport).
    pub(crate) fn open_unpainted(&mut self, ctx: &egui::Context) {
        if std::mem::take(&mut self.drops.pending) {
            self.pump(ctx);
        }
    }

    /// Handles the keyboard: arrows step one event, PageUp/PageDown jump, Home/End;
    /// Escape cancels "What would fit?" while it runs.
    pub(crate) fn keys(&mut self, ctx: &egui::Context) {
        let taken = std::mem::take(&mut self.cursor_keys);
        if ctx.egui_wants_keyboard_input() {
            return;
        }
        if ctx.input(|i| i.key_pressed(egui::Key::Escape)) {
            self.cancel_what_if();
        }
        let Some(doc) = &self.doc else { return };
        let n = doc.trace.ops.len() as i64;
        if n == 0 {
            return;
        }
        let page = i64::from(self.key_page(doc));
        let mut c = i64::from(self.cursor);
        ctx.input(|i| {
            for e in taken.iter().chain(&i.events) {
                if let egui::Event::Key {
                    key,
                    pressed: true,
                    modifiers,
                    ..
                } = e
                    && let Some(to) = cursor_step(*key, c, page, n, modifiers.shift)
                {
                    c = to;
                }
            }
        });
        let c = c.clamp(0, n - 1) as u32;
        if c != self.cursor {
            self.cursor = c;
            self.timeline.reveal(doc, c);
        }
    }

    /// The ops a page key moves the cursor by: a tenth of the ops in view, at least one.
    fn key_page(&self, doc: &state::Document) -> u32 {
        let (lo, hi) = self.timeline.visible(doc);
        let (a, b) = (
            self.timeline.op_at_x(doc, lo),
            self.timeline.op_at_x(doc, hi),
        );
        (b.saturating_sub(a) / 10).max(1)
    }

    /// Where one key moves the cursor from where it is, most likely first: the right and
    /// left arrows, page down and up, End, Home (clamped to the trace).
    pub(crate) fn key_targets(&self, doc: &state::Document) -> [u32; 6] {
        let last = (doc.trace.ops.len() as u32).saturating_sub(1);
        let (c, page) = (self.cursor, self.key_page(doc));
        [
            c.saturating_add(1).min(last),
            c.saturating_sub(1),
            c.saturating_add(page).min(last),
            c.saturating_sub(page),
            last,
            0,
        ]
    }

    /// Exports the main configuration's metrics timeline as CSV: the engine replays it
    /// again with every column (the app's replays keep only those drawn) and hands the
    /// CSV on in pieces, which go to the file as they come ([`crate::gui::io::SaveInPieces`]): on the
    /// 1.12 GB snapshot it is about 1 GB, never held whole.
    pub(crate) fn export_csv(&mut self) {
        let Some(doc) = &self.doc else { return };
        let Some(s) = doc.slots.first() else { return };
        if s.replay.is_none() {
            return;
        }
        let name = format!(
            "{}_{}_timeline.csv",
            stem(&doc.trace.name),
            sanitize(&s.spec)
        );
        let (spec, capacity_bytes) = (s.spec.clone(), s.capacity_bytes);
        let job = self.job();
        let sink = match crate::gui::io::SaveInPieces::new(&name, job) {
            Ok(sink) => sink,
            Err(e) => {
                self.errors.push(format!("cannot export {name}: {e}"));
                return;
            }
        };
        self.csv_export = Some((job, sink));
        self.engine.send(Request::ExportCsv {
            job,
            spec,
            capacity_bytes,
        });
    }

    /// Takes a piece of the CSV export in flight (the file saved after the last).
    pub(crate) fn on_csv_piece(&mut self, job: u64, bytes: &[u8], done: bool) {
        let Some((j, sink)) = &mut self.csv_export else {
            return;
        };
        if *j != job {
            return;
        }
        if let Err(e) = sink.push(bytes) {
            self.errors.push(format!("cannot export the CSV: {e}"));
            self.csv_export = None;
            return;
        }
        if done && let Some((_, sink)) = self.csv_export.take() {
            sink.finish();
        }
    }

    /// The compare summary as JSON (the fields of `allocsim compare --json`).
    #[must_use]
    pub fn compare_json(&self) -> Option<String> {
        let doc = self.doc.as_ref()?;
        let results: Vec<serde_json::Value> = doc
            .slots
            .iter()
            .filter_map(|s| {
                let r = s.replay.as_ref()?;
                let mut v = serde_json::to_value(&r.data.summary).ok()?;
                if let Some(o) = v.as_object_mut() {
                    o.insert("spec".into(), serde_json::Value::String(s.spec.clone()));
                    o.insert(
                        "events".into(),
                        serde_json::Value::from(
                            doc.trace
                                .devices
                                .get(doc.trace.device as usize)
                                .map_or(0, |d| d.0),
                        ),
                    );
                }
                Some(v)
            })
            .collect();
        let c = &self.config.capacity;
        let v = serde_json::json!({
            "schema": 1,
            "file": doc.trace.name,
            "device": doc.trace.device,
            "capacity_bytes": c.bytes,
            "capacity_source": c.source,
            "capacity_inferred": c.inferred,
            "capacity_note": c.note,
            "results": results,
        });
        serde_json::to_string_pretty(&v).ok()
    }

    pub(crate) fn export_json(&self) {
        if let (Some(doc), Some(json)) = (&self.doc, self.compare_json()) {
            crate::gui::io::save_file(
                &format!("{}_compare.json", stem(&doc.trace.name)),
                json.into_bytes(),
            );
        }
    }
}

/// Where `key` moves a cursor at `c` (`page` ops a page, `n` ops in all; with Shift an
/// arrow steps ten), or `None` for a key that does not move it.
fn cursor_step(key: egui::Key, c: i64, page: i64, n: i64, shift: bool) -> Option<i64> {
    let step = if shift { 10 } else { 1 };
    Some(match key {
        egui::Key::ArrowRight => c + step,
        egui::Key::ArrowLeft => c - step,
        egui::Key::PageDown => c + page,
        egui::Key::PageUp => c - page,
        egui::Key::Home => 0,
        egui::Key::End => n - 1,
        _ => return None,
    })
}
