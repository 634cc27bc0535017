//! The streamed decode's reservation of a long device trace.

use super::{PickleStream, State};
use crate::snapshot::write::snapshot_bytes;
use crate::snapshot::{Action, RawEvent, RawSnapshot, decode_snapshot};

#[test]
fn the_streamed_decode_sizes_long_device_traces_exactly() {
    let mut snap = RawSnapshot::default();
    snap.device_traces.push(
        (0..9_000u64)
            .map(|i| RawEvent::new(Action::Alloc, 0x1000 * (i + 1), 512, 0))
            .collect(),
    );
    let bytes = snapshot_bytes(&snap);
    let mut s = PickleStream::new(Some(bytes.len() as u64), 4096);
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
    assert_eq!(lists, [(9_000, 9_000)]);
    let got = s.end_pass().expect("decodes").expect("a snapshot");
    let whole = decode_snapshot(&bytes).expect("decodes whole");
    assert_eq!(format!("{got:?}"), format!("{whole:?}"));
}
