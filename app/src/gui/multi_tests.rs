//! The Diff and Ranks views driven headless (`egui_kittest`, the engine inline) on the
//! real recordings of `tests/traces/diff` and `tests/traces/ranks`.

use egui_kittest::kittest::Queryable;

use crate::gui::Startup;
use crate::gui::io::Opened;
use crate::gui::tests::{harness, has_text, settle};
use crate::gui::views::multi::MultiView;

fn opened(sub: &str, name: &str) -> Opened {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/traces")
        .join(sub)
        .join(name);
    Opened {
        name: name.to_string(),
        bytes: std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
        file: None,
    }
}

#[test]
fn the_diff_view_shows_the_input_that_grew_and_follows_the_axis() {
    let mut h = harness(Startup::Empty);
    {
        let app = h.state_mut();
        app.multi.view = Some(MultiView::Diff);
        app.multi.add(opened("diff", "diff_train_bs256.pickle.gz"));
        app.multi.add(opened("diff", "diff_train_bs1024.pickle.gz"));
    }
    settle(&mut h);
    let d = match &h.state().multi.diff {
        Some(Ok(d)) => d.diff.clone(),
        other => panic!("no diff: {other:?}"),
    };
    assert_eq!(d.by_site[0].delta_bytes, (1024 - 256) * 4096 * 4);
    assert!(has_text(&h, "B peaks 152.00 MiB higher"));
    assert!(has_text(&h, &d.by_site[0].site));
    assert!(has_text(&h, "+12.00 MiB"));
    assert!(has_text(&h, "Settings: the same"));
    // Another axis: asked again, the peaks now on the event axis.
    h.get_by_label("Events").click();
    settle(&mut h);
    let d = match &h.state().multi.diff {
        Some(Ok(d)) => d.diff.clone(),
        other => panic!("no diff: {other:?}"),
    };
    assert_eq!(d.align, allocsim_core::diff::Align::Events);
    assert_eq!(Some(d.a.peak_at as u64), d.a.peak_event);
    // The reduced curves keep each run's peak.
    let curves = match &h.state().multi.diff {
        Some(Ok(x)) => x.curves.clone(),
        _ => unreachable!(),
    };
    assert_eq!(
        curves[1].reserved_bytes.iter().max(),
        Some(&d.b.peak_reserved_bytes)
    );
}

#[test]
fn the_ranks_view_names_the_outlier_marks_the_unreadable_file_and_opens_a_rank() {
    let mut h = harness(Startup::Empty);
    {
        let app = h.state_mut();
        app.multi.view = Some(MultiView::Ranks);
        for r in 0..4 {
            app.multi
                .add(opened("ranks", &format!("ddp4_rank{r}.pickle.gz")));
        }
        app.multi.add(Opened {
            name: "ddp4_rank4.pickle.gz".into(),
            bytes: b"\x1f\x8b\x08\x00broken".to_vec(),
            file: None,
        });
    }
    settle(&mut h);
    let data = h.state().multi.ranks.clone().expect("ranks");
    let report = data.report.expect("the readable ranks");
    assert_eq!(report.ranks.len(), 4);
    assert_eq!(report.outlier.as_ref().map(|o| o.rank), Some(2));
    assert_eq!(data.failed.len(), 1);
    assert_eq!(data.failed[0].rank, 4);
    assert!(has_text(&h, "Rank 2 is the outlier"));
    assert!(has_text(&h, "expandable_segments:True fits on 4/4"));
    assert!(has_text(&h, "<- outlier"));
    assert!(has_text(&h, "rank 4 unreadable"));
    // Clicking a row opens that rank as the trace.
    h.get_by_label("ddp4_rank2.pickle.gz").click();
    settle(&mut h);
    let app = h.state();
    assert_eq!(app.multi.view, None);
    let doc = app.document().expect("the rank opened");
    assert_eq!(doc.trace.name, "ddp4_rank2.pickle.gz");
    assert!(app.errors.is_empty(), "{:?}", app.errors);
}

#[test]
fn curves_map_onto_the_plot_with_the_highest_peak_at_the_top() {
    use crate::engine::wire::CurveData;
    use crate::gui::views::diff::{extent, points_from_curve};
    let c = |x: &[f64], r: &[u64]| CurveData {
        x: x.to_vec(),
        reserved_bytes: r.to_vec(),
        allocated_bytes: r.to_vec(),
    };
    let curves = [
        c(&[0.0, 1.0, 2.0], &[0, 50, 100]),
        c(&[1.0, 4.0], &[20, 200]),
    ];
    let (x0, x1, y) = extent(&curves);
    assert_eq!((x0, x1, y), (0.0, 4.0, 200));
    let rect = egui::Rect::from_min_size(egui::pos2(10.0, 20.0), egui::vec2(400.0, 100.0));
    let p = points_from_curve(&curves[1].x, &curves[1].reserved_bytes, rect, x0, x1, y);
    assert_eq!(p[1], egui::pos2(410.0, 20.0));
    assert_eq!(p[0], egui::pos2(110.0, 110.0));
}

#[test]
fn opening_several_files_starts_a_diff_for_two_and_ranks_for_more() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/traces");
    let h = harness(Startup::Files(vec![
        dir.join("diff/diff_train_bs256.pickle.gz"),
        dir.join("diff/diff_train_bs256_expand.pickle.gz"),
    ]));
    let m = &h.state().multi;
    assert_eq!(m.view, Some(MultiView::Diff));
    let Some(Ok(d)) = &m.diff else {
        panic!("no diff: {:?}", m.diff.as_ref().map(|d| d.as_ref().err()));
    };
    assert_eq!(d.diff.settings_differ.len(), 1);
    assert!(has_text(
        &h,
        "settings differ: expandable_segments default -> True"
    ));
    let h = harness(Startup::Files(
        (0..3)
            .map(|r| dir.join(format!("ranks/ddp4_rank{r}.pickle.gz")))
            .collect(),
    ));
    let m = &h.state().multi;
    assert_eq!(m.view, Some(MultiView::Ranks));
    let report = m
        .ranks
        .as_ref()
        .and_then(|r| r.report.as_ref())
        .expect("ranks");
    assert_eq!(report.ranks.len(), 3);
    // Of 184, 184 and 292 MiB the median is 184 MiB: rank 2 is 59 % above it.
    assert_eq!(report.outlier.as_ref().map(|o| o.rank), Some(2));
}
