//! Conservation in the stacked view: in every pixel column the drawn stack is the highest
//! live requested bytes of the replay over the column's ops, within one pixel, at every
//! level of detail, zoom and axis — on big traces (a million-event workload, the largest
//! real snapshot) and on a hand-built spike.

use std::sync::Arc;

use super::*;
use crate::engine::Engine;
use crate::engine::bands::live_bytes_per_op;
use crate::engine::wire::{Request, Response, TraceData};
use crate::gui::state::{Document, MIB};
use crate::gui::theme;
use crate::gui::views::timeline::{Axis, TimelineState};

fn answer(engine: &mut Engine, req: Request) -> Response {
    let mut out = Vec::new();
    engine.handle(req, &mut |r| out.push(r));
    out.pop().expect("the engine answers every request")
}

/// The trace and its PyTorch replay's requested bytes per op, read back from the
/// engine's CSV export (the app's replays keep no requested column).
fn loaded(req: Request) -> (TraceData, Vec<u64>) {
    let mut e = Engine::new();
    let mut trace = match answer(&mut e, req) {
        Response::Loaded { trace, .. } => *trace,
        other => panic!("{other:?}"),
    };
    trace.bands = match answer(&mut e, Request::Bands { job: 3 }) {
        Response::Bands { bands, .. } => bands,
        other => panic!("{other:?}"),
    };
    let mut csv = Vec::new();
    e.handle(
        Request::ExportCsv {
            job: 4,
            spec: "pytorch".into(),
            capacity_bytes: None,
        },
        &mut |r| match r {
            Response::CsvPiece { bytes, .. } => csv.extend(bytes),
            Response::Progress { .. } => {}
            other => panic!("{other:?}"),
        },
    );
    let csv = String::from_utf8(csv).expect("UTF-8");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    let col = header
        .iter()
        .position(|&h| h == "requested_bytes")
        .expect("a requested_bytes column");
    let requested = lines
        .map(|l| {
            l.split(',')
                .nth(col)
                .expect("a field")
                .parse()
                .expect("bytes")
        })
        .collect();
    (trace, requested)
}

/// The document with its band quads as the browser draws them: made from the pieces.
fn document(trace: TraceData) -> Document {
    let mut doc = Document::new(Arc::new(trace));
    assert!(doc.build_bands(std::time::Duration::ZERO, false));
    doc
}

/// Checks every column of `doc`'s stacked view for views zoomed around the replay's peak,
/// plot sizes, both axes (time where the trace has it) and levels of detail: nothing
/// drawn, the view's own level, every 16th piece, everything. Returns the columns checked.
fn check_conservation(doc: &Document, requested: &[u64]) -> usize {
    let ops = &doc.trace.ops;
    let quads = doc.bands.to_vec(0..doc.bands.len());
    let live = live_bytes_per_op(ops);
    // The stack's top is the replay's live requested bytes, op by op.
    assert_eq!(live.len(), requested.len());
    if let Some(k) = (0..live.len()).find(|&k| live[k] != requested[k]) {
        panic!(
            "op {k}: the stack holds {} bytes, the replay {}",
            live[k], requested[k]
        );
    }
    let peak = *requested.iter().max().unwrap();
    let peak_op = requested.iter().position(|&b| b == peak).unwrap() as f64;
    let n = ops.len() as f64;
    let mut checked = 0;
    let mut short_without_fold = 0;
    for axis in [Axis::Events, Axis::Time] {
        if axis == Axis::Time && doc.seconds().is_empty() {
            continue;
        }
        for &(w_px, h_px) in &[(1200usize, 400f32), (333, 150.0)] {
            for width in [n, n / 16.0, n / 1000.0, 40.0] {
                let mut st = TimelineState {
                    axis,
                    ..TimelineState::default()
                };
                let a = (peak_op - width / 2.0).clamp(0.0, n - width);
                st.view = match axis {
                    Axis::Events => Some((a, a + width)),
                    Axis::Time => {
                        let t = |op: f64| {
                            let s = doc.seconds();
                            s.get((op as usize).min(s.len() - 1)).expect("timed")
                        };
                        Some((t(a), t(a + width).max(t(a) + 1e-6)))
                    }
                };
                let columns = columns(&st, doc, w_px);
                let (olo, ohi) = st.ops_in(doc, st.visible(doc).0, st.visible(doc).1);
                let ymax = peak as f64 * 1.06;
                let pixel_mib = ymax / MIB / f64::from(h_px);
                let view_lod = drawn_prefix(
                    &doc.trace,
                    doc.bands.len(),
                    ohi - olo,
                    w_px as f32,
                    h_px,
                    ymax,
                    1.0,
                );
                let origin = st.visible(doc).0;
                let folded = folded_quads(doc.stack_top(), &columns, origin, theme::FOLDED);
                let all = doc.bands.len();
                for lod in [0, view_lod, all / 16, all] {
                    let quads = &quads[..lod];
                    let tops = drawn_tops(&folded, origin, quads, axis == Axis::Time, &columns);
                    let bare = drawn_tops(&[], 0.0, quads, axis == Axis::Time, &columns);
                    for (c, col) in columns.iter().enumerate() {
                        let max_of = |(lo, hi): (usize, usize)| {
                            requested[lo..hi.max(lo + 1).min(requested.len())]
                                .iter()
                                .max()
                                .map_or(0.0, |&b| b as f64 / MIB)
                        };
                        let want = max_of(col.ops);
                        // The band pieces keep their seconds as f32: on the time axis one may
                        // reach as far as f32's step at that time into a neighbouring column.
                        let reach = match axis {
                            Axis::Events => want,
                            Axis::Time => {
                                let step = f64::from(f32_step(col.x1 as f32));
                                max_of(st.ops_in(doc, col.x0 - step, col.x1 + step))
                            }
                        };
                        let got = f64::from(tops[c]);
                        assert!(
                            got >= want - pixel_mib && got <= reach + pixel_mib,
                            "{axis:?}, view {:?}, {w_px}x{h_px} px, {lod} of {all} pieces, \
                             column {c} (ops {:?}): drawn {got:.3} MiB, replay {want:.3} MiB",
                            st.view,
                            col.ops
                        );
                        if f64::from(bare[c]) < want - pixel_mib {
                            short_without_fold += 1;
                        }
                        checked += 1;
                    }
                }
                // Zoomed in to whole pixels per op, every piece drawn, the pieces alone stack
                // to the top too (on the event axis: the time axis keeps seconds as f32, whose
                // step at a minute is 4 µs, a few ops of a busy trace).
                if (ohi - olo) > w_px || axis == Axis::Time {
                    continue;
                }
                let bare = drawn_tops(&[], 0.0, &quads, axis == Axis::Time, &columns);
                for (c, col) in columns.iter().enumerate() {
                    // The op under the column's centre.
                    let centre = 0.5 * (col.x0 + col.x1);
                    let k = centre.floor() as usize;
                    let want = requested[k] as f64 / MIB;
                    assert!(
                        (f64::from(bare[c]) - want).abs() <= pixel_mib,
                        "{w_px} px, pieces alone, column {c} (op {k}): {} vs {want} MiB",
                        bare[c]
                    );
                }
            }
        }
    }
    // The levels of detail do leave pieces out: the folded band is what keeps the bytes.
    assert!(short_without_fold > 0);
    checked
}

/// The distance from `x` to the next f32.
fn f32_step(x: f32) -> f32 {
    f32::from_bits(x.abs().to_bits() + 1) - x.abs()
}

#[test]
fn a_million_event_workload_draws_every_byte_at_every_level_of_detail() {
    let (trace, requested) = loaded(Request::Workload {
        job: 1,
        spec: "kvcache:tokens=3000".into(),
    });
    assert!(trace.ops.len() >= 1_000_000, "{} ops", trace.ops.len());
    let doc = document(trace);
    let checked = check_conservation(&doc, &requested);
    assert!(checked > 10_000);
}

#[test]
fn the_largest_real_snapshot_draws_every_byte_at_every_level_of_detail() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/traces/big_gpt_long_stacks_s9.pickle.gz"
    );
    let Ok(bytes) = std::fs::read(path) else {
        println!("skipped: {path} not found");
        return;
    };
    let (trace, requested) = loaded(Request::Load {
        job: 1,
        name: "big_gpt_long_stacks_s9.pickle.gz".into(),
        bytes,
    });
    let doc = document(trace);
    assert!(!doc.seconds().is_empty(), "the snapshot has times");
    check_conservation(&doc, &requested);
}

/// Ops from a script: `a(size)` allocates, `f(i)` frees the alloc at op i.
fn ops(script: &[(char, u64)]) -> OpsTable {
    OpsTable::from_script(script)
}

#[test]
fn a_one_op_spike_left_out_by_the_level_of_detail_still_reaches_its_height() {
    // 1 MiB for 1000 ops, a 1 GiB spike for one op in the middle.
    let mut script = vec![('a', 1 << 20)];
    script.extend((0..500).map(|_| ('a', 0)));
    let spike = script.len();
    script.push(('a', 1 << 30));
    script.push(('f', spike as u64));
    script.extend((0..500).map(|_| ('a', 0)));
    let t = ops(&script);
    let bands = crate::engine::bands::build(&t);
    let mut doc = Document::new(Arc::new(TraceData {
        ops: t.clone().into(),
        bands: bands.into(),
        ..TraceData::default()
    }));
    while !doc.build_bands(std::time::Duration::from_mins(1), true) {}
    let st = TimelineState::default();
    let cols = columns(&st, &doc, 10);
    // At this zoom the spike (1 op of 1 GiB among 1002 ops over 10 pixels) is left out.
    let lod = drawn_prefix(
        &doc.trace,
        doc.bands.len(),
        t.len(),
        10.0,
        10.0,
        (1u64 << 31) as f64,
        1.0,
    );
    assert!(
        doc.trace.bands.pieces[..lod]
            .iter()
            .all(|p| p.alloc != spike as u32)
    );
    let folded = folded_quads(doc.stack_top(), &cols, 0.0, theme::FOLDED);
    let tops = drawn_tops(&folded, 0.0, &doc.bands.to_vec(0..lod), false, &cols);
    let spike_col = cols
        .iter()
        .position(|c| (c.ops.0..c.ops.1).contains(&spike))
        .unwrap();
    assert_eq!(
        tops[spike_col].to_bits(),
        1025f32.to_bits(),
        "1 GiB + 1 MiB"
    );
    assert_eq!(tops[0].to_bits(), 1f32.to_bits(), "1 MiB");
    // The hover names what is folded at the spike.
    assert_eq!(
        folded_at(&t, &doc.trace.bands.pieces[..lod], spike as u32),
        (2, (1 << 30) + (1 << 20))
    );
    assert_eq!(folded_at(&t, &doc.trace.bands.pieces, spike as u32), (0, 0));
}

#[test]
fn hovering_the_folded_band_says_how_many_allocations_and_bytes_it_holds() {
    use crate::gui::Startup;
    use crate::gui::tests::{harness, has_text, settle};
    use egui_kittest::kittest::Queryable;
    let mut h = harness(Startup::Empty);
    h.state_mut()
        .open_workload("churn:events=20000,live=300", None);
    settle(&mut h);
    h.get_by_label("Allocations").click();
    settle(&mut h);
    let plot = h.state().timeline.last_plot.expect("drawn");
    let doc = h.state().document().expect("generated");
    let all = doc.trace.bands.pieces.len();
    assert!(
        h.state().timeline.bands_drawn < all,
        "zoomed out, the small pieces are folded"
    );
    // Up the middle column from the bottom: some point is in the folded band.
    let x = plot.center().x;
    let mut y = plot.bottom() - 2.0;
    let mut found = false;
    while y > plot.top() && !found {
        h.hover_at(egui::pos2(x, y));
        h.step();
        h.step();
        found = has_text(&h, "folded: ");
        y -= 3.0;
    }
    assert!(
        found,
        "no folded allocation under the mouse up the middle column"
    );
    assert!(has_text(&h, "allocations") && has_text(&h, "live in all"));
}
