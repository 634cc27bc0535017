//! A frames list run as one step ([`Vm::frames_list`]) decodes as the opcodes run one by
//! one do: the same snapshot, tables and their numbering included, or the same error.

use super::{FAST_FRAMES, FAST_TAKEN};
use crate::snapshot::RawSnapshot;
use crate::snapshot::error::ImportError;
use crate::snapshot::import::DecodeOptions;
use crate::snapshot::stream::StreamDecoder;

/// `decode` of `data` with the fast path and without it, each as its `Debug` or error.
fn both(
    data: &[u8],
    decode: &dyn Fn(&[u8]) -> Result<RawSnapshot, ImportError>,
) -> [Result<String, String>; 2] {
    both_ways(&FAST_FRAMES, data, decode)
}

/// `decode` of `data` with the fast path that `switch` turns on and off taken and not,
/// each as its `Debug` or error.
pub(in crate::snapshot::pickle) fn both_ways(
    switch: &'static std::thread::LocalKey<std::cell::Cell<bool>>,
    data: &[u8],
    decode: &dyn Fn(&[u8]) -> Result<RawSnapshot, ImportError>,
) -> [Result<String, String>; 2] {
    [true, false].map(|fast| {
        switch.with(|f| f.set(fast));
        let r = decode(data);
        switch.with(|f| f.set(true));
        r.map(|s| format!("{s:?}")).map_err(|e| e.to_string())
    })
}

/// How many frames lists took the fast path since the last call.
fn taken() -> usize {
    FAST_TAKEN.with(|n| n.replace(0))
}

/// The streamed decode of `data` fed in pieces of `piece` bytes: a plain pickle of up to
/// 64 MiB in the single pass, its windows ending wherever the pieces do.
pub(in crate::snapshot::pickle) fn streamed(
    data: &[u8],
    piece: usize,
) -> Result<RawSnapshot, ImportError> {
    let mut dec = StreamDecoder::new(data.len() as u64, DecodeOptions::default());
    loop {
        for p in data.chunks(piece) {
            dec.feed(p)?;
        }
        if let Some(snap) = dec.end_of_input_with(&mut |_| true)? {
            return Ok(snap);
        }
    }
}

/// The streamed decode of `data` in two passes always ([`PickleStream::new`], its size
/// known up front or, `known` false, only at its end, as a gzip file's), fed in pieces of
/// `piece` bytes, its second pass run over windows of about `step` bytes; and the passes
/// it took (3 where the second ran once more).
///
/// [`PickleStream::new`]: super::super::PickleStream::new
pub(in crate::snapshot::pickle) fn two_passes(
    data: &[u8],
    piece: usize,
    step: u64,
    known: bool,
) -> (Result<RawSnapshot, ImportError>, u8) {
    let mut s = super::super::PickleStream::new(known.then_some(data.len() as u64), step);
    for pass in 1..=3 {
        for p in data.chunks(piece.max(1)) {
            if let Err(e) = s.feed(p) {
                return (Err(e), pass);
            }
        }
        match s.end_pass() {
            Ok(None) => {}
            Ok(Some(snap)) => return (Ok(snap), pass),
            Err(e) => return (Err(e), pass),
        }
    }
    panic!("a fourth pass asked for");
}

#[test]
fn the_corpus_decodes_alike_with_frames_lists_run_as_one_step() {
    let files = super::super::parallel::tests::corpus();
    if files.is_empty() {
        println!("skipped: ../shared/traces is absent");
        return;
    }
    let _ = taken();
    for (name, data) in &files {
        let [fast, slow] = both(data, &|d| super::super::decode_serial(d));
        assert!(fast.is_ok(), "{name}: {fast:?}");
        assert_eq!(fast, slow, "{name}: the two passes");
        for piece in [997, 1 << 20] {
            let [fast, slow] = both(data, &|d| streamed(d, piece));
            assert_eq!(fast, slow, "{name}: the single pass in pieces of {piece}");
        }
    }
    assert!(taken() > 1000, "real snapshots' frames lists take it");
}

/// `pickle.dumps(snap, protocol=4)` by `CPython` 3.11 of a snapshot of five entries: the
/// first one's frames list holds the two frame dicts themselves (made there: not the fast
/// path's), the second reads that very list back (`BINGET 14`), the third's list reads
/// both frames back (the fast path's), the fourth's has one frame (`APPEND`), the
/// fifth's none.
const SHARED_LIST: &str = "8004953e010000000000007d94288c087365676d656e7473945d948c0d6465766963655f747261636573945d945d94287d94288c06616374696f6e948c05616c6c6f63948c0461646472944d00108c0473697a65944d00028c0673747265616d944b008c0774696d655f7573944d00108c066672616d6573945d94287d94288c046e616d65948c026630948c0866696c656e616d65948c086d6f64656c2e7079948c046c696e65944b01757d942868108c026631946812681368144b027565757d94286807680868094d0020680a4d0002680b4b00680c4d0020680d680e757d94286807680868094d0030680a4d0002680b4b00680c4d0030680d5d94286815680f65757d94286807680868094d0040680a4d0002680b4b00680c4d0040680d5d94680f61757d94286807680868094d0050680a4d0002680b4b00680c4d0050680d5d94756561752e";

#[test]
fn a_list_read_back_and_lists_of_one_or_no_frame_decode_as_before() {
    let data: Vec<u8> = (0..SHARED_LIST.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&SHARED_LIST[i..i + 2], 16).expect("hex"))
        .collect();
    let _ = taken();
    let [fast, slow] = both(&data, &|d| super::super::decode_serial(d));
    assert_eq!(taken(), 1, "the third entry's list");
    let fast = fast.expect("decodes");
    assert_eq!(Ok(fast.clone()), slow);
    for piece in [1, 5, 64, data.len()] {
        let [f, s] = both(&data, &|d| streamed(d, piece));
        assert_eq!(f.as_ref(), Ok(&fast), "pieces of {piece}");
        assert_eq!(f, s);
    }
    let snap = super::super::decode_serial(&data).expect("decodes");
    let stacks: Vec<usize> = snap.device_traces[0]
        .iter()
        .map(|e| snap.frames.stack(e.stack).len())
        .collect();
    assert_eq!(stacks, [2, 2, 2, 1, 0]);
    assert_ne!(
        snap.device_traces[0][0].stack, snap.device_traces[0][2].stack,
        "reversed"
    );
}

/// `n` frames `f0`, `f1`, … of `model.py` (lines 0, 1, …) in `snap`'s table, for the
/// hand-built snapshots the fast paths' tests write.
pub(in crate::snapshot::pickle) fn model_frames(
    snap: &mut RawSnapshot,
    n: i64,
) -> Vec<crate::snapshot::FrameId> {
    let t = &mut snap.frames;
    let file = t.intern_str("model.py");
    (0..n)
        .map(|k| {
            let name = t.intern_str(&format!("f{k}"));
            t.intern_frame(crate::snapshot::Frame {
                name,
                filename: file,
                line: k,
                line_text: None,
                fx: 0,
            })
        })
        .collect()
}

/// Lists the fast path must leave to the loop, around real ones: a frames list read back
/// by a later `BINGET` (the same list object twice), a list whose slots hold no frame, a
/// one-frame list (`APPEND`), an empty one, and a file cut inside a list.
#[test]
fn lists_it_does_not_take_decode_as_before() {
    use crate::snapshot::write::snapshot_bytes;
    use crate::snapshot::{Action, RawEvent, StackId};
    let mut snap = RawSnapshot::default();
    let frames = model_frames(&mut snap, 4);
    let stacks = [
        snap.frames.intern_stack(&frames),
        snap.frames.intern_stack(&frames[1..2]),
        StackId::EMPTY,
        snap.frames.intern_stack(&frames[..3]),
    ];
    let mut events = Vec::new();
    for (k, s) in stacks.iter().cycle().take(40).enumerate() {
        let mut e = RawEvent::new(Action::Alloc, 0x1000 * (k as u64 + 1), 512, 0);
        e.stack = *s;
        events.push(e);
    }
    snap.device_traces = vec![events];
    let data = snapshot_bytes(&snap);
    let [fast, slow] = both(&data, &|d| super::super::decode_serial(d));
    assert!(fast.is_ok(), "{fast:?}");
    assert_eq!(fast, slow);
    for cut in [data.len() / 3, data.len() / 2, data.len() - 5] {
        let [fast, slow] = both(&data[..cut], &|d| super::super::decode_serial(d));
        assert!(fast.is_err());
        assert_eq!(fast, slow, "cut at {cut}");
    }
    for piece in [1, 7, 64] {
        let [fast, slow] = both(&data, &|d| streamed(d, piece));
        assert_eq!(fast, slow, "pieces of {piece}");
    }
}
