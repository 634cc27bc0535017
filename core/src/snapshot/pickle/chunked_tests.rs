//! The second pass on several threads over a file read where it lies: the serial
//! decode's snapshot, or `None` (decode it the streamed way) for anything else.

use super::super::parallel::Plan;
use super::decode;

const SMALL: Plan = Plan {
    threads: 3,
    chunk_bytes: 2048,
    batch_step: 256,
};

/// Reads `data` as a file is read where it lies.
pub(in crate::snapshot::pickle) fn read_at(
    data: &[u8],
) -> impl Fn(u64, &mut [u8]) -> std::io::Result<()> + Sync + '_ {
    move |at, buf| {
        let from = usize::try_from(at).map_err(std::io::Error::other)?;
        let got = data
            .get(from..from + buf.len())
            .ok_or_else(|| std::io::Error::other("past the end"))?;
        buf.copy_from_slice(got);
        Ok(())
    }
}

/// The chunked decode of `data` (`None`: not decoded this way) against the serial one.
fn chunked(data: &[u8], plan: Plan) -> Option<usize> {
    let r = decode(&read_at(data), data.len() as u64, plan, &mut |_, _| true)?;
    let (snap, merged) = r.expect("decodes");
    let serial = super::super::decode_serial(data).expect("the serial decode too");
    assert_eq!(format!("{serial:?}"), format!("{snap:?}"));
    Some(merged)
}

#[test]
fn the_corpus_decodes_the_same_chunked_from_where_it_lies() {
    let files = super::super::parallel::tests::corpus();
    if files.is_empty() {
        println!("skipped: ../shared/traces is absent");
        return;
    }
    let mut merged_files = 0;
    for (p, data) in &files {
        for threads in [1, 3] {
            let plan = Plan { threads, ..SMALL };
            if let Some(n) = chunked(data, plan) {
                println!("{p}: {n} chunks ({threads} threads)");
                assert!(n > 0);
                merged_files += usize::from(threads == 3);
            }
        }
    }
    println!("{merged_files} files decoded in chunks");
    assert!(merged_files >= 9, "{merged_files}");
}

#[test]
fn bad_input_is_left_to_the_streamed_decode() {
    let data = super::super::parallel::tests::written();
    assert!(chunked(&data, SMALL).is_some_and(|n| n > 4));
    // Truncated: not decoded this way (the streamed decode reports it).
    for cut in [data.len() / 2, data.len() - 2] {
        let part = &data[..cut];
        assert!(
            decode(&read_at(part), part.len() as u64, SMALL, &mut |_, _| true).is_none(),
            "cut at {cut}"
        );
    }
    // A GET of a slot never stored, inside a chunk.
    let mid = data.len() / 2;
    let at = (mid..data.len())
        .find(|&i| data[i] == b'j')
        .expect("a LONG_BINGET");
    let mut bad = data.clone();
    bad[at + 1..at + 5].copy_from_slice(&0x7fff_fff0u32.to_le_bytes());
    assert!(decode(&read_at(&bad), bad.len() as u64, SMALL, &mut |_, _| true).is_none());
    // A read that fails.
    let failing = |_: u64, _: &mut [u8]| Err(std::io::Error::other("gone"));
    assert!(decode(&failing, data.len() as u64, SMALL, &mut |_, _| true).is_none());
}

#[test]
fn a_cancel_is_reported() {
    let data = super::super::parallel::tests::written();
    let r = decode(&read_at(&data), data.len() as u64, SMALL, &mut |pass, _| {
        pass < 2
    });
    assert!(matches!(
        r,
        Some(Err(crate::snapshot::ImportError::Cancelled))
    ));
}

/// A cancel in the first pass (read ahead on its own thread) stops it there, its reader
/// with it.
#[test]
fn a_cancel_in_the_first_pass_is_reported() {
    let data = super::super::parallel::tests::written();
    let mut calls = 0;
    let r = decode(&read_at(&data), data.len() as u64, SMALL, &mut |pass, _| {
        calls += 1;
        pass != 1
    });
    assert!(matches!(
        r,
        Some(Err(crate::snapshot::ImportError::Cancelled))
    ));
    assert_eq!(calls, 1);
}
