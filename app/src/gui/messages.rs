//! The app's side of the engine's messages: what each response changes, and the requests
//! the UI sends (replays, layouts, searches).

use crate::engine::examples::{self, Example};
use crate::engine::wire::{LayoutData, Request, Response};
use crate::gui::render::QuadSet;
use crate::gui::state::{self, Document, LayoutView, ReplayView, Slot};
use crate::gui::views::map::tab::{blocker_picker, highlighter};
use crate::gui::views::oom::would_fit::{Runtimes, WhatIf};
use crate::gui::views::oom::{Explained, oom_at};
use crate::gui::views::search::SearchState;
use crate::gui::workers::EARLY_SHARE_MAX_OPS;
use crate::gui::{AllocsimApp, OpenSource, Opening, PathPrompt};
use allocsim_core::capacity::CapacityArg;
use std::collections::BTreeSet;
use std::sync::Arc;

impl AllocsimApp {
    /// Replays the compared configurations that changed (after a config or capacity
    /// change); a slot whose spec and capacity stay keeps its replay.
    pub fn resimulate(&mut self) {
        let specs = self.config.specs();
        let cap = self.config.capacity_bytes();
        let Some(doc) = &mut self.doc else { return };
        let mut old: Vec<Option<Slot>> = std::mem::take(&mut doc.slots)
            .into_iter()
            .map(Some)
            .collect();
        for (i, spec) in specs.iter().enumerate() {
            let kept = old.get_mut(i).and_then(|o| {
                o.take_if(|s| s.spec == *spec && s.capacity_bytes == cap && s.replay.is_some())
            });
            doc.slots.push(match kept {
                Some(mut s) => {
                    s.layout_job = None;
                    s
                }
                None => Slot::new(spec.clone(), cap),
            });
        }
        for i in specs.len()..old.len() {
            self.engine.send(Request::DropSlot { slot: i as u32 });
        }
        self.request_replays();
    }

    /// Sends a replay for every slot without one, each followed by its layout at the
    /// cursor (for a newly opened trace, where the main replay will put the cursor:
    /// [`Request::StartLayout`]). The engine answers in order, so the main configuration's
    /// layout comes before the other replays start (the first full frame waits for no
    /// other replay), and no frame of the UI sits between a replay and its layout or the
    /// next replay (in the browser each costs 50-300 ms of a software rasterizer).
    pub(crate) fn request_replays(&mut self) {
        let n = self.doc.as_ref().map_or(0, |d| d.slots.len());
        let mut sent = false;
        // Answered unasked (the browser's open:
        // `MainReplay::answer`), where the main
        // slot is the configuration sent with the file: its jobs are taken, not sent.
        let answered = self.main_answer.take().and_then(|(_, m)| {
            let s = self.doc.as_ref()?.slots.first()?;
            (self.cursor_pending && s.spec == m.spec && s.capacity_bytes == m.capacity_bytes)
                .then_some(m.answer)?
        });
        // In the browser, whose engine worker answers in order, a newly opened trace's
        // other configurations wait for the main one's answer where it may run out of
        // memory (under a capacity): if it does, the sweep's share goes to the worker
        // ahead of their replays ([`AllocsimApp::release_held_replays`]).
        let hold = cfg!(target_arch = "wasm32")
            && self.cursor_pending
            && self
                .doc
                .as_ref()
                .and_then(|d| d.slots.first())
                .is_some_and(|s| s.capacity_bytes.is_some() && s.replay.is_none());
        for i in 0..n {
            if hold && i > 0 {
                self.replays_held = n - 1;
                break;
            }
            let needs = self.doc.as_ref().is_some_and(|d| {
                d.slots[i].replay.is_none()
                    && d.slots[i].replay_job.is_none()
                    && d.slots[i].error.is_none()
            });
            if needs {
                sent = true;
                let (job, layout_job) = match (i, answered) {
                    (0, Some(jobs)) => jobs,
                    _ => (self.job(), self.job()),
                };
                let (cursor, pending) = (self.cursor, self.cursor_pending);
                if let Some(doc) = &mut self.doc {
                    let s = &mut doc.slots[i];
                    s.replay_job = Some(job);
                    s.layout_job = Some((layout_job, cursor));
                    s.error = None;
                    if i == 0 && answered.is_some() {
                        continue;
                    }
                    let req = Request::Replay {
                        job,
                        slot: i as u32,
                        spec: s.spec.clone(),
                        capacity_bytes: s.capacity_bytes,
                    };
                    self.engine.send(req);
                    let (job, slot) = (layout_job, i as u32);
                    self.engine.send(if pending {
                        Request::StartLayout {
                            job,
                            slot,
                            otherwise: cursor,
                        }
                    } else {
                        Request::Layout {
                            job,
                            slot,
                            op: cursor,
                        }
                    });
                }
            }
        }
        if sent {
            self.peak_sites = None;
            // The layouts kept one key away belong to the replays replaced.
            self.engine.send_background(Vec::new());
            self.nearby_for = None;
        }
    }

    /// Sends the replays [`AllocsimApp::request_replays`] held back once the main
    /// configuration is no longer in flight: first, where it ran out of memory and the
    /// trace's share is small ([`EARLY_SHARE_MAX_OPS`]), the search workers are got ready
    /// ([`EngineHandle::prepare_search`]), so that the engine's worker shares the trace
    /// ahead of these replays and the search workers decode it while they run; "What
    /// would fit?" then starts with them ready once every configuration is on screen,
    /// not 0.5–0.8 s later. A larger share waits for the sweep as before: its copies
    /// would sit beside the other replays.
    ///
    /// [`EngineHandle::prepare_search`]: crate::gui::io::EngineHandle::prepare_search
    pub(crate) fn release_held_replays(&mut self) {
        let Some(doc) = &self.doc else { return };
        let Some(main) = doc.slots.first() else {
            return;
        };
        if self.replays_held == 0 || main.replay_job.is_some() {
            return;
        }
        self.replays_held = 0;
        let oom = main
            .replay
            .as_ref()
            .is_some_and(|r| !r.data.summary.ooms.is_empty());
        if oom && doc.trace.ops.len() <= EARLY_SHARE_MAX_OPS {
            self.engine.prepare_search();
        }
        self.request_replays();
    }

    /// Sends `req(job)` once per document: `flags` picks the document's (asked, job in
    /// flight).
    fn ask_once(
        &mut self,
        flags: fn(&mut Document) -> (&mut bool, &mut Option<u64>),
        req: fn(u64) -> Request,
    ) {
        self.ask_once_by(flags, req, false);
    }

    /// [`AllocsimApp::ask_once`], sent beside the engine where `beside`
    /// ([`crate::gui::io::EngineHandle::send_beside`]).
    fn ask_once_by(
        &mut self,
        flags: fn(&mut Document) -> (&mut bool, &mut Option<u64>),
        req: fn(u64) -> Request,
        beside: bool,
    ) {
        if self.doc.as_mut().is_none_or(|d| *flags(d).0) {
            return;
        }
        let job = self.job();
        if let Some(doc) = &mut self.doc {
            let (asked, in_flight) = flags(doc);
            *asked = true;
            *in_flight = Some(job);
        }
        if beside {
            self.engine.send_beside(req(job));
        } else {
            self.engine.send(req(job));
        }
    }

    /// Asks for the bands of the document's trace, once.
    fn request_bands(&mut self) {
        self.ask_once(
            |d| (&mut d.bands_asked, &mut d.bands_job),
            |job| Request::Bands { job },
        );
    }

    /// What waits for the first full frame: the bands and the best-possible bounds, sent
    /// once every configuration is on screen (the other configurations' replays go with
    /// the main one, behind its layout). In the browser, whose worker answers in order,
    /// the other layouts would queue behind them (on the 1.12 GB snapshot 11 s of
    /// stacking and 8 s of bounds; the 1 M-event trace's stacking 3.2 s); natively, where
    /// they run on threads of their own, they would take the cores the main
    /// configuration's curves and the other replays need, and hold their memory beside
    /// those replays' (the open's peak on the 1.12 GB snapshot comes after the first full
    /// frame). The stacked view shows its folded band meanwhile. In the browser they also
    /// wait while "What would fit?" sweeps: its search workers take both cores; and the
    /// bounds of a trace of up to [`EARLY_SHARE_MAX_OPS`] ops are the search worker's, not
    /// the engine's (the offline placement took 3.0–3.3 s of the engine's worker on
    /// `big_gpt_long_stacks_s9`, a layout or file asked meanwhile waiting for it).
    /// Nothing is asked while another file opens: the engine answers for the trace it holds
    /// once that file is built, so the document shown would get the next trace's bands and
    /// bounds, and in the browser they would queue ahead of its replays (a drop while the
    /// example's sweep ran: 1.8 s of them before the 1 M-event trace's first frame).
    pub(crate) fn after_main_frame(&mut self) {
        if self.load_job.is_some()
            || !self
                .doc
                .as_ref()
                .is_some_and(|d| d.main_settled() && d.all_settled())
            || (cfg!(target_arch = "wasm32") && self.sweeping())
        {
            return;
        }
        self.request_bands();
        // In the browser the search worker computes the bounds of a trace whose copy there
        // is small (the 1.12 GB snapshot's would double the tab's memory).
        let beside = self
            .doc
            .as_ref()
            .is_some_and(|d| d.trace.ops.len() <= EARLY_SHARE_MAX_OPS);
        self.ask_once_by(
            |d| (&mut d.bounds_asked, &mut d.bounds_job),
            |job| Request::Bounds { job },
            beside,
        );
    }

    /// With the main configuration out of memory, asks what would have fit at the capacity
    /// (the what-if) and the smallest capacity of each configuration, once per capacity:
    /// an OOM trace opens with its explanation complete, without a click. The what-if's
    /// sweep waits until every configuration is on screen: its workers would take the
    /// cores those replays need.
    pub(crate) fn explain_main_oom(&mut self) {
        let main_oom = self.doc.as_ref().is_some_and(|d| {
            d.slots.first().is_some_and(|s| {
                s.replay
                    .as_ref()
                    .is_some_and(|r| !r.data.summary.ooms.is_empty())
            })
        });
        if !main_oom {
            return;
        }
        // In the browser, whose engine answers in order, the searches wait until every
        // configuration of the trace opened last is on screen: a large trace's share with
        // the search workers (on the 1.12 GB snapshot 1.7 s of the engine's worker and two
        // copies of its 406 MiB in JS memory) and the explanation would queue ahead of the
        // other configurations' replays (or, asked for the document shown while another
        // file opens, ahead of its build), and a search worker given the file before the
        // share would decode it. A small trace's share went ahead of those replays already
        // ([`AllocsimApp::release_held_replays`]): its sweep starts with the workers ready.
        if cfg!(target_arch = "wasm32")
            && (self.load_job.is_some() || !self.doc.as_ref().is_some_and(Document::all_settled))
        {
            return;
        }
        // The sweep will come: its workers take the trace now, ahead of the searches.
        self.engine.prepare_search();
        let cap = self.config.capacity_bytes();
        if self.doc.as_ref().is_some_and(Document::all_settled)
            && self
                .what_if
                .as_ref()
                .is_none_or(|w| w.capacity_bytes != cap)
        {
            self.request_what_if();
        }
        // In the browser the smallest capacities (a bisection of replays on the engine's
        // worker) wait for the sweep too.
        if !(cfg!(target_arch = "wasm32") && self.sweeping()) {
            self.request_min_capacities();
        }
        self.request_explanation();
    }

    /// Whether "What would fit?" is sweeping.
    fn sweeping(&self) -> bool {
        self.what_if.as_ref().is_some_and(WhatIf::running)
    }

    /// Asks the engine to explain the main configuration's OOM the panel shows (the last
    /// at or before the cursor, else the first), once per configuration, capacity and OOM.
    pub(crate) fn request_explanation(&mut self) {
        let Some(s) = self.doc.as_ref().and_then(|d| d.slots.first()) else {
            return;
        };
        let Some(r) = &s.replay else { return };
        let ooms = &r.data.summary.ooms;
        if ooms.is_empty() {
            return;
        }
        let o = &ooms[oom_at(ooms, self.cursor)];
        let key = (s.spec.clone(), s.capacity_bytes, o.event_index);
        if self.explained.as_ref().is_some_and(|x| x.key == key) {
            return;
        }
        let job = self.job();
        self.engine.send(Request::Explain {
            job,
            spec: key.0.clone(),
            capacity_bytes: key.1,
            at_event: key.2,
        });
        self.explained = Some(Explained {
            key,
            job,
            answer: None,
            blocker_allocs: BTreeSet::new(),
        });
        self.refresh_highlight();
    }

    /// Handles what the engine and the I/O sent since last frame.
    pub fn pump(&mut self, ctx: &egui::Context) {
        // Files dropped in this frame first: one whose handle arrives at once (a path
        // natively, a `File` in the browser) is opened in this frame, not the next.
        // Taken from egui's input before the frame ([`AllocsimApp::take_dropped_files`]),
        // or still in it where the host did not take them.
        let mut dropped = std::mem::take(&mut self.dropped);
        dropped.extend(ctx.input(|i| i.raw.dropped_files.clone()));
        // Several files at once start a Diff (two) or Ranks (more); one file dropped on
        // either view is one more snapshot of it.
        if dropped.len() >= 2 {
            crate::gui::views::multi::start(self, dropped.len());
        }
        for f in dropped {
            let (inbox, by_path) = if self.multi.view.is_some() {
                (&self.multi.inbox, false)
            } else {
                (&self.inbox, true)
            };
            crate::gui::io::read_dropped(ctx, inbox, f, by_path);
        }
        for item in self.inbox.take() {
            match item {
                Ok(f) => {
                    let ex = examples::by_file(&f.name);
                    let cap = ex.and_then(Example::cap_bytes);
                    let cmp: &[&str] = ex.map_or(&[], |e| e.compare_with);
                    let capacity = self.open_capacity.take().unwrap_or(CapacityArg::AsRecorded);
                    let opening = Opening::new(capacity, cap, cmp);
                    let source = match f.file {
                        Some(file) => OpenSource::File(file),
                        None => OpenSource::Bytes(f.bytes),
                    };
                    self.open(f.name, source, opening);
                }
                Err(e) => self.errors.push(e),
            }
        }
        for reason in self.inbox.take_dialog_failures() {
            log::info!("the file dialog could not open ({reason}); offering a path field");
            self.path_prompt = Some(PathPrompt {
                reason: reason.clone(),
                text: String::new(),
            });
            self.dialog_unavailable = Some(reason);
        }
        crate::gui::views::multi::pump(self);
        for r in self.engine.poll() {
            self.on_response(r);
        }
        // What the file records, per op, once no layout of the main configuration came
        // with the trace to replace it.
        if let Some(doc) = &mut self.doc {
            doc.settle_recorded();
        }
        self.release_held_replays();
        // The OOM's searches first: in the browser the engine's worker answers in order,
        // and the trace's share with the search workers must not wait behind the bands.
        self.explain_main_oom();
        self.after_main_frame();
        self.request_layouts(ctx);
    }

    pub(crate) fn on_response(&mut self, r: Response) {
        let job = r.job();
        if let Some((pj, ..)) = &self.progress
            && *pj == job
            && !matches!(r, Response::Progress { .. })
        {
            self.progress = None;
        }
        let Some(r) = crate::gui::views::multi::on_response(self, r) else {
            return;
        };
        match r {
            Response::Progress {
                job,
                stage,
                fraction,
            } => {
                if let Some(w) = &mut self.what_if
                    && w.job == job
                {
                    if w.cancelled {
                        return;
                    }
                    w.progress = Some((stage.clone(), fraction));
                }
                if self.load_job == Some(job) {
                    crate::gui::io::mark_progress(&stage, fraction);
                }
                self.progress = Some((job, stage, fraction));
            }
            Response::Recorded { job, recorded } => {
                if self.load_job == Some(job) {
                    self.recorded = Some(state::RecordedView::new(job, *recorded));
                }
            }
            Response::Loaded {
                job,
                trace,
                main_answered,
            } => {
                if self.load_job != Some(job) {
                    return;
                }
                // The main replay and its layout on the way unasked, or none.
                let answered = self.main_answer.take().filter(|(j, _)| *j == job);
                self.main_answer = answered.filter(|_| main_answered);
                self.load_job = None;
                #[cfg(feature = "cuda")]
                self.live.loaded();
                self.timeline.overlays.clear();
                // A new file sets the configuration; another device of the same file keeps
                // it, its capacity as recorded being that device's.
                if let Some(o) = self.opening.take() {
                    self.side_panel_reset = true;
                    self.config.model = "pytorch".into();
                    self.config.conf.clear();
                    self.config.compare = o.compare;
                    self.config.program_cap_bytes = o.program_cap_bytes;
                    self.config
                        .set_capacity(o.capacity, trace.recorded_capacity.as_ref());
                } else {
                    self.config
                        .resolve_capacity(trace.recorded_capacity.as_ref());
                }
                self.what_if = None;
                self.runtimes = None;
                self.explained = None;
                // The band quads are built once the stacked view is shown, a slice per
                // frame (`build_bands`).
                // The recorded timeline goes per op before the document is drawn, unless
                // the main configuration's layout comes first (`settle_recorded`).
                let recorded = self.recorded.take().filter(|r| r.job == job);
                let trace = Arc::new(*trace);
                let mut doc = Document::new(Arc::clone(&trace));
                let recorded = recorded.filter(|r| r.is_of(&trace));
                // Until the main replay puts it on its OOM or peak, the cursor shows the
                // recorded end state (after the last op).
                self.cursor = if recorded.is_some() {
                    trace.ops.len().saturating_sub(1) as u32
                } else {
                    0
                };
                doc.recorded_entries = recorded;
                self.doc = Some(doc);
                self.cursor_pending = true;
                // The new document's first layout is marked even at the op marked last.
                self.marked_layout = None;
                self.timeline.view = None;
                if self.timeline.axis == crate::gui::views::timeline::Axis::Time
                    && self.doc.as_ref().is_some_and(|d| d.seconds().is_empty())
                {
                    self.timeline.axis = crate::gui::views::timeline::Axis::Events;
                }
                self.map = crate::gui::views::map::MapState::default();
                self.search = SearchState {
                    text: self.search.text.clone(),
                    ..SearchState::default()
                };
                self.selected_alloc = None;
                self.bands_highlight = QuadSet::default();
                self.resimulate();
                // The bands wait for every configuration's first frame
                // ([`AllocsimApp::after_main_frame`]).
                self.apply_search();
            }
            Response::Bands { job, bands } => {
                if let Some(doc) = &mut self.doc
                    && doc.bands_job == Some(job)
                {
                    doc.bands_job = None;
                    doc.set_bands(bands);
                }
            }
            Response::Replayed { job, slot, replay } => {
                let Some(doc) = &mut self.doc else { return };
                let Some(s) = doc.slots.get_mut(slot as usize) else {
                    return;
                };
                if s.replay_job != Some(job) {
                    return;
                }
                s.replay_job = None;
                s.replay = Some(ReplayView::new(*replay));
                s.layout = None;
                s.nearby.clear();
                if slot == 0 && self.cursor_pending {
                    // On the first OOM (recorded or not), else at the peak.
                    self.cursor_pending = false;
                    // Where the engine put the layout asked for with the replay
                    // (`Request::StartLayout`).
                    self.cursor = s.replay.as_ref().map_or(0, |r| r.data.start_op());
                }
                if slot == 0 {
                    self.peak_sites = None;
                }
            }
            Response::Layout { job, slot, layout } => {
                let Some(doc) = &mut self.doc else { return };
                let Some(s) = doc.slots.get_mut(slot as usize) else {
                    return;
                };
                if s.layout_job.map(|(j, _)| j) != Some(job) {
                    // A layout asked for in the background, kept for the keys.
                    s.nearby.answer(job, *layout);
                    return;
                }
                s.layout_job = None;
                // Asked for with a replay that failed (the engine may hold an earlier
                // one): not this configuration's.
                if s.replay.is_none() {
                    return;
                }
                self.show_layout(slot as usize, *layout);
            }
            Response::AddressHits { job, hits, .. } => {
                if self.search.job == Some(job) {
                    self.search.job = None;
                    self.search.hits = hits;
                }
            }
            Response::MinCapacity { job, slot, bytes } => {
                if let Some(s) = self
                    .doc
                    .as_mut()
                    .and_then(|d| d.slots.get_mut(slot as usize))
                    && s.min_capacity_job == Some(job)
                {
                    s.min_capacity_job = None;
                    s.min_capacity = Some(Ok(bytes));
                }
            }
            Response::WhatIf { job, answer } => {
                if let Some(w) = &mut self.what_if
                    && w.job == job
                    && !w.cancelled
                {
                    w.progress = None;
                    w.answer = Some(*answer);
                }
            }
            Response::Runtimes { job, rows } => {
                if let Some(r) = &mut self.runtimes
                    && r.job == job
                {
                    r.rows = Some(Ok(rows));
                }
            }
            Response::Explained {
                job,
                op_index,
                explanation,
            } => {
                let Some(x) = &mut self.explained else { return };
                if x.job != job {
                    return;
                }
                if let Some(doc) = &self.doc {
                    x.blocker_allocs = explanation
                        .blockers
                        .iter()
                        .flat_map(|b| &b.events)
                        .filter_map(|&e| state::op_of_event(&doc.trace, e))
                        .filter(|&op| doc.trace.ops.is_alloc(op as usize))
                        .collect();
                }
                x.answer = Some(Ok((op_index, explanation)));
                self.refresh_highlight();
            }
            Response::CsvPiece { job, bytes, done } => self.on_csv_piece(job, &bytes, done),
            Response::Bounds { job, bounds } => {
                if let Some(doc) = &mut self.doc
                    && doc.bounds_job == Some(job)
                {
                    doc.bounds_job = None;
                    doc.bounds = Some(bounds);
                }
            }
            // Taken by the Diff and Ranks views above; the sweep's parts by the host.
            Response::Diffed { .. }
            | Response::Ranked { .. }
            | Response::RankDone { .. }
            | Response::SweepSizes { .. }
            | Response::SweepReplayed { .. }
            | Response::SharedTrace { .. } => {}
            Response::Failed { job, message } => {
                if self.load_job == Some(job) {
                    self.load_job = None;
                    self.opening = None;
                    self.recorded = None;
                    crate::gui::io::mark_frame(&format!("failed:{message}"));
                    self.errors.push(message);
                    return;
                }
                if self.search.job == Some(job) {
                    self.search.job = None;
                }
                if self.csv_export.as_ref().is_some_and(|(j, _)| *j == job) {
                    self.csv_export = None;
                    self.errors
                        .push(format!("cannot export the CSV: {message}"));
                    return;
                }
                if let Some(w) = &mut self.what_if
                    && w.job == job
                {
                    w.progress = None;
                    if !w.cancelled {
                        w.error = Some(message);
                    }
                    return;
                }
                if let Some(r) = &mut self.runtimes
                    && r.job == job
                {
                    r.rows = Some(Err(message));
                    return;
                }
                if let Some(x) = &mut self.explained
                    && x.job == job
                {
                    x.answer = Some(Err(message));
                    return;
                }
                if let Some(doc) = &mut self.doc
                    && (doc.bounds_job == Some(job) || doc.bands_job == Some(job))
                {
                    doc.bounds_job = doc.bounds_job.filter(|&j| j != job);
                    doc.bands_job = doc.bands_job.filter(|&j| j != job);
                    return;
                }
                if let Some(doc) = &mut self.doc {
                    for s in &mut doc.slots {
                        if s.replay_job == Some(job) {
                            s.replay_job = None;
                            s.error = Some(message.clone());
                            self.errors.push(message.clone());
                        }
                        if s.min_capacity_job == Some(job) {
                            s.min_capacity_job = None;
                            s.min_capacity = Some(Err(message.clone()));
                        }
                        if s.layout_job.map(|(j, _)| j) == Some(job) {
                            s.layout_job = None;
                            // The replay's own error, where it failed, says more.
                            s.error.get_or_insert_with(|| message.clone());
                        }
                        s.nearby.asked.retain(|&(j, _)| j != job);
                    }
                }
            }
        }
    }

    /// Shows `layout` as slot `slot`'s (the layout it replaces is kept for the keys).
    fn show_layout(&mut self, slot: usize, layout: LayoutData) {
        let Some(doc) = &mut self.doc else { return };
        let trace = doc.trace.clone();
        let Some(s) = doc.slots.get_mut(slot) else {
            return;
        };
        let hl = highlighter(&trace, &self.search, self.selected_alloc);
        let mut view = LayoutView::new(layout, &hl);
        if slot == 0 {
            view.set_blockers(&blocker_picker(self.explained.as_ref()));
        }
        if let Some(old) = s.layout.replace(view) {
            s.nearby.keep(old.data);
        }
        if slot == 0 {
            // The main configuration's own layout replaces the recorded end state.
            doc.recorded = None;
            doc.recorded_entries = None;
        }
    }

    /// Shows the layouts at the cursor that were asked for in the background: a key then
    /// shows its layout in the frame that moves the cursor (called before the frame is
    /// drawn).
    pub(crate) fn show_nearby_layouts(&mut self) {
        let cursor = self.cursor;
        let n = self.doc.as_ref().map_or(0, |d| d.slots.len());
        for i in 0..n {
            let kept = self.doc.as_mut().and_then(|d| {
                let s = &mut d.slots[i];
                let stale = s.replay.is_some()
                    && s.error.is_none()
                    && s.layout.as_ref().is_none_or(|l| l.data.op != cursor);
                if !stale {
                    return None;
                }
                let l = s.nearby.take(cursor)?;
                // The request in flight for another op is moot.
                s.layout_job = None;
                Some(l)
            });
            if let Some(l) = kept {
                self.show_layout(i, l);
            }
        }
    }

    /// Asks for the layout at the cursor of every slot whose layout is stale (one request
    /// in flight per slot: while scrubbing, the newest cursor wins); a layout kept for the
    /// keys is shown by the next frame instead. Once every slot shows the cursor's
    /// layout, asks in the background for the layouts one key away.
    pub(crate) fn request_layouts(&mut self, ctx: &egui::Context) {
        let cursor = self.cursor;
        let mut reqs = Vec::new();
        let mut kept = false;
        if let Some(doc) = &self.doc {
            for (i, s) in doc.slots.iter().enumerate() {
                if s.replay.is_some()
                    && s.error.is_none()
                    && s.layout.as_ref().is_none_or(|l| l.data.op != cursor)
                {
                    if s.nearby.layouts.iter().any(|l| l.op == cursor) {
                        kept = true;
                    } else if s.layout_job.is_none() {
                        reqs.push(i);
                    }
                }
            }
        }
        if kept {
            ctx.request_repaint();
        }
        if !reqs.is_empty() {
            // The background requests not sent yet would only delay these.
            self.engine.send_background(Vec::new());
            if let Some(doc) = &mut self.doc {
                for s in &mut doc.slots {
                    s.nearby.asked.clear();
                }
            }
            self.nearby_for = None;
        }
        for i in reqs {
            let job = self.job();
            if let Some(doc) = &mut self.doc {
                doc.slots[i].layout_job = Some((job, cursor));
            }
            self.engine.send(Request::Layout {
                job,
                slot: i as u32,
                op: cursor,
            });
        }
        self.prefetch_layouts();
    }

    /// With every slot's layout at the cursor on screen, asks in the background (one
    /// request at a time, after any other, answers that wake no frame) for each slot's
    /// layouts at the events one key away ([`AllocsimApp::key_targets`]) that it does
    /// not keep; once per cursor.
    fn prefetch_layouts(&mut self) {
        let cursor = self.cursor;
        let Some(doc) = &self.doc else { return };
        let settled = !doc.slots.is_empty()
            && doc.slots.iter().all(|s| {
                s.error.is_some()
                    || (s.replay.is_some()
                        && s.layout_job.is_none()
                        && s.layout.as_ref().is_some_and(|l| l.data.op == cursor))
            });
        if !settled || self.load_job.is_some() {
            return;
        }
        let targets = self.key_targets(doc);
        let key = (doc.slots.len(), targets);
        if self.nearby_for == Some(key) {
            return;
        }
        self.nearby_for = Some(key);
        let mut reqs = Vec::new();
        let n = doc.slots.len();
        // This batch replaces the one before, answered or not.
        if let Some(doc) = &mut self.doc {
            for s in &mut doc.slots {
                s.nearby.asked.clear();
            }
        }
        for op in targets {
            for i in 0..n {
                let wanted = self.doc.as_ref().is_some_and(|d| {
                    let s = &d.slots[i];
                    op != cursor && s.error.is_none() && !s.nearby.has(op)
                });
                if !wanted {
                    continue;
                }
                let job = self.job();
                let Some(s) = self.doc.as_mut().map(|d| &mut d.slots[i]) else {
                    return;
                };
                s.nearby.ask(job, op);
                reqs.push(Request::Layout {
                    job,
                    slot: i as u32,
                    op,
                });
            }
        }
        self.engine.send_background(reqs);
    }

    /// Asks for the min capacity of every replayed slot that lacks one (the compare table).
    pub fn request_min_capacities(&mut self) {
        let n = self.doc.as_ref().map_or(0, |d| d.slots.len());
        for i in 0..n {
            let spec = match self.doc.as_ref().map(|d| &d.slots[i]) {
                Some(s)
                    if s.replay.is_some()
                        && s.min_capacity.is_none()
                        && s.min_capacity_job.is_none() =>
                {
                    s.spec.clone()
                }
                _ => continue,
            };
            let job = self.job();
            if let Some(doc) = &mut self.doc {
                doc.slots[i].min_capacity_job = Some(job);
            }
            self.engine.send(Request::MinCapacity {
                job,
                slot: i as u32,
                spec,
            });
        }
    }

    /// Asks which configurations would fit under the current capacity.
    pub fn request_what_if(&mut self) {
        let job = self.job();
        let capacity_bytes = self.config.capacity_bytes();
        self.what_if = Some(WhatIf {
            job,
            capacity_bytes,
            progress: None,
            answer: None,
            cancelled: false,
            error: None,
        });
        self.engine.send(Request::WhatIf {
            job,
            capacity_bytes,
        });
    }

    /// Stops the what-if sweep in flight (natively the engine skips the replays not yet
    /// started; the browser terminates the search worker running it, `gui::workers`).
    pub fn cancel_what_if(&mut self) {
        if let Some(w) = &mut self.what_if
            && w.running()
        {
            w.cancelled = true;
            w.progress = None;
            if self.progress.as_ref().is_some_and(|p| p.0 == w.job) {
                self.progress = None;
            }
            self.engine.send(Request::Cancel { job: w.job });
        }
    }

    /// Asks for the other runtimes under the current capacity (the Compare tab), once per
    /// capacity.
    pub fn request_runtimes(&mut self) {
        let capacity_bytes = self.config.capacity_bytes();
        if self.doc.is_none()
            || self
                .runtimes
                .as_ref()
                .is_some_and(|r| r.capacity_bytes == capacity_bytes)
        {
            return;
        }
        let job = self.job();
        self.runtimes = Some(Runtimes {
            job,
            capacity_bytes,
            rows: None,
        });
        self.engine.send(Request::Runtimes {
            job,
            capacity_bytes,
        });
    }
}
