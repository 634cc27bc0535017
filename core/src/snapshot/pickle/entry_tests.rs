//! A trace entry run as one step ([`Vm::entry`]), in the single pass and in the streamed
//! second pass, decodes as the opcodes run one by one do: the same snapshot, tables and
//! their numbering included, or the same error. (The whole input's two passes never take
//! it; they are compared too.) The streamed two passes are fed in pieces of several sizes,
//! their windows as small as a few opcodes, so that entries straddle them.
//!
//! [`Vm::entry`]: super::super::machine::Vm

use super::super::opcodes::op;
use super::super::run::tests::{streamed, two_passes};
use super::{ENTRIES_TAKEN, FAST_ENTRIES};
use crate::snapshot::RawSnapshot;
use crate::snapshot::error::ImportError;

/// `decode` of `data` with the fast path and without it, each as its `Debug` or error.
fn both(
    data: &[u8],
    decode: &dyn Fn(&[u8]) -> Result<RawSnapshot, ImportError>,
) -> [Result<String, String>; 2] {
    super::super::run::tests::both_ways(&FAST_ENTRIES, data, decode)
}

/// How many entries took the fast path since the last call.
fn taken() -> usize {
    ENTRIES_TAKEN.with(|n| n.replace(0))
}

fn serial(data: &[u8]) -> Result<RawSnapshot, ImportError> {
    super::super::decode_serial(data)
}

/// The streamed two passes ([`two_passes`]) in pieces of `piece` bytes over windows of
/// about `step`, the input's size known.
fn twice(piece: usize, step: u64) -> impl Fn(&[u8]) -> Result<RawSnapshot, ImportError> {
    move |d| two_passes(d, piece, step, true).0
}

/// Pieces and window steps the streamed two passes are run with on small files: windows
/// of one opcode (no entry fits), of a few, and the whole file; pieces of one byte up.
const SMALL_RUNS: [(usize, u64); 6] = [
    (1, 1),
    (1, 64),
    (5, 16),
    (64, 200),
    (997, 97),
    (1 << 20, 1 << 20),
];

fn unhex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn the_corpus_decodes_alike_with_entries_run_as_one_step() {
    let files = super::super::parallel::tests::corpus();
    if files.is_empty() {
        println!("skipped: ../shared/traces is absent");
        return;
    }
    let _ = taken();
    for (name, data) in &files {
        let [fast, slow] = both(data, &serial);
        assert!(fast.is_ok(), "{name}: {fast:?}");
        assert_eq!(fast, slow, "{name}: the two passes");
        for piece in [997, 1 << 20] {
            let [fast, slow] = both(data, &|d| streamed(d, piece));
            assert_eq!(fast, slow, "{name}: the single pass in pieces of {piece}");
        }
    }
    assert!(taken() > 100_000, "real snapshots' entries take it");
    for (name, data) in &files {
        for (piece, step) in [(997, 1 << 20), (1 << 16, 4096), (1 << 20, 200)] {
            let [fast, slow] = both(data, &twice(piece, step));
            assert!(fast.is_ok(), "{name}: {fast:?}");
            assert_eq!(
                fast, slow,
                "{name}: two passes, pieces {piece}, windows {step}"
            );
        }
        let (_, passes) = two_passes(data, 1 << 20, 1 << 20, false);
        assert_eq!(passes, 2, "{name}: its second pass ran once more");
    }
    assert!(
        taken() > 100_000,
        "real snapshots' entries take it in the second pass"
    );
}

/// `pickle.dumps(snap, protocol=4)` by `CPython` 3.11: the frame dicts first (under a key
/// no one reads), then one device trace of six entries whose third (`E`) is also its fifth
/// (`BINGET`) and the snapshot's last value (`'y': E`).
const SHARED_ENTRY: &str = concat!(
    "800495a7010000000000007d94288c087365676d656e7473945d948c0178945d94287d94288c046e616d6594",
    "8c026630948c0866696c656e616d65948c086d6f64656c2e7079948c046c696e65944b01757d942868068c02",
    "66319468086809680a4b0275658c0d6465766963655f747261636573945d945d94287d94288c06616374696f",
    "6e948c05616c6c6f63948c0461646472944d00108c0473697a65944d00028c0673747265616d944b008c0774",
    "696d655f7573944b008c0f636f6d70696c655f636f6e74657874948c034e2f41948c0d757365725f6d657461",
    "64617461948c00948c066672616d6573945d94286805680b65757d94286811681268134d002068144d000268",
    "154b0068164b01681768186819681a681b5d94286805680b65757d94286811681268134d003068144d000268",
    "154b0068164b02681768186819681a681b5d94286805680b65757d94286811681268134d004068144d000268",
    "154b0068164b03681768186819681a681b5d94286805680b6575681f7d94286811681268134d006068144d00",
    "0268154b0068164b05681768186819681a681b5d94286805680b657565618c017994681f752e",
);

/// The same entries, six in all: `e0`, `e1`, `E`, `e3`, `E`, `e5`.
#[test]
fn an_entry_read_back_decodes_as_before() {
    let data = unhex(SHARED_ENTRY);
    let [fast, slow] = both(&data, &serial);
    let fast = fast.expect("decodes");
    assert_eq!(Ok(fast.clone()), slow);
    let _ = taken();
    let _ = streamed(&data, data.len());
    // `e0`, `e1`, `E`, `e3`; then `E` is read back, and the single pass gives way to the
    // two passes, whose second takes `e0` and `e1` (see below).
    assert_eq!(taken(), 4 + 2);
    for piece in [1, 5, 64, data.len()] {
        let [f, s] = both(&data, &|d| streamed(d, piece));
        assert_eq!(f.as_ref(), Ok(&fast), "pieces of {piece}");
        assert_eq!(f, s);
    }
    // The second pass knows `E`'s slot is read back: `e0`, `e1`, and then `E`'s dict is
    // the loop's, left on the stack above the mark, and so are the entries after it.
    let _ = taken();
    assert_eq!(two_passes(&data, data.len(), 1 << 20, true).1, 2);
    assert_eq!(taken(), 2);
    for (piece, step) in SMALL_RUNS {
        let [f, s] = both(&data, &twice(piece, step));
        assert_eq!(f.as_ref(), Ok(&fast), "pieces of {piece}, windows {step}");
        assert_eq!(f, s);
    }
    let snap = serial(&data).expect("decodes");
    let addrs: Vec<u64> = snap.device_traces[0].iter().map(|e| e.addr).collect();
    assert_eq!(addrs, [0x1000, 0x2000, 0x3000, 0x4000, 0x3000, 0x6000]);
}

/// `CPython` 3.11's pickle of a snapshot of 16 device traces, each `[e, e, X, e]` around an
/// entry `X` of an unusual form that decodes: an extra key (a list, a string), a `pool_id`
/// tuple, `user_metadata` text, an empty frames list, a frames list shared by two entries,
/// an `oom` with `device_free`, a one-frame list (`APPEND`), an integer `user_metadata`, a
/// `free_completed`, an `addr` past `i64::MAX`, no `frames`, a `segment_map`,
/// `frames` of `None`, a tuple of frames.
const UNUSUAL: &str = concat!(
    "800495b20c0000000000007d94288c087365676d656e7473945d948c0178945d94287d94288c046e616d6594",
    "8c026630948c0866696c656e616d65948c086d6f64656c2e7079948c046c696e65944b01757d942868068c02",
    "66319468086809680a4b0275658c0d6465766963655f747261636573945d94285d94287d94288c0661637469",
    "6f6e948c05616c6c6f63948c0461646472944a005006008c0473697a65944d00028c0673747265616d944b00",
    "8c0774696d655f7573944b648c0f636f6d70696c655f636f6e74657874948c034e2f41948c0d757365725f6d",
    "65746164617461948c00948c066672616d6573945d94286805680b65757d94286811681268134a0060060068",
    "144d000268154b0068164b65681768186819681a681b5d94286805680b65757d94286811681268134d008068",
    "144d000268154b0068164b07681768186819681a681b5d94286805680b658c056578747261945d94284b014b",
    "0265757d94286811681268134a0080060068144d000268154b0068164b67681768186819681a681b5d942868",
    "05680b6575655d94287d94286811681268134a0050060068144d000268154b0068164b64681768186819681a",
    "681b5d94286805680b65757d94286811681268134a0060060068144d000268154b0068164b65681768186819",
    "681a681b5d94286805680b65757d94286811681268134d009068144d000268154b0068164b08681768186819",
    "681a681b5d94286805680b658c056f74686572946803757d94286811681268134a0080060068144d00026815",
    "4b0068164b67681768186819681a681b5d94286805680b6575655d94287d94286811681268134a0050060068",
    "144d000268154b0068164b64681768186819681a681b5d94286805680b65757d94286811681268134a006006",
    "0068144d000268154b0068164b65681768186819681a681b5d94286805680b65757d94286811681268134d00",
    "a068144d000268154b0068164b09681768186819681a681b5d94286805680b658c07706f6f6c5f6964944b01",
    "4b008694757d94286811681268134a0080060068144d000268154b0068164b67681768186819681a681b5d94",
    "286805680b6575655d94287d94286811681268134a0050060068144d000268154b0068164b64681768186819",
    "681a681b5d94286805680b65757d94286811681268134a0060060068144d000268154b0068164b6568176818",
    "6819681a681b5d94286805680b65757d94286811681268134d00c068144d000268154b0068164b0b68176818",
    "68198c046e6f746594681b5d94286805680b65757d94286811681268134a0080060068144d000268154b0068",
    "164b67681768186819681a681b5d94286805680b6575655d94287d94286811681268134a0050060068144d00",
    "0268154b0068164b64681768186819681a681b5d94286805680b65757d94286811681268134a006006006814",
    "4d000268154b0068164b65681768186819681a681b5d94286805680b65757d94286811681268134d00e06814",
    "4d000268154b0068164b0d681768186819681a681b5d94757d94286811681268134a0080060068144d000268",
    "154b0068164b67681768186819681a681b5d94286805680b6575655d94287d94286811681268134a00500600",
    "68144d000268154b0068164b64681768186819681a681b5d94286805680b65757d94286811681268134a0060",
    "060068144d000268154b0068164b65681768186819681a681b5d94286805680b65757d94286811681268134d",
    "00f068144d000268154b0068164b0e681768186819681a681b5d9428680b680565757d94286811681268134a",
    "0080060068144d000268154b0068164b67681768186819681a681b5d94286805680b6575655d94287d942868",
    "11681268134a0050060068144d000268154b0068164b64681768186819681a681b5d94286805680b65757d94",
    "286811681268134a0060060068144d000268154b0068164b65681768186819681a681b5d94286805680b6575",
    "7d94286811681268134a0000010068144d000268154b0068164b0f681768186819681a681b6853757d942868",
    "11681268134a0080060068144d000268154b0068164b67681768186819681a681b5d94286805680b6575655d",
    "94287d94286811681268134a0050060068144d000268154b0068164b64681768186819681a681b5d94286805",
    "680b65757d94286811681268134a0060060068144d000268154b0068164b65681768186819681a681b5d9428",
    "6805680b65757d942868118c036f6f6d9468144d000268154b0068164b12681768186819681a681b5d942868",
    "05680b658c0b6465766963655f66726565944a00000040757d94286811681268134a0080060068144d000268",
    "154b0068164b67681768186819681a681b5d94286805680b6575655d94287d94286811681268134a00500600",
    "68144d000268154b0068164b64681768186819681a681b5d94286805680b65757d94286811681268134a0060",
    "060068144d000268154b0068164b65681768186819681a681b5d94286805680b65757d94286811681268134a",
    "0040010068144d000268154b0068164b13681768186819681a681b5d94680b61757d94286811681268134a00",
    "80060068144d000268154b0068164b67681768186819681a681b5d94286805680b6575655d94287d94286811",
    "681268134a0050060068144d000268154b0068164b64681768186819681a681b5d94286805680b65757d9428",
    "6811681268134a0060060068144d000268154b0068164b65681768186819681a681b5d94286805680b65757d",
    "94286811681268134a0080010068144d000268154b0068164b176817681868194b07681b5d94286805680b65",
    "757d94286811681268134a0080060068144d000268154b0068164b67681768186819681a681b5d9428680568",
    "0b6575655d94287d94286811681268134a0050060068144d000268154b0068164b64681768186819681a681b",
    "5d94286805680b65757d94286811681268134a0060060068144d000268154b0068164b65681768186819681a",
    "681b5d94286805680b65757d942868118c0e667265655f636f6d706c657465649468134a00a0010068144d00",
    "0268154b0068164b19681768186819681a681b5d94286805680b65757d94286811681268134a008006006814",
    "4d000268154b0068164b67681768186819681a681b5d94286805680b6575655d94287d94286811681268134a",
    "0050060068144d000268154b0068164b64681768186819681a681b5d94286805680b65757d94286811681268",
    "134a0060060068144d000268154b0068164b65681768186819681a681b5d94286805680b65757d9428681168",
    "1268138a0905000000000000800068144d000268154b0068164b1a681768186819681a681b5d94286805680b",
    "65757d94286811681268134a0080060068144d000268154b0068164b67681768186819681a681b5d94286805",
    "680b6575655d94287d94286811681268134a0050060068144d000268154b0068164b64681768186819681a68",
    "1b5d94286805680b65757d94286811681268134a0060060068144d000268154b0068164b6568176818681968",
    "1a681b5d94286805680b65757d94286811681268134a00c0010068144d000268154b0068164b1b6817681868",
    "19681a757d94286811681268134a0080060068144d000268154b0068164b67681768186819681a681b5d9428",
    "6805680b6575655d94287d94286811681268134a0050060068144d000268154b0068164b6468176818681968",
    "1a681b5d94286805680b65757d94286811681268134a0060060068144d000268154b0068164b656817681868",
    "19681a681b5d94286805680b65757d942868118c0b7365676d656e745f6d61709468134a00e0010068144a00",
    "00200068154b0068164b1d681768186819681a681b5d94286805680b65757d94286811681268134a00800600",
    "68144d000268154b0068164b67681768186819681a681b5d94286805680b6575655d94287d94286811681268",
    "134a0050060068144d000268154b0068164b64681768186819681a681b5d94286805680b65757d9428681168",
    "1268134a0060060068144d000268154b0068164b65681768186819681a681b5d94286805680b65757d942868",
    "11681268134a0070010068144d000268154b0068164b16681768186819681a681b4e757d9428681168126813",
    "4a0080060068144d000268154b0068164b67681768186819681a681b5d94286805680b6575655d94287d9428",
    "6811681268134a0050060068144d000268154b0068164b64681768186819681a681b5d94286805680b65757d",
    "94286811681268134a0060060068144d000268154b0068164b65681768186819681a681b5d94286805680b65",
    "757d94286811681268134a0090010068144d000268154b0068164b18681768186819681a681b68058594757d",
    "94286811681268134a0080060068144d000268154b0068164b67681768186819681a681b5d94286805680b65",
    "756565752e",
);

/// The same around an entry that the snapshot refuses, one file each: a float `size`, a
/// string `addr`, no `size`, a `size` past 64 bits, a negative `addr`, a dict with no
/// `action`, a float `time_us`, a `stream` of `None`.
const REFUSED: [&str; 8] = [
    concat!(
        "8004957f010000000000007d94288c087365676d656e7473945d948c0178945d94287d94288c046e616d",
        "65948c026630948c0866696c656e616d65948c086d6f64656c2e7079948c046c696e65944b01757d9428",
        "68068c0266319468086809680a4b0275658c0d6465766963655f747261636573945d945d94287d94288c",
        "06616374696f6e948c05616c6c6f63948c0461646472944a005006008c0473697a65944d00028c067374",
        "7265616d944b008c0774696d655f7573944b648c0f636f6d70696c655f636f6e74657874948c034e2f41",
        "948c0d757365725f6d65746164617461948c00948c066672616d6573945d94286805680b65757d942868",
        "11681268134a0060060068144d000268154b0068164b65681768186819681a681b5d94286805680b6575",
        "7d94286811681268134d0020681447408000000000000068154b0068164b01681768186819681a681b5d",
        "94286805680b65757d94286811681268134a0080060068144d000268154b0068164b6768176818681968",
        "1a681b5d94286805680b65756561752e",
    ),
    concat!(
        "8004957f010000000000007d94288c087365676d656e7473945d948c0178945d94287d94288c046e616d",
        "65948c026630948c0866696c656e616d65948c086d6f64656c2e7079948c046c696e65944b01757d9428",
        "68068c0266319468086809680a4b0275658c0d6465766963655f747261636573945d945d94287d94288c",
        "06616374696f6e948c05616c6c6f63948c0461646472944a005006008c0473697a65944d00028c067374",
        "7265616d944b008c0774696d655f7573944b648c0f636f6d70696c655f636f6e74657874948c034e2f41",
        "948c0d757365725f6d65746164617461948c00948c066672616d6573945d94286805680b65757d942868",
        "11681268134a0060060068144d000268154b0068164b65681768186819681a681b5d94286805680b6575",
        "7d94286811681268138c063078333030309468144d000268154b0068164b03681768186819681a681b5d",
        "94286805680b65757d94286811681268134a0080060068144d000268154b0068164b6768176818681968",
        "1a681b5d94286805680b65756561752e",
    ),
    concat!(
        "80049574010000000000007d94288c087365676d656e7473945d948c0178945d94287d94288c046e616d",
        "65948c026630948c0866696c656e616d65948c086d6f64656c2e7079948c046c696e65944b01757d9428",
        "68068c0266319468086809680a4b0275658c0d6465766963655f747261636573945d945d94287d94288c",
        "06616374696f6e948c05616c6c6f63948c0461646472944a005006008c0473697a65944d00028c067374",
        "7265616d944b008c0774696d655f7573944b648c0f636f6d70696c655f636f6e74657874948c034e2f41",
        "948c0d757365725f6d65746164617461948c00948c066672616d6573945d94286805680b65757d942868",
        "11681268134a0060060068144d000268154b0068164b65681768186819681a681b5d94286805680b6575",
        "7d94286811681268134d006068154b0068164b05681768186819681a681b5d94286805680b65757d9428",
        "6811681268134a0080060068144d000268154b0068164b67681768186819681a681b5d94286805680b65",
        "756561752e",
    ),
    concat!(
        "80049583010000000000007d94288c087365676d656e7473945d948c0178945d94287d94288c046e616d",
        "65948c026630948c0866696c656e616d65948c086d6f64656c2e7079948c046c696e65944b01757d9428",
        "68068c0266319468086809680a4b0275658c0d6465766963655f747261636573945d945d94287d94288c",
        "06616374696f6e948c05616c6c6f63948c0461646472944a005006008c0473697a65944d00028c067374",
        "7265616d944b008c0774696d655f7573944b648c0f636f6d70696c655f636f6e74657874948c034e2f41",
        "948c0d757365725f6d65746164617461948c00948c066672616d6573945d94286805680b65757d942868",
        "11681268134a0060060068144d000268154b0068164b65681768186819681a681b5d94286805680b6575",
        "7d94286811681268134a0010010068148a0900000000000000004068154b0068164b1068176818681968",
        "1a681b5d94286805680b65757d94286811681268134a0080060068144d000268154b0068164b67681768",
        "186819681a681b5d94286805680b65756561752e",
    ),
    concat!(
        "8004957b010000000000007d94288c087365676d656e7473945d948c0178945d94287d94288c046e616d",
        "65948c026630948c0866696c656e616d65948c086d6f64656c2e7079948c046c696e65944b01757d9428",
        "68068c0266319468086809680a4b0275658c0d6465766963655f747261636573945d945d94287d94288c",
        "06616374696f6e948c05616c6c6f63948c0461646472944a005006008c0473697a65944d00028c067374",
        "7265616d944b008c0774696d655f7573944b648c0f636f6d70696c655f636f6e74657874948c034e2f41",
        "948c0d757365725f6d65746164617461948c00948c066672616d6573945d94286805680b65757d942868",
        "11681268134a0060060068144d000268154b0068164b65681768186819681a681b5d94286805680b6575",
        "7d94286811681268134afbffffff68144d000268154b0068164b11681768186819681a681b5d94286805",
        "680b65757d94286811681268134a0080060068144d000268154b0068164b67681768186819681a681b5d",
        "94286805680b65756561752e",
    ),
    concat!(
        "80049565010000000000007d94288c087365676d656e7473945d948c0178945d94287d94288c046e616d",
        "65948c026630948c0866696c656e616d65948c086d6f64656c2e7079948c046c696e65944b01757d9428",
        "68068c0266319468086809680a4b0275658c0d6465766963655f747261636573945d945d94287d94288c",
        "06616374696f6e948c05616c6c6f63948c0461646472944a005006008c0473697a65944d00028c067374",
        "7265616d944b008c0774696d655f7573944b648c0f636f6d70696c655f636f6e74657874948c034e2f41",
        "948c0d757365725f6d65746164617461948c00948c066672616d6573945d94286805680b65757d942868",
        "11681268134a0060060068144d000268154b0068164b65681768186819681a681b5d94286805680b6575",
        "7d94288c03666f6f944b018c03626172948c0362617a94757d94286811681268134a0080060068144d00",
        "0268154b0068164b67681768186819681a681b5d94286805680b65756561752e",
    ),
    concat!(
        "80049582010000000000007d94288c087365676d656e7473945d948c0178945d94287d94288c046e616d",
        "65948c026630948c0866696c656e616d65948c086d6f64656c2e7079948c046c696e65944b01757d9428",
        "68068c0266319468086809680a4b0275658c0d6465766963655f747261636573945d945d94287d94288c",
        "06616374696f6e948c05616c6c6f63948c0461646472944a005006008c0473697a65944d00028c067374",
        "7265616d944b008c0774696d655f7573944b648c0f636f6d70696c655f636f6e74657874948c034e2f41",
        "948c0d757365725f6d65746164617461948c00948c066672616d6573945d94286805680b65757d942868",
        "11681268134a0060060068144d000268154b0068164b65681768186819681a681b5d94286805680b6575",
        "7d94286811681268134a0060010068144d000268154b006816473ff8000000000000681768186819681a",
        "681b5d94286805680b65757d94286811681268134a0080060068144d000268154b0068164b6768176818",
        "6819681a681b5d94286805680b65756561752e",
    ),
    concat!(
        "8004957a010000000000007d94288c087365676d656e7473945d948c0178945d94287d94288c046e616d",
        "65948c026630948c0866696c656e616d65948c086d6f64656c2e7079948c046c696e65944b01757d9428",
        "68068c0266319468086809680a4b0275658c0d6465766963655f747261636573945d945d94287d94288c",
        "06616374696f6e948c05616c6c6f63948c0461646472944a005006008c0473697a65944d00028c067374",
        "7265616d944b008c0774696d655f7573944b648c0f636f6d70696c655f636f6e74657874948c034e2f41",
        "948c0d757365725f6d65746164617461948c00948c066672616d6573945d94286805680b65757d942868",
        "11681268134a0060060068144d000268154b0068164b65681768186819681a681b5d94286805680b6575",
        "7d94286811681268134a00d0010068144d000268154e68164b1c681768186819681a681b5d9428680568",
        "0b65757d94286811681268134a0080060068144d000268154b0068164b67681768186819681a681b5d94",
        "286805680b65756561752e",
    ),
];

#[test]
fn entries_of_unusual_forms_decode_as_before() {
    let data = unhex(UNUSUAL);
    let [fast, slow] = both(&data, &serial);
    let _ = taken();
    let _ = streamed(&data, data.len());
    let n = taken();
    // All four of 11 traces (a `pool_id` tuple's among them); of the other 5 the two
    // before `X` (a list of integers, `user_metadata` text, an `addr` of 9 bytes, `frames`
    // of `None`, a tuple of frames: the loop's, and so the rest of their batch).
    assert_eq!(n, 11 * 4 + 5 * 2, "{n}");
    assert_eq!(fast, slow);
    let fast = fast.expect("decodes");
    for piece in [1, 7, 64, 997, data.len()] {
        let [f, s] = both(&data, &|d| streamed(d, piece));
        assert_eq!(f.as_ref(), Ok(&fast), "pieces of {piece}");
        assert_eq!(f, s);
    }
    // The second pass takes the same: no entry's dict is read back.
    let _ = taken();
    assert_eq!(two_passes(&data, data.len(), 1 << 20, true).1, 2);
    assert_eq!(taken(), n);
    for (piece, step) in SMALL_RUNS {
        let [f, s] = both(&data, &twice(piece, step));
        assert_eq!(f.as_ref(), Ok(&fast), "pieces of {piece}, windows {step}");
        assert_eq!(f, s);
    }
    let snap = serial(&data).expect("decodes");
    assert_eq!(snap.device_traces.len(), 16);
    let _ = taken();
    for (k, hex) in REFUSED.iter().enumerate() {
        let data = unhex(hex);
        let [fast, slow] = both(&data, &serial);
        assert!(fast.is_err(), "{k}: {fast:?}");
        assert_eq!(fast, slow, "{k}");
        for piece in [1, 64, data.len()] {
            let [f, s] = both(&data, &|d| streamed(d, piece));
            assert_eq!(f, fast, "{k}: pieces of {piece}");
            assert_eq!(f, s, "{k}");
        }
        for (piece, step) in SMALL_RUNS {
            let [f, s] = both(&data, &twice(piece, step));
            assert_eq!(
                f, fast,
                "{k}: two passes, pieces of {piece}, windows {step}"
            );
            assert_eq!(f, s, "{k}");
        }
    }
    assert!(
        taken() >= 4 * REFUSED.len(),
        "the two entries before each, both ways"
    );
}

/// A file cut anywhere in its second device trace (inside its entries and between them):
/// the same error both ways, in one piece and streamed.
#[test]
fn a_file_cut_inside_an_entry_fails_as_before() {
    let data = unhex(UNUSUAL);
    let Some(from) = data.windows(13).position(|w| w == b"device_traces") else {
        panic!("no device_traces");
    };
    // The first trace's four entries take about 300 bytes.
    for cut in from + 300..from + 800 {
        let cut_data = &data[..cut];
        let [fast, slow] = both(cut_data, &serial);
        assert!(fast.is_err(), "cut at {cut}");
        assert_eq!(fast, slow, "cut at {cut}");
        if cut % 7 == 0 {
            let [f, s] = both(cut_data, &|d| streamed(d, 64));
            assert_eq!(f, fast, "cut at {cut}, streamed");
            assert_eq!(f, s, "cut at {cut}, streamed");
        }
        let (piece, step) = SMALL_RUNS[cut % SMALL_RUNS.len()];
        let [f, s] = both(cut_data, &twice(piece, step));
        assert_eq!(
            f, fast,
            "cut at {cut}, two passes, pieces {piece}, windows {step}"
        );
        assert_eq!(f, s, "cut at {cut}, two passes");
    }
}

/// `CPython` 3.11's pickle of a snapshot of one device trace of four entries: the trace
/// list's slot is 15 (`BINGET 0x0f`), the second entry's `SETITEMS` ends at byte 290 and
/// the `APPENDS` that closes the trace is at byte 378.
const FOUR: &str = concat!(
    "80049573010000000000007d94288c087365676d656e7473945d948c0178945d94287d94288c046e616d6594",
    "8c026630948c0866696c656e616d65948c086d6f64656c2e7079948c046c696e65944b01757d942868068c02",
    "66319468086809680a4b0275658c0d6465766963655f747261636573945d945d94287d94288c06616374696f",
    "6e948c05616c6c6f63948c0461646472944d00108c0473697a65944d00028c0673747265616d944b008c0774",
    "696d655f7573944b008c0f636f6d70696c655f636f6e74657874948c034e2f41948c0d757365725f6d657461",
    "64617461948c00948c066672616d6573945d94286805680b65757d94286811681268134d002068144d000268",
    "154b0068164b01681768186819681a681b5d94286805680b65757d94286811681268134d003068144d000268",
    "154b0068164b02681768186819681a681b5d94286805680b65757d94286811681268134d004068144d000268",
    "154b0068164b03681768186819681a681b5d94286805680b65756561752e",
);

/// Entries handed over ahead of their `APPENDS` while something else sees their list or
/// its mark first (files `pickle.dump` never writes): the trace's `APPENDS` made another
/// opcode closing the mark (`TUPLE`, `LIST`, `POP_MARK`, `DICT`, `SETITEMS`, `FROZENSET`,
/// `STOP`), or opcodes put between the second and third entries that read the list back
/// and append to it, pop below the entries, `STOP`, `DUP` or `MEMOIZE` the top. The single
/// pass gives way, and the answer is the two passes', as without the fast path.
#[test]
fn a_list_seen_before_its_appends_decodes_as_before() {
    let data = unhex(FOUR);
    assert_eq!((data[290], data[378]), (op::EMPTY_DICT, op::APPENDS));
    let _ = taken();
    let whole = format!("{:?}", serial(&data).expect("decodes"));
    let [f, s] = both(&data, &|d| streamed(d, d.len()));
    assert_eq!(f.as_ref(), Ok(&whole));
    assert_eq!(f, s);
    assert_eq!(taken(), 4);
    let mut files = Vec::new();
    for code in [b't', b'l', b'1', b'd', b'u', 0x91, b'.'] {
        let mut d = data.clone();
        d[378] = code;
        files.push(d);
    }
    let inserts: [&[u8]; 8] = [
        b"h\x0fNa",
        b"h\x0f0",
        b"0",
        b"00",
        b".",
        b"2",
        b"\x94",
        b"h\x0f(Ne",
    ];
    for ins in inserts {
        let mut d = data.clone();
        d.splice(290..290, ins.iter().copied());
        files.push(d);
    }
    for (k, d) in files.iter().enumerate() {
        let [fast, slow] = both(d, &serial);
        assert_eq!(fast, slow, "{k}");
        for piece in [1, 64, d.len()] {
            let [f, s] = both(d, &|d| streamed(d, piece));
            assert_eq!(f, fast, "{k}: pieces of {piece}");
            assert_eq!(f, s, "{k}: pieces of {piece}");
        }
        for (piece, step) in SMALL_RUNS {
            let [f, s] = both(d, &twice(piece, step));
            assert_eq!(
                f, fast,
                "{k}: two passes, pieces of {piece}, windows {step}"
            );
            assert_eq!(f, s, "{k}: two passes, pieces of {piece}, windows {step}");
        }
    }
    assert!(taken() >= files.len(), "the first two entries of each");
    // The streamed two passes: the files that read the trace list back (`h\x0f`) keep it in
    // the memo, shared, and take no entry; in every other the guarded mark is seen, and the
    // second pass runs once more, without the fast path (the answers compared above).
    let passes: Vec<u8> = files
        .iter()
        .map(|d| two_passes(d, d.len(), 1 << 20, true).1)
        .collect();
    assert_eq!(passes, [3, 3, 3, 3, 3, 3, 3, 2, 2, 3, 3, 3, 3, 3, 2]);
    assert_eq!(
        taken(),
        7 * 4 + 5 * 2,
        "the four entries of the first seven, the first two of five more"
    );
}

/// The streamed decode of the gzip file `gz` fed in pieces of `piece` bytes, its inflated
/// bytes kept for the second pass up to `keep`, over one window; and the last
/// pass it reported, of how many.
fn gzip_streamed(gz: &[u8], keep: u64, piece: usize) -> (Result<String, String>, Option<(u8, u8)>) {
    use crate::snapshot::import::DecodeOptions;
    use crate::snapshot::stream::StreamDecoder;
    let mut dec = StreamDecoder::new(gz.len() as u64, DecodeOptions::default())
        .with_keep_bound(keep)
        .with_window_step(1 << 20);
    let mut last = None;
    for _ in 0..3 {
        let fed = gz.chunks(piece).try_for_each(|p| dec.feed(p));
        let done = fed.and_then(|()| {
            dec.end_of_input_with(&mut |p| {
                last = Some((p.pass, p.passes));
                true
            })
        });
        match done {
            Ok(None) => {}
            Ok(Some(snap)) => return (Ok(format!("{snap:?}")), last),
            Err(e) => return (Err(e.to_string()), last),
        }
    }
    panic!("a fourth pass asked for");
}

/// A gzip file is decoded in two passes whatever its size: where its second pass runs once
/// more (here the trace's `APPENDS` made a `TUPLE`), the file is inflated again, whether
/// its inflated bytes were kept for the second pass or not, and the answer is the loop's.
#[test]
fn a_gzip_file_whose_second_pass_runs_once_more_decodes_as_before() {
    use crate::snapshot::stream::KEEP_INFLATED_BYTES;
    use std::io::Write as _;
    let mut data = unhex(FOUR);
    data[378] = b't';
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&data).expect("compresses");
    let gz = gz.finish().expect("compresses");
    let [want, slow] = both(&data, &serial);
    assert!(want.is_err(), "{want:?}");
    assert_eq!(want, slow);
    let _ = taken();
    for keep in [KEEP_INFLATED_BYTES, 0] {
        for piece in [1, 64, gz.len()] {
            let (got, last) = gzip_streamed(&gz, keep, piece);
            assert_eq!(got, want, "kept up to {keep}, pieces of {piece}");
            assert_eq!(last, Some((3, 3)), "kept up to {keep}, pieces of {piece}");
        }
    }
    assert_eq!(taken(), 6 * 4, "the trace's four entries, each time");
}

/// Runs `data` every way the fast path can take its entries, with it and without it: the
/// whole input's two passes; the single pass streamed in pieces of `pieces`; the streamed
/// two passes in each of `runs`. Every answer is the loop's and the same; returns it.
fn alike(data: &[u8], pieces: &[usize], runs: &[(usize, u64)]) -> Result<String, String> {
    let [want, slow] = both(data, &serial);
    assert_eq!(want, slow, "the whole input's two passes");
    for &piece in pieces {
        let [f, s] = both(data, &|d| streamed(d, piece));
        assert_eq!(f, want, "pieces of {piece}");
        assert_eq!(f, s, "pieces of {piece}");
    }
    for &(piece, step) in runs {
        let [f, s] = both(data, &twice(piece, step));
        assert_eq!(f, want, "two passes, pieces of {piece}, windows {step}");
        assert_eq!(f, s, "two passes, pieces of {piece}, windows {step}");
    }
    want
}

/// The entries taken by the single pass (the whole input in one piece, and the two passes
/// it may give way to) and by the second of the two passes run on their own.
fn taken_each_way(data: &[u8]) -> (usize, usize) {
    let _ = taken();
    let _ = streamed(data, data.len());
    let single = taken();
    assert_eq!(two_passes(data, data.len(), 1 << 20, true).1, 2);
    (single, taken())
}

/// The snapshot's `pool_id` table.
fn pools_of(data: &[u8]) -> Vec<(u64, u64)> {
    serial(data).expect("decodes").event_pools
}

/// `pickle.dumps(snap, protocol=4)` by `CPython` 3.11 of a snapshot whose entries carry
/// PyTorch 2.12's `pool_id` (here last, after `frames`; a tuple of its own in each entry),
/// made by this script (`python3 gen.py pools`; `shared` and `inner` for the next two):
///
/// ```python
/// import pickle, sys
/// f0 = {'name': 'f0', 'filename': 'model.py', 'line': 1}
/// f1 = {'name': 'f1', 'filename': 'model.py', 'line': 2}
/// n = [0]
/// def e(pool, same=False, **kw):
///     # A tuple of its own, as PyTorch makes one per entry (literals are shared constants).
///     if isinstance(pool, tuple) and not same:
///         pool = tuple(list(pool))
///     n[0] += 1
///     d = {'action': 'alloc', 'addr': 0x1000 * n[0], 'size': 512, 'stream': 0,
///          'time_us': n[0], 'compile_context': 'N/A', 'user_metadata': '',
///          'frames': [f0, f1], 'pool_id': pool}
///     d.update(kw)
///     return d
/// which = sys.argv[1]
/// if which == 'pools':
///     big = (2**64 - 1, 1)
///     traces = [
///         # distinct and repeated values, fresh tuples each
///         [e((0, 1)), e((1, 0)), e((0, 1)), e((2, 3)), e((1, 0)), e((300, 70000))],
///         # big ints: LONG1 of 6 and 8 bytes, a negative (no pool), BININT
///         [e((2**40, 2**63 - 1)), e((0, 1)), e((-1, 0)), e((-5, 2**31 - 1)), e((65536, 0))],
///         # a 9-byte LONG1 (declined)
///         [e((9, 9)), e(big), e((9, 9))],
///         # other shapes: a list, a 3-tuple, None, strings, a string, a 1-tuple, a float, a bool
///         [e((1, 0)), e([1, 2]), e((1, 0))],
///         [e((1, 0)), e((1, 2, 3)), e((1, 0))],
///         [e((1, 0)), e(None), e((1, 0))],
///         [e((1, 0)), e(('a', 'b')), e((1, 0))],
///         [e((1, 0)), e('p'), e((1, 0))],
///         [e((1, 0)), e((1,)), e((1, 0))],
///         [e((1, 0)), e((1.0, 2)), e((1, 0))],
///         [e((8, 0)), e((True, 0)), e((8, 0))],
///         # empty frames lists of their own, `pool_id` next
///         [e((2, 2), frames=[]), e((2, 2), frames=[]), e((2, 2))],
///         # no pool_id at all, and one after
///         [{k: v for k, v in e((0, 0)).items() if k != 'pool_id'}, e((6, 0))],
///     ]
/// elif which == 'shared':
///     # the same tuple object twice in one batch (a GET), and one read back in a later
///     # trace, its batch converted
///     s, s2 = (7, 7), (8, 8)
///     traces = [
///         [e((3, 3)), e(s, True), e((4, 4)), e(s, True), e((5, 5)), e(s2, True)],
///         [e(s2, True), e((7, 8))],
///     ]
/// elif which == 'inner':
///     # an entry left to the loop (an extra key: a list holding an entry with its own
///     # pool) after one taken: the loop interns the inner pool first
///     inner = e((6, 6))
///     traces = [[e((5, 5)), e((4, 4), extra=[inner]), e((3, 3))]]
/// snap = {'segments': [], 'x': [f0, f1], 'device_traces': traces}
/// sys.stdout.write(pickle.dumps(snap, protocol=4).hex())
/// ```
///
/// Thirteen device traces: distinct and repeated pools; pools of `LONG1`s of 6 and 8 bytes,
/// negative ones (no pool), `BININT`s; a 9-byte `LONG1`; then a `pool_id` of another
/// shape between two of `(1, 0)` (or `(8, 0)`): a list, a 3-tuple, `None`, a tuple of
/// strings, a string, a 1-tuple, a float in a tuple, a bool in a tuple; entries with an
/// empty frames list of their own (`EMPTY_LIST MEMOIZE`, the `pool_id` key's `GET` next);
/// an entry without `pool_id`, and one after it.
const POOLS: &str = concat!(
    "800495080a0000000000007d94288c087365676d656e7473945d948c0178945d94287d94288c046e616d",
    "65948c026630948c0866696c656e616d65948c086d6f64656c2e7079948c046c696e65944b01757d9428",
    "68068c0266319468086809680a4b0275658c0d6465766963655f747261636573945d94285d94287d9428",
    "8c06616374696f6e948c05616c6c6f63948c0461646472944d00108c0473697a65944d00028c06737472",
    "65616d944b008c0774696d655f7573944b018c0f636f6d70696c655f636f6e74657874948c034e2f4194",
    "8c0d757365725f6d65746164617461948c00948c066672616d6573945d94286805680b658c07706f6f6c",
    "5f6964944b004b018694757d94286811681268134d002068144d000268154b0068164b02681768186819",
    "681a681b5d94286805680b65681d4b014b008694757d94286811681268134d003068144d000268154b00",
    "68164b03681768186819681a681b5d94286805680b65681d4b004b018694757d94286811681268134d00",
    "4068144d000268154b0068164b04681768186819681a681b5d94286805680b65681d4b024b038694757d",
    "94286811681268134d005068144d000268154b0068164b05681768186819681a681b5d94286805680b65",
    "681d4b014b008694757d94286811681268134d006068144d000268154b0068164b06681768186819681a",
    "681b5d94286805680b65681d4d2c014a70110100869475655d94287d94286811681268134d007068144d",
    "000268154b0068164b07681768186819681a681b5d94286805680b65681d8a060000000000018a08ffff",
    "ffffffffff7f8694757d94286811681268134d008068144d000268154b0068164b08681768186819681a",
    "681b5d94286805680b65681d4b004b018694757d94286811681268134d009068144d000268154b006816",
    "4b09681768186819681a681b5d94286805680b65681d4affffffff4b008694757d94286811681268134d",
    "00a068144d000268154b0068164b0a681768186819681a681b5d94286805680b65681d4afbffffff4aff",
    "ffff7f8694757d94286811681268134d00b068144d000268154b0068164b0b681768186819681a681b5d",
    "94286805680b65681d4a000001004b00869475655d94287d94286811681268134d00c068144d00026815",
    "4b0068164b0c681768186819681a681b5d94286805680b65681d4b094b098694757d9428681168126813",
    "4d00d068144d000268154b0068164b0d681768186819681a681b5d94286805680b65681d8a09ffffffff",
    "ffffffff004b018694757d94286811681268134d00e068144d000268154b0068164b0e68176818681968",
    "1a681b5d94286805680b65681d4b094b09869475655d94287d94286811681268134d00f068144d000268",
    "154b0068164b0f681768186819681a681b5d94286805680b65681d4b014b008694757d94286811681268",
    "134a0000010068144d000268154b0068164b10681768186819681a681b5d94286805680b65681d5d9428",
    "4b014b0265757d94286811681268134a0010010068144d000268154b0068164b11681768186819681a68",
    "1b5d94286805680b65681d4b014b00869475655d94287d94286811681268134a0020010068144d000268",
    "154b0068164b12681768186819681a681b5d94286805680b65681d4b014b008694757d94286811681268",
    "134a0030010068144d000268154b0068164b13681768186819681a681b5d94286805680b65681d4b014b",
    "024b038794757d94286811681268134a0040010068144d000268154b0068164b14681768186819681a68",
    "1b5d94286805680b65681d4b014b00869475655d94287d94286811681268134a0050010068144d000268",
    "154b0068164b15681768186819681a681b5d94286805680b65681d4b014b008694757d94286811681268",
    "134a0060010068144d000268154b0068164b16681768186819681a681b5d94286805680b65681d4e757d",
    "94286811681268134a0070010068144d000268154b0068164b17681768186819681a681b5d9428680568",
    "0b65681d4b014b00869475655d94287d94286811681268134a0080010068144d000268154b0068164b18",
    "681768186819681a681b5d94286805680b65681d4b014b008694757d94286811681268134a0090010068",
    "144d000268154b0068164b19681768186819681a681b5d94286805680b65681d8c0161948c0162948694",
    "757d94286811681268134a00a0010068144d000268154b0068164b1a681768186819681a681b5d942868",
    "05680b65681d4b014b00869475655d94287d94286811681268134a00b0010068144d000268154b006816",
    "4b1b681768186819681a681b5d94286805680b65681d4b014b008694757d94286811681268134a00c001",
    "0068144d000268154b0068164b1c681768186819681a681b5d94286805680b65681d8c017094757d9428",
    "6811681268134a00d0010068144d000268154b0068164b1d681768186819681a681b5d94286805680b65",
    "681d4b014b00869475655d94287d94286811681268134a00e0010068144d000268154b0068164b1e6817",
    "68186819681a681b5d94286805680b65681d4b014b008694757d94286811681268134a00f0010068144d",
    "000268154b0068164b1f681768186819681a681b5d94286805680b65681d4b018594757d942868116812",
    "68134a0000020068144d000268154b0068164b20681768186819681a681b5d94286805680b65681d4b01",
    "4b00869475655d94287d94286811681268134a0010020068144d000268154b0068164b21681768186819",
    "681a681b5d94286805680b65681d4b014b008694757d94286811681268134a0020020068144d00026815",
    "4b0068164b22681768186819681a681b5d94286805680b65681d473ff00000000000004b028694757d94",
    "286811681268134a0030020068144d000268154b0068164b23681768186819681a681b5d94286805680b",
    "65681d4b014b00869475655d94287d94286811681268134a0040020068144d000268154b0068164b2468",
    "1768186819681a681b5d94286805680b65681d4b084b008694757d94286811681268134a005002006814",
    "4d000268154b0068164b25681768186819681a681b5d94286805680b65681d884b008694757d94286811",
    "681268134a0060020068144d000268154b0068164b26681768186819681a681b5d94286805680b65681d",
    "4b084b00869475655d94287d94286811681268134a0070020068144d000268154b0068164b2768176818",
    "6819681a681b5d94681d4b024b028694757d94286811681268134a0080020068144d000268154b006816",
    "4b28681768186819681a681b5d94681d4b024b028694757d94286811681268134a0090020068144d0002",
    "68154b0068164b29681768186819681a681b5d94286805680b65681d4b024b02869475655d94287d9428",
    "6811681268134a00a0020068144d000268154b0068164b2a681768186819681a681b5d94286805680b65",
    "757d94286811681268134a00b0020068144d000268154b0068164b2b681768186819681a681b5d942868",
    "05680b65681d4b064b008694756565752e",
);

/// Entries with `pool_id` tuples of two integers are taken (all but those of another form,
/// and the rest of their batch), in the single pass and in the second of two: the same
/// snapshot as the loop's, its pool table and numbering included.
#[test]
fn entries_with_a_pool_id_take_the_fast_path_and_decode_as_before() {
    let data = unhex(POOLS);
    let want = alike(&data, &[1, 7, 64, 997, data.len()], &SMALL_RUNS);
    assert!(want.is_ok(), "{want:?}");
    // 6 + 5 of the first two traces; the first of the next nine (the second declined, and
    // so the third: the loop's); all three with empty frames lists; both of the last.
    assert_eq!(
        taken_each_way(&data),
        (6 + 5 + 9 + 3 + 2, 6 + 5 + 9 + 3 + 2)
    );
    let pools = pools_of(&data);
    assert_eq!(
        pools[..10],
        [
            (0, 1),
            (1, 0),
            (2, 3),
            (300, 70000),
            (1 << 40, i64::MAX as u64),
            (65536, 0),
            (9, 9),
            (u64::MAX, 1),
            // The list `[1, 2]`, a pair too.
            (1, 2),
            (8, 0),
        ]
    );
    assert_eq!(pools.last(), Some(&(6, 0)));
}

/// The same of a snapshot whose entries share a `pool_id` tuple (`pickle` writes it
/// once and reads it back by `BINGET`): `(7, 7)` twice in one batch, `(8, 8)` at the end of
/// the first trace and the start of the second.
const SHARED_POOL: &str = concat!(
    "80049568020000000000007d94288c087365676d656e7473945d948c0178945d94287d94288c046e616d",
    "65948c026630948c0866696c656e616d65948c086d6f64656c2e7079948c046c696e65944b01757d9428",
    "68068c0266319468086809680a4b0275658c0d6465766963655f747261636573945d94285d94287d9428",
    "8c06616374696f6e948c05616c6c6f63948c0461646472944d00108c0473697a65944d00028c06737472",
    "65616d944b008c0774696d655f7573944b018c0f636f6d70696c655f636f6e74657874948c034e2f4194",
    "8c0d757365725f6d65746164617461948c00948c066672616d6573945d94286805680b658c07706f6f6c",
    "5f6964944b034b038694757d94286811681268134d002068144d000268154b0068164b02681768186819",
    "681a681b5d94286805680b65681d4b074b078694757d94286811681268134d003068144d000268154b00",
    "68164b03681768186819681a681b5d94286805680b65681d4b044b048694757d94286811681268134d00",
    "4068144d000268154b0068164b04681768186819681a681b5d94286805680b65681d6821757d94286811",
    "681268134d005068144d000268154b0068164b05681768186819681a681b5d94286805680b65681d4b05",
    "4b058694757d94286811681268134d006068144d000268154b0068164b06681768186819681a681b5d94",
    "286805680b65681d4b084b08869475655d94287d94286811681268134d007068144d000268154b006816",
    "4b07681768186819681a681b5d94286805680b65681d682c757d94286811681268134d008068144d0002",
    "68154b0068164b08681768186819681a681b5d94286805680b65681d4b074b088694756565752e",
);

/// A `pool_id` tuple read back: the single pass takes the entry that makes it (its slot
/// names no container), and gives way to the two passes at the `BINGET`, as the loop's
/// does where the tuple was converted and freed; the second pass leaves the entry that
/// makes it to the loop, as it does one that reads it back.
#[test]
fn a_pool_id_read_back_decodes_as_before() {
    let data = unhex(SHARED_POOL);
    let want = alike(&data, &[1, 7, 64, data.len()], &SMALL_RUNS);
    assert!(want.is_ok(), "{want:?}");
    // The single pass: `(3, 3)`, `(7, 7)`, `(4, 4)`; then `(3, 3)` in the second pass,
    // whose next entry makes the tuple read back.
    assert_eq!(taken_each_way(&data), (3 + 1, 1));
    assert_eq!(
        pools_of(&data),
        [(3, 3), (7, 7), (4, 4), (5, 5), (8, 8), (7, 8)]
    );
}

/// The same of a snapshot of one trace of three entries, the second, `(4, 4)`, with an
/// extra key holding a list of one entry, `(6, 6)`.
const INNER_POOL: &str = concat!(
    "800495a6010000000000007d94288c087365676d656e7473945d948c0178945d94287d94288c046e616d",
    "65948c026630948c0866696c656e616d65948c086d6f64656c2e7079948c046c696e65944b01757d9428",
    "68068c0266319468086809680a4b0275658c0d6465766963655f747261636573945d945d94287d94288c",
    "06616374696f6e948c05616c6c6f63948c0461646472944d00208c0473697a65944d00028c0673747265",
    "616d944b008c0774696d655f7573944b028c0f636f6d70696c655f636f6e74657874948c034e2f41948c",
    "0d757365725f6d65746164617461948c00948c066672616d6573945d94286805680b658c07706f6f6c5f",
    "6964944b054b058694757d94286811681268134d003068144d000268154b0068164b0368176818681968",
    "1a681b5d94286805680b65681d4b044b0486948c056578747261945d947d94286811681268134d001068",
    "144d000268154b0068164b01681768186819681a681b5d94286805680b65681d4b064b0686947561757d",
    "94286811681268134d004068144d000268154b0068164b04681768186819681a681b5d94286805680b65",
    "681d4b034b038694756561752e",
);

/// The loop converts the list inside the second entry, interning its entry's pool, before
/// the trace's `APPENDS` converts the first: the first entry's pool, taken by the fast
/// path, is interned at that `APPENDS`, not when it is read, and the pools are numbered
/// as the loop numbers them.
#[test]
fn a_pool_interned_by_the_loop_before_the_appends_comes_first() {
    let data = unhex(INNER_POOL);
    let want = alike(&data, &[1, 7, 64, data.len()], &SMALL_RUNS);
    assert!(want.is_ok(), "{want:?}");
    assert_eq!(taken_each_way(&data), (1, 1));
    assert_eq!(pools_of(&data), [(6, 6), (5, 5), (4, 4), (3, 3)]);
}

/// A snapshot of 5500 entries in two device traces, each with a `pool_id` of eight
/// (`BININT1`, `BININT2`, `BININT`, `LONG1`s of 5 and 8 bytes), one of 9 bytes in the
/// second trace's second batch, written by [`snapshot_bytes`] as `CPython`'s pickler
/// writes PyTorch 2.12's (`pool_id` last; each entry's tuple its own).
///
/// [`snapshot_bytes`]: crate::snapshot::write::snapshot_bytes
fn generated_with_pools() -> Vec<u8> {
    use crate::snapshot::{Action, RawEvent};
    let mut snap = RawSnapshot::default();
    let frames = super::super::run::tests::model_frames(&mut snap, 6);
    let stacks: Vec<_> = (1..=6)
        .map(|n| snap.frames.intern_stack(&frames[..n]))
        .collect();
    snap.event_pools = vec![
        (0, 0),
        (1, 0),
        (0, 7),
        (300, 2),
        (70_000, 1),
        (1 << 33, 5),
        (i64::MAX as u64, 3),
        (2, 1 << 40),
        (u64::MAX, 0),
    ];
    let trace = |len: usize, big: Option<usize>| -> Vec<RawEvent> {
        (0..len)
            .map(|k| {
                let mut e = RawEvent::new(Action::Alloc, 0x1000 * (k as u64 + 1), 512, 0);
                e.time_us = k as i64;
                e.stack = stacks[k % stacks.len()];
                e.pool = if Some(k) == big {
                    9
                } else {
                    1 + (k * 7 % 8) as u32
                };
                e
            })
            .collect()
    };
    snap.device_traces = vec![trace(3000, None), trace(2500, Some(1500))];
    crate::snapshot::write::snapshot_bytes(&snap)
}

/// The generated snapshot decodes as the loop decodes it, every way, and its entries are
/// taken but the first batch (its first entries write the frame dicts in their frames
/// lists: the loop's, and so the rest of the batch) and the 500 from the 9-byte pool to
/// the end of its batch. (`CPython` pickles what it loads of these bytes into the same
/// bytes, as it does every snapshot the writer writes: `tests/tests/write.rs`.)
#[test]
fn a_generated_snapshot_with_pools_takes_the_fast_path_and_decodes_as_before() {
    let data = generated_with_pools();
    let runs = [
        (997, 4096),
        (1 << 16, 1 << 12),
        (4093, 200),
        (1 << 20, 1 << 20),
    ];
    let want = alike(&data, &[997, 1 << 16, data.len()], &runs);
    let snap = want.expect("decodes");
    assert!(
        snap.contains("(18446744073709551615, 0)"),
        "the 9-byte pool"
    );
    assert_eq!(
        taken_each_way(&data),
        (5500 - 1000 - 500, 5500 - 1000 - 500)
    );
}
