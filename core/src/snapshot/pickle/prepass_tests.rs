//! The pre-pass's lengths: long device traces reserved exactly, the same over pieces.

use super::super::machine::Vm;
use super::MIN_RUN;
use crate::snapshot::write::snapshot_bytes;
use crate::snapshot::{Action, RawEvent, RawSnapshot, decode_snapshot};

/// Runs the machine over `data`; the lists of trace entries it built, (len, capacity).
fn event_lists(data: &[u8]) -> Vec<(usize, usize)> {
    let mut vm = Vm::new(data, true);
    vm.run().expect("decodes");
    vm.event_lists
        .iter()
        .map(|l| (l.len(), l.capacity()))
        .collect()
}

fn with_traces(lens: &[usize]) -> RawSnapshot {
    let mut snap = RawSnapshot::default();
    for (d, &n) in lens.iter().enumerate() {
        snap.device_traces.push(
            (0..n as u64)
                .map(|i| RawEvent::new(Action::Alloc, 0x1000 * (i + 1), 512 + d as u64, 0))
                .collect(),
        );
    }
    snap
}

#[test]
fn long_device_traces_are_sized_exactly_short_ones_grow() {
    let lens = [
        MIN_RUN as usize + 1,
        3 * MIN_RUN as usize + 999,
        17,
        0,
        12_345,
    ];
    let bytes = snapshot_bytes(&with_traces(&lens));
    let lists = event_lists(&bytes);
    let long: Vec<_> = lists.iter().filter(|(n, _)| *n as u64 >= MIN_RUN).collect();
    assert_eq!(long.len(), 3, "{lists:?}");
    for (n, cap) in long {
        assert_eq!(n, cap, "{lists:?}");
    }
    // The decode is the same as ever.
    let snap = decode_snapshot(&bytes).expect("decodes");
    let got: Vec<usize> = snap.device_traces.iter().map(Vec::len).collect();
    assert_eq!(got, lens);
}

/// The pre-pass as a stream runs it: pieces, each scanned with what the last left.
fn hints_in_pieces(data: &[u8], piece: usize) -> Vec<(u64, u64)> {
    let mut s = super::Scanner::new(data.len() as u64, 1 << 16);
    let mut carry = Vec::new();
    for chunk in data.chunks(piece) {
        carry.extend_from_slice(chunk);
        let read = s.scan(&carry, false);
        carry.drain(..read.min(carry.len()));
    }
    s.scan(&carry, true);
    s.lengths.hints()
}

#[test]
fn the_lengths_are_the_same_over_pieces_of_any_size() {
    let lens = [2 * MIN_RUN as usize + 7, 5 * MIN_RUN as usize];
    let bytes = snapshot_bytes(&with_traces(&lens));
    let whole = super::scan_references(&bytes).1;
    let got: Vec<u64> = whole.iter().map(|&(_, n)| n).collect();
    assert_eq!(got, [lens[0] as u64, lens[1] as u64]);
    for piece in [1, 2, 7, 9, 4099, 65_536] {
        assert_eq!(hints_in_pieces(&bytes, piece), whole, "pieces of {piece}");
    }
}

#[test]
fn a_hint_is_used_once() {
    let bytes = snapshot_bytes(&with_traces(&[2 * MIN_RUN as usize]));
    let mut vm = Vm::new(&bytes, true);
    let first = vm.list_hints.first().map(|&(at, _)| at).expect("a hint");
    vm.appends_at = usize::try_from(first).expect("small");
    assert_eq!(vm.new_event_list().capacity(), 2 * MIN_RUN as usize);
    // A second list made at the same APPENDS (a list that mixed entries with other items).
    assert_eq!(vm.new_event_list().capacity(), 0);
}

#[test]
fn a_hint_beyond_the_input_size_reserves_no_more_than_it_justifies() {
    let bytes = snapshot_bytes(&with_traces(&[2 * MIN_RUN as usize]));
    let mut vm = Vm::new(&bytes, true);
    // A hint that lies: 16 M entries (768 MiB) for the first run.
    let first = vm.list_hints.first().map(|&(at, _)| at).expect("a hint");
    vm.list_hints = vec![(first, 1 << 24)];
    vm.run().expect("decodes");
    let cap = vm.event_lists.first().map_or(0, Vec::capacity);
    assert!(cap as u64 <= bytes.len() as u64 / super::super::machine::ENTRY_BYTES + 2 * MIN_RUN);
    assert_eq!(
        vm.event_lists.first().map(Vec::len),
        Some(2 * MIN_RUN as usize)
    );
}

/// `CPython`'s own pickles of real snapshots: every device trace of the corpus long
/// enough to be noted is sized exactly.
#[test]
fn real_snapshots_device_traces_are_sized_exactly() {
    let files = super::super::parallel::tests::corpus();
    if files.is_empty() {
        println!("skipped: ../shared/traces is absent");
        return;
    }
    let mut sized = 0;
    for (p, data) in &files {
        let whole = super::scan_references(data).1;
        assert_eq!(hints_in_pieces(data, 4099), whole, "{p}");
        for (n, cap) in event_lists(data) {
            if n as u64 >= MIN_RUN {
                assert_eq!(n, cap, "{p}");
                sized += 1;
            }
        }
    }
    println!(
        "{sized} device traces sized exactly in {} files",
        files.len()
    );
    assert!(sized > 0);
}
