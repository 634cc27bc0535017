//! The streamed decode's reservation of a long device trace.

use super::{PickleStream, State};
use crate::snapshot::pickle::entry::ENTRIES_TAKEN;
use crate::snapshot::write::snapshot_bytes;
use crate::snapshot::{Action, RawEvent, RawSnapshot, decode_snapshot};

/// Over windows of 4 KiB the entries of each batch are run as one step up to the first
/// that a window cuts (the loop's dict is then on the stack, and the rest of the batch is
/// the loop's); over one window, all of them, the list's vector made by the first, without
/// the pre-pass's hint, and sized by it at its first `APPENDS`.
#[test]
fn the_streamed_decode_sizes_long_device_traces_exactly() {
    let mut snap = RawSnapshot::default();
    snap.device_traces.push(
        (0..9_000u64)
            .map(|i| RawEvent::new(Action::Alloc, 0x1000 * (i + 1), 512, 0))
            .collect(),
    );
    let bytes = snapshot_bytes(&snap);
    let whole = decode_snapshot(&bytes).expect("decodes whole");
    for step in [4096, 1 << 20] {
        let _ = ENTRIES_TAKEN.with(|n| n.replace(0));
        let mut s = PickleStream::new(Some(bytes.len() as u64), step);
        for pass in 0..2 {
            for piece in bytes.chunks(1000) {
                s.feed(piece).expect("feeds");
            }
            if pass == 0 {
                assert!(s.end_pass().expect("first pass").is_none());
            }
        }
        let State::Decode(d) = &s.state else {
            panic!("not decoding: {:?}", s.state);
        };
        let lists: Vec<(usize, usize)> =
            d.vm.iter()
                .flat_map(|vm| vm.event_lists.iter().map(|l| (l.len(), l.capacity())))
                .collect();
        assert_eq!(lists, [(9_000, 9_000)], "windows of {step}");
        let taken = ENTRIES_TAKEN.with(|n| n.replace(0));
        if step == 4096 {
            assert!((100..9_000).contains(&taken), "{taken} run as one step");
        } else {
            assert_eq!(taken, 9_000);
        }
        let got = s.end_pass().expect("decodes").expect("a snapshot");
        assert_eq!(format!("{got:?}"), format!("{whole:?}"));
    }
}
