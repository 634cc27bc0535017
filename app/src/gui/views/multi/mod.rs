//! Views of several snapshots at once, apart from the loaded trace: the **Diff** of two
//! runs and a set of **Ranks**. Dropping several files at once starts one (two files: a
//! Diff, more: Ranks); File > Diff two snapshots… and Ranks… open a dialog that picks
//! several; a file dropped while one of these views is shown, or a path typed in, adds to
//! it. The engine decodes and replays them in parallel ([`crate::engine::multi`]). When an
//! answer is shown the page is marked (`diff:…`, `ranks:…`: the browser test waits for it).

use allocsim_core::diff::Align;

use crate::engine::wire::{DiffData, RanksData};
use crate::engine::wire::{NamedBytes, Request, Response};
use crate::gui::AllocsimApp;
use crate::gui::io;
use crate::gui::views::{diff, ranks};

/// `text` with the arrows and minus sign of core's sentences in characters the app's font
/// has (`→` `->`, `←` `<-`, `−` `-`).
#[must_use]
pub fn drawable(text: &str) -> String {
    text.replace('→', "->").replace('←', "<-").replace('−', "-")
}

/// Which of the views is shown in place of the trace's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MultiView {
    Diff,
    Ranks,
}

/// The snapshots added and what the engine answered about them.
#[derive(Debug, Default)]
pub struct MultiState {
    /// Shown in place of the trace's views while set.
    pub view: Option<MultiView>,
    /// Where dialogs and drops deliver the files of these views.
    pub inbox: io::Inbox,
    pub files: Vec<io::Opened>,
    pub errors: Vec<String>,
    /// The diff's A and B (indices into `files`), its axis and B's setting.
    pub a: usize,
    pub b: usize,
    pub align: Align,
    pub config_b: String,
    /// B's setting as typed, applied when the field loses focus.
    pub config_b_text: String,
    /// What the diff on screen was asked for, its job and answer.
    pub diff_key: Option<(usize, usize, Align, String, usize)>,
    pub diff_job: Option<u64>,
    pub diff: Option<Result<DiffData, String>>,
    /// The what-if applied to every rank, and as typed (applied on Enter).
    pub what_if: String,
    pub what_if_text: String,
    pub ranks_key: Option<(usize, String)>,
    pub ranks_job: Option<u64>,
    pub ranks: Option<RanksData>,
    /// A path typed in (native), added on Enter.
    pub path_text: String,
}

impl MultiState {
    /// Adds a file; the first two become the diff's A and B.
    pub fn add(&mut self, f: io::Opened) {
        self.files.push(f);
        if self.files.len() == 2 {
            (self.a, self.b) = (0, 1);
        }
    }

    /// Forgets every file and answer.
    pub fn clear(&mut self) {
        let (view, inbox) = (self.view, self.inbox.clone());
        *self = MultiState {
            view,
            inbox,
            ..MultiState::default()
        };
    }
}

/// A fresh set of `n` snapshots dropped at once: a Diff for two, Ranks for more.
pub fn start(app: &mut AllocsimApp, n: usize) {
    app.multi.clear();
    app.multi.view = Some(if n == 2 {
        MultiView::Diff
    } else {
        MultiView::Ranks
    });
}

/// Picks up files that arrived, and asks the engine for what the view shown needs.
pub fn pump(app: &mut AllocsimApp) {
    for item in app.multi.inbox.take() {
        match item {
            Ok(f) => app.multi.add(f),
            Err(e) => app.multi.errors.push(e),
        }
    }
    match app.multi.view {
        Some(MultiView::Diff) => request_diff(app),
        Some(MultiView::Ranks) => request_ranks(app),
        None => {}
    }
}

fn named(f: &io::Opened) -> NamedBytes {
    NamedBytes {
        name: f.name.clone(),
        bytes: f.bytes.clone(),
    }
}

fn request_diff(app: &mut AllocsimApp) {
    let m = &app.multi;
    if m.files.len() < 2 || m.a >= m.files.len() || m.b >= m.files.len() {
        return;
    }
    let key = (
        m.a,
        m.b,
        m.align,
        m.config_b.trim().to_string(),
        m.files.len(),
    );
    if m.diff_key.as_ref() == Some(&key) {
        return;
    }
    let job = app.job();
    let m = &mut app.multi;
    let config_b = (!key.3.is_empty()).then(|| key.3.clone());
    let req = Request::Diff {
        job,
        files: Box::new([named(&m.files[m.a]), named(&m.files[m.b])]),
        align: m.align,
        config_b,
    };
    m.diff_key = Some(key);
    m.diff_job = Some(job);
    m.diff = None;
    app.engine.send(req);
}

fn request_ranks(app: &mut AllocsimApp) {
    let m = &app.multi;
    if m.files.is_empty() {
        return;
    }
    if m.what_if.trim().is_empty() {
        app.multi.what_if = allocsim_core::ranks::DEFAULT_WHAT_IF.to_string();
    }
    let key = (app.multi.files.len(), app.multi.what_if.trim().to_string());
    if app.multi.ranks_key.as_ref() == Some(&key) {
        return;
    }
    let job = app.job();
    let m = &mut app.multi;
    let req = Request::Ranks {
        job,
        files: m.files.iter().map(named).collect(),
        what_if: key.1.clone(),
    };
    m.ranks_key = Some(key);
    m.ranks_job = Some(job);
    m.ranks = None;
    app.engine.send(req);
}

/// Takes the engine's answers to these views' jobs; hands back any other.
pub fn on_response(app: &mut AllocsimApp, r: Response) -> Option<Response> {
    let m = &mut app.multi;
    match r {
        Response::Diffed { job, data } if m.diff_job == Some(job) => {
            m.diff_job = None;
            io::mark_frame(&format!(
                "diff:{}:{}",
                data.diff.peak_reserved_delta_bytes,
                data.diff.by_site.first().map_or(0, |s| s.delta_bytes)
            ));
            m.diff = Some(Ok(*data));
            None
        }
        Response::Ranked { job, data } if m.ranks_job == Some(job) => {
            m.ranks_job = None;
            let report = data.report.as_ref();
            io::mark_frame(&format!(
                "ranks:{}:outlier={}:failed={}",
                report.map_or(0, |r| r.ranks.len()),
                report
                    .and_then(|r| r.outlier.as_ref())
                    .map_or_else(|| "none".to_string(), |o| o.rank.to_string()),
                data.failed.len()
            ));
            if let Some(r) = report {
                io::mark_ranks(r);
            }
            m.ranks = Some(*data);
            None
        }
        Response::Failed { job, message } if m.diff_job == Some(job) => {
            m.diff_job = None;
            m.diff = Some(Err(message));
            None
        }
        Response::Failed { job, message } if m.ranks_job == Some(job) => {
            m.ranks_job = None;
            m.errors.push(message);
            None
        }
        // Answers to questions no longer asked (and one rank's, which the browser's pool
        // of workers gathers before the UI sees it).
        Response::Diffed { .. } | Response::Ranked { .. } | Response::RankDone { .. } => None,
        other => Some(other),
    }
}

/// The central panel while one of these views is shown.
pub fn central_ui(ui: &mut egui::Ui, app: &mut AllocsimApp) {
    ui.horizontal(|ui| {
        let mut view = app.multi.view;
        ui.selectable_value(&mut view, Some(MultiView::Diff), "Diff");
        ui.selectable_value(&mut view, Some(MultiView::Ranks), "Ranks");
        app.multi.view = view;
        ui.separator();
        if ui.button("Add snapshots…").clicked() {
            io::open_files_dialog(ui.ctx(), &app.multi.inbox);
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            let r = ui.add(
                egui::TextEdit::singleline(&mut app.multi.path_text)
                    .hint_text("or a path, Enter")
                    .desired_width(220.0),
            );
            if r.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter)) {
                let p = app.multi.path_text.trim().to_string();
                if !p.is_empty() {
                    match io::read_path(&p) {
                        Ok(f) => app.multi.add(f),
                        Err(e) => app.multi.errors.push(e),
                    }
                    app.multi.path_text.clear();
                }
            }
        }
        if ui
            .add_enabled(!app.multi.files.is_empty(), egui::Button::new("Clear"))
            .clicked()
        {
            app.multi.clear();
        }
        ui.separator();
        if ui.button("Back to the trace").clicked() {
            app.multi.view = None;
        }
    });
    let errors = std::mem::take(&mut app.multi.errors);
    for e in &errors {
        ui.colored_label(crate::gui::theme::BAD_TEXT, e);
    }
    app.multi.errors = errors;
    ui.separator();
    match app.multi.view {
        Some(MultiView::Diff) => diff::diff_ui(ui, app),
        Some(MultiView::Ranks) => ranks::ranks_ui(ui, app),
        None => {}
    }
}
