//! The streamed decode (`snapshot::stream`) against the whole-file one: the same snapshot
//! from every corpus file, whatever the pieces and windows; the same error (offset of the
//! whole file included) from every prefix and from damaged files; progress and cancel.

use std::fmt::Write as _;
use std::hash::Hasher;
use std::path::PathBuf;

use allocsim_core::snapshot::import::{self, DecodeOptions, ImportError};
use allocsim_core::snapshot::stream::{self, Progress, StreamDecoder, StreamError, decode_from};
use allocsim_core::snapshot::{RawSnapshot, decode_snapshot};

fn traces_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/traces"));
    dir.is_dir().then_some(dir)
}

/// A digest of everything the snapshot holds (its `Debug` form, hashed as it is written).
fn digest(s: &RawSnapshot) -> (u64, usize) {
    struct H(std::collections::hash_map::DefaultHasher, usize);
    impl std::fmt::Write for H {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0.write(s.as_bytes());
            self.1 += s.len();
            Ok(())
        }
    }
    let mut h = H(std::collections::hash_map::DefaultHasher::new(), 0);
    write!(h, "{s:?}").expect("debug");
    (h.0.finish(), h.1)
}

/// Decodes `bytes` streamed: fed in pieces of `piece` bytes, the machine over windows of
/// about `window` bytes (a plain pickle in a single pass where it can be).
fn streamed(bytes: &[u8], piece: usize, window: u64) -> Result<RawSnapshot, ImportError> {
    streamed_keeping(bytes, piece, window, stream::KEEP_INFLATED_BYTES, u64::MAX)
}

/// [`streamed`] in two passes always (never the single pass).
fn streamed_twice(bytes: &[u8], piece: usize, window: u64) -> Result<RawSnapshot, ImportError> {
    streamed_keeping(bytes, piece, window, stream::KEEP_INFLATED_BYTES, 0)
}

/// [`streamed`], a gzip file's inflated bytes kept while they total at most `keep` bytes,
/// a plain pickle decoded in a single pass first while it is at most `single` bytes.
fn streamed_keeping(
    bytes: &[u8],
    piece: usize,
    window: u64,
    keep: u64,
    single: u64,
) -> Result<RawSnapshot, ImportError> {
    let mut dec = StreamDecoder::new(bytes.len() as u64, DecodeOptions::default())
        .with_window_step(window)
        .with_keep_bound(keep)
        .with_single_pass_max(single);
    // 3: a single pass that gave way, or a second pass run once more; 4: both.
    for pass in 1..=4 {
        assert_eq!(dec.pass(), pass);
        for p in bytes.chunks(piece.max(1)) {
            dec.feed(p)?;
        }
        if let Some(snap) = dec.end_of_input()? {
            return Ok(snap);
        }
    }
    panic!("a fifth pass asked for");
}

/// The whole-file decode, the streamed one (a single pass first) and the two passes give
/// the same snapshot, or the same error.
fn same_result(bytes: &[u8], piece: usize, window: u64, what: &str) {
    let whole = decode_snapshot(bytes);
    for (how, stream) in [
        ("streamed", streamed(bytes, piece, window)),
        (
            "streamed in two passes",
            streamed_twice(bytes, piece, window),
        ),
    ] {
        match (&whole, &stream) {
            (Ok(a), Ok(b)) => assert_eq!(digest(a), digest(b), "{what}, {how}: snapshots differ"),
            (Err(a), Err(b)) => assert_eq!(a, b, "{what}, {how}: errors differ"),
            _ => panic!(
                "{what}, {how}: whole {:?}, streamed {:?}",
                whole.as_ref().map(|_| "snapshot"),
                stream.as_ref().map(|_| "snapshot")
            ),
        }
    }
}

/// The passes a streamed decode of `bytes` took (in 1 MiB pieces).
fn passes_taken(bytes: &[u8]) -> u8 {
    let mut dec = StreamDecoder::new(bytes.len() as u64, DecodeOptions::default());
    loop {
        for p in bytes.chunks(1 << 20) {
            dec.feed(p).expect("feeds");
        }
        let pass = dec.pass();
        if dec.end_of_input().expect("decodes").is_some() {
            return pass;
        }
    }
}

fn corpus() -> Vec<(String, Vec<u8>)> {
    let Some(dir) = traces_dir() else {
        println!("skipped: ../shared/traces is absent");
        return Vec::new();
    };
    let mut out = Vec::new();
    for sub in ["", "incoming"] {
        let Ok(rd) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        let mut names: Vec<PathBuf> = rd
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().ends_with(".pickle.gz"))
            .collect();
        names.sort();
        for p in names {
            let bytes = std::fs::read(&p).expect("read");
            out.push((p.file_name().unwrap().to_string_lossy().into_owned(), bytes));
        }
    }
    out
}

#[test]
fn every_corpus_file_decodes_alike_streamed_gzip_or_plain() {
    for (name, gz) in corpus() {
        let plain = import::gunzip(&gz, u64::MAX).expect("gunzip");
        let want = digest(&decode_snapshot(&gz).expect("decodes"));
        // The gzip file as it is (inflated as it is fed, its inflated bytes kept).
        let got = digest(&streamed(&gz, 1 << 16, 1 << 20).expect("gzip streamed"));
        assert_eq!(want, got, "{name} (gzip)");
        // The plain pickle: big pieces and small windows, then pieces that split every
        // opcode (the small files only).
        let got = digest(&streamed(&plain, 1 << 20, 4096).expect("plain streamed"));
        assert_eq!(want, got, "{name} (plain, single pass, 1 MiB pieces)");
        assert_eq!(passes_taken(&plain), 1, "{name}: its single pass gave way");
        let got = digest(&streamed_twice(&plain, 1 << 20, 4096).expect("plain streamed"));
        assert_eq!(want, got, "{name} (plain, 1 MiB pieces, 4 KiB windows)");
        if plain.len() < 400_000 {
            let got = digest(&streamed(&plain, 7, 512).expect("plain streamed"));
            assert_eq!(want, got, "{name} (plain, single pass, 7-byte pieces)");
            let got = digest(&streamed_twice(&plain, 7, 512).expect("plain streamed"));
            assert_eq!(want, got, "{name} (plain, 7-byte pieces, 512-byte windows)");
        }
    }
}

#[test]
fn every_prefix_fails_as_the_whole_file_does() {
    let Some(dir) = traces_dir() else {
        println!("skipped: ../shared/traces is absent");
        return;
    };
    for name in ["oom_story.pickle.gz", "mempool_use.pickle.gz"] {
        let gz = std::fs::read(dir.join(name)).expect("read");
        let plain = import::gunzip(&gz, u64::MAX).expect("gunzip");
        for n in 0..plain.len() {
            same_result(&plain[..n], 1 + n % 13, 64 + (n as u64 % 5) * 100, name);
        }
        for n in (0..gz.len()).step_by(7) {
            same_result(&gz[..n], 1 + n % 29, 256, name);
        }
    }
}

#[test]
fn damaged_files_fail_as_the_whole_file_does() {
    let Some(dir) = traces_dir() else {
        println!("skipped: ../shared/traces is absent");
        return;
    };
    let gz = std::fs::read(dir.join("mlp_train.pickle.gz")).expect("read");
    let plain = import::gunzip(&gz, u64::MAX).expect("gunzip");
    // A deterministic walk of single-byte changes over the whole file.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..1500 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let mut bytes = plain.clone();
        let at = (state % bytes.len() as u64) as usize;
        bytes[at] = (state >> 32) as u8;
        if round % 3 == 0 {
            bytes.truncate(at + 1 + (state >> 48) as usize % 64);
        }
        same_result(
            &bytes,
            1 + (state >> 20) as usize % 5000,
            64 << (round % 6),
            &format!("mlp_train, byte {at} changed"),
        );
    }
}

#[test]
fn a_gzip_bomb_and_trailing_bytes_are_refused_as_before() {
    use std::io::Write as _;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..300 {
        e.write_all(&zeros).expect("write");
    }
    let bomb = e.finish().expect("gzip");
    same_result(&bomb, 1 << 16, 1 << 20, "gzip bomb");
    assert!(matches!(
        streamed(&bomb, 1 << 16, 1 << 20),
        Err(ImportError::TooLarge { .. })
    ));
    let Some(dir) = traces_dir() else {
        return;
    };
    let mut junk = std::fs::read(dir.join("oom_story.pickle.gz")).expect("read");
    junk.extend_from_slice(b"junk");
    same_result(&junk, 100, 256, "trailing junk");
    let mut padded = std::fs::read(dir.join("oom_story.pickle.gz")).expect("read");
    padded.extend_from_slice(&[0; 100]);
    same_result(&padded, 100, 256, "zero padding");
}

#[test]
fn progress_reaches_the_end_of_each_pass_and_cancel_stops_the_decode() {
    let Some(dir) = traces_dir() else {
        println!("skipped: ../shared/traces is absent");
        return;
    };
    let gz = std::fs::read(dir.join("wrapped_history_pub.pickle.gz")).expect("read");
    let plain = import::gunzip(&gz, u64::MAX).expect("gunzip");
    for bytes in [&gz, &plain] {
        let mut seen: Vec<Progress> = Vec::new();
        let mut opens = 0;
        let snap = decode_from(
            &mut || {
                opens += 1;
                Ok(std::io::Cursor::new(bytes.as_slice()))
            },
            bytes.len() as u64,
            DecodeOptions::default(),
            4096,
            &mut |p| {
                seen.push(p);
                true
            },
        )
        .expect("decodes");
        assert_eq!(
            digest(&snap),
            digest(&decode_snapshot(bytes).expect("whole")),
            "same snapshot"
        );
        // A plain pickle this small is read once, in a single pass; a gzip file once too
        // (inflated as it is read), its second pass over the inflated bytes kept.
        assert_eq!(opens, 1);
        let fractions: Vec<f32> = seen.iter().map(Progress::fraction).collect();
        assert!(fractions.windows(2).all(|w| w[0] <= w[1]), "{fractions:?}");
        let passes = if bytes == &gz { 2 } else { 1 };
        assert!((1..=passes).all(|n| seen.iter().any(|p| (p.pass, p.passes) == (n, passes))));
        let last = seen.last().expect("progress");
        assert_eq!((last.pass, last.bytes_done), (passes, last.bytes_total));
        assert!((last.fraction() - 1.0).abs() < 1e-6, "{last:?}");
        // Cancelled three quarters of the way: the decode stops there.
        let mut calls = 0;
        let r = decode_from(
            &mut || Ok(std::io::Cursor::new(bytes.as_slice())),
            bytes.len() as u64,
            DecodeOptions::default(),
            4096,
            &mut |p| {
                calls += 1;
                p.fraction() < 0.75
            },
        );
        assert!(matches!(
            r,
            Err(StreamError::Import(ImportError::Cancelled))
        ));
        if bytes == &plain {
            assert!(
                calls < seen.len() && calls > 1,
                "stopped early: {calls} of {}",
                seen.len()
            );
        }
    }
}

#[test]
fn a_read_error_names_its_offset() {
    struct Failing(u64);
    impl std::io::Read for Failing {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.0 >= 10 {
                return Err(std::io::Error::other("disk gone"));
            }
            let n = buf.len().min(3);
            buf[..n].fill(b'(');
            self.0 += n as u64;
            Ok(n)
        }
    }
    let r = decode_from(
        &mut || Ok(Failing(0)),
        100,
        DecodeOptions::default(),
        3,
        &mut |_| true,
    );
    let e = r.expect_err("fails").to_string();
    assert_eq!(e, "cannot read byte 12: disk gone");
}

/// A gzip file of `plain`, in `members` members of about equal size.
fn gzip_members(plain: &[u8], members: usize) -> Vec<u8> {
    use std::io::Write as _;
    let mut out = Vec::new();
    for part in plain.chunks(plain.len().div_ceil(members.max(1)).max(1)) {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(part).expect("write");
        out.extend_from_slice(&e.finish().expect("gzip"));
    }
    out
}

/// A pickle snapshot of `events` allocations, so that the gzip tests run without the
/// corpus too.
fn synthetic_pickle(events: u64) -> Vec<u8> {
    use allocsim_core::snapshot::{Action, RawEvent};
    let mut snap = RawSnapshot::default();
    snap.device_traces.push(
        (0..events)
            .map(|i| RawEvent::new(Action::Alloc, 0x1000 * (i + 1), 512 + i % 7, 0))
            .collect(),
    );
    allocsim_core::snapshot::write::snapshot_bytes(&snap)
}

#[test]
fn every_corpus_gzip_decodes_alike_in_pieces_of_every_size() {
    for (name, gz) in corpus() {
        let want = digest(&decode_snapshot(&gz).expect("decodes"));
        for piece in [1, 100, 4096, 1 << 16, 1 << 20] {
            // Pieces of 1 byte: the smaller files only (a million feeds is slow, not
            // different).
            if piece == 1 && gz.len() > 400_000 {
                continue;
            }
            let got = digest(&streamed(&gz, piece, 1 << 20).expect("gzip streamed"));
            assert_eq!(want, got, "{name} in pieces of {piece} bytes");
        }
    }
}

#[test]
fn gzip_past_the_keep_bound_is_inflated_again_to_the_same_snapshot() {
    let mut files = corpus();
    files.retain(|(name, _)| name.starts_with("kvcache_decode.") || name.starts_with("mlp_train."));
    files.push((
        "synthetic".into(),
        gzip_members(&synthetic_pickle(20_000), 1),
    ));
    for (name, gz) in files {
        let want = digest(&decode_snapshot(&gz).expect("decodes"));
        let inflated = import::gunzip(&gz, u64::MAX).expect("gunzip").len() as u64;
        // Nothing kept, a little, all but the last byte, exactly all (kept).
        for keep in [0, 4096, inflated - 1, inflated] {
            for piece in [1000, 1 << 20] {
                let got = digest(
                    &streamed_keeping(&gz, piece, 1 << 16, keep, u64::MAX).expect("gzip streamed"),
                );
                assert_eq!(
                    want, got,
                    "{name}: kept up to {keep} bytes, pieces of {piece}"
                );
            }
        }
    }
}

#[test]
fn several_members_and_zero_padding_decode_streamed_as_whole() {
    let mut plains = vec![("synthetic".to_string(), synthetic_pickle(5_000))];
    for (name, gz) in corpus() {
        if name.starts_with("mlp_train.") || name.starts_with("gpt_varlen_train_s1.") {
            plains.push((name, import::gunzip(&gz, u64::MAX).expect("gunzip")));
        }
    }
    for (name, plain) in plains {
        let want = digest(&decode_snapshot(&plain).expect("decodes"));
        for members in [2, 3, 17] {
            let mut gz = gzip_members(&plain, members);
            for padding in [0, 1, 512] {
                gz.resize(gz.len() + padding, 0);
                for piece in [1, 9, 4096, 1 << 20] {
                    let got = digest(
                        &streamed_keeping(&gz, piece, 4096, 1 << 16, u64::MAX)
                            .expect("several members streamed"),
                    );
                    assert_eq!(
                        want, got,
                        "{name}: {members} members, {padding} bytes of padding, pieces of {piece}"
                    );
                    let got = digest(&streamed(&gz, piece, 4096).expect("kept"));
                    assert_eq!(
                        want, got,
                        "{name}: {members} members, kept, pieces of {piece}"
                    );
                }
            }
        }
    }
}

#[test]
fn truncated_gzip_fails_streamed_as_whole_with_a_gzip_error() {
    let mut files = corpus();
    files.retain(|(name, _)| {
        name.starts_with("kvcache_decode.") || name.starts_with("multistream_pub.")
    });
    files.push((
        "synthetic".into(),
        gzip_members(&synthetic_pickle(20_000), 1),
    ));
    for (name, gz) in files {
        let len = gz.len();
        for cut in [
            2,
            3,
            10,
            11,
            100,
            len / 3,
            len / 2,
            len - 9,
            len - 8,
            len - 4,
            len - 1,
        ] {
            let bytes = &gz[..cut];
            let whole = decode_snapshot(bytes).expect_err("truncated");
            assert!(
                matches!(whole, ImportError::Gzip { .. }),
                "{name} cut at {cut}: {whole}"
            );
            for piece in [1, 4096, 1 << 20] {
                for keep in [0, stream::KEEP_INFLATED_BYTES] {
                    let e = streamed_keeping(bytes, piece, 1 << 16, keep, u64::MAX)
                        .expect_err("truncated");
                    assert_eq!(e, whole, "{name} cut at {cut}, pieces of {piece}");
                }
            }
        }
    }
}

#[test]
fn a_gzip_bomb_is_refused_streamed_in_any_pieces() {
    use std::io::Write as _;
    // A pickle's first byte, then zeros: it is a pickle's pre-pass that is fed.
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(&[0x80, 4]).expect("write");
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..300 {
        e.write_all(&zeros).expect("write");
    }
    let bomb = e.finish().expect("gzip");
    let limit = import::decompression_cap(bomb.len());
    assert!(
        limit < 300 << 20,
        "a bomb: {} bytes inflate past {limit}",
        bomb.len()
    );
    for piece in [4096, 1 << 20, bomb.len()] {
        for keep in [0, stream::KEEP_INFLATED_BYTES] {
            let e = streamed_keeping(&bomb, piece, 1 << 20, keep, u64::MAX).expect_err("refused");
            assert_eq!(e, ImportError::TooLarge { limit_bytes: limit });
        }
    }
    // And the caller's own limit, under the cap.
    let mut dec = StreamDecoder::new(
        bomb.len() as u64,
        DecodeOptions {
            max_decompressed_bytes: 1 << 20,
        },
    );
    let e = bomb
        .chunks(1000)
        .try_for_each(|p| dec.feed(p))
        .expect_err("refused");
    assert_eq!(
        e,
        ImportError::TooLarge {
            limit_bytes: 1 << 20
        }
    );
}

#[test]
fn gzip_progress_counts_the_file_then_the_kept_bytes() {
    let plain = synthetic_pickle(20_000);
    let gz = gzip_members(&plain, 1);
    for (keep, second_total) in [
        (stream::KEEP_INFLATED_BYTES, plain.len() as u64),
        (0, gz.len() as u64),
    ] {
        let mut dec =
            StreamDecoder::new(gz.len() as u64, DecodeOptions::default()).with_keep_bound(keep);
        for p in gz.chunks(1000) {
            dec.feed(p).expect("feeds");
            assert_eq!(dec.progress().pass, 1);
        }
        assert_eq!(dec.progress().bytes_done, gz.len() as u64);
        let mut seen = Vec::new();
        dec.end_of_input_with(&mut |p| {
            seen.push(p);
            true
        })
        .expect("decodes")
        .expect("a snapshot");
        let last = seen.last().expect("progress in the second pass");
        assert_eq!(
            (last.pass, last.bytes_done, last.bytes_total),
            (2, second_total, second_total),
            "kept up to {keep}"
        );
    }
}

/// `{'segments': [], 'device_traces': [[d]], 'extra': d}` for a trace entry `d`, as
/// `CPython`'s protocol 4 pickles it: `extra` reads `d` back (`BINGET`) after its list
/// consumed it.
const ENTRY_READ_AFTER: &str = "80049572000000000000007d94288c087365676d656e7473945d948c0d6465766963655f747261636573945d945d947d94288c06616374696f6e948c05616c6c6f63948c0461646472944d00108c0473697a65944d00028c0673747265616d944b008c0774696d655f7573944b017561618c056578747261946806752e";

/// The same dict with `extra` first: the list reads `d` back before it consumes it.
const ENTRY_READ_BEFORE: &str = "80049572000000000000007d94288c056578747261947d94288c06616374696f6e948c05616c6c6f63948c0461646472944d00108c0473697a65944d00028c0673747265616d944b008c0774696d655f7573944b01758c087365676d656e7473945d948c0d6465766963655f747261636573945d945d9468026161752e";

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn an_entry_read_back_after_its_list_consumed_it_gives_way_to_the_two_passes() {
    for (hex, passes) in [(ENTRY_READ_AFTER, 3), (ENTRY_READ_BEFORE, 1)] {
        let bytes = unhex(hex);
        let whole = decode_snapshot(&bytes).expect("decodes whole");
        assert_eq!(whole.device_traces.first().map(Vec::len), Some(1));
        for piece in [1, 5, bytes.len()] {
            let mut dec = StreamDecoder::new(bytes.len() as u64, DecodeOptions::default());
            let mut last = None;
            let snap = loop {
                for p in bytes.chunks(piece) {
                    dec.feed(p).expect("feeds");
                    last = Some(dec.progress());
                }
                if let Some(snap) = dec.end_of_input().expect("decodes") {
                    break snap;
                }
            };
            assert_eq!(digest(&snap), digest(&whole), "pieces of {piece}");
            let last = last.expect("progress");
            assert_eq!(
                (last.pass, last.passes),
                (passes, passes),
                "pieces of {piece}"
            );
        }
    }
}

/// A file the fuzzer made (`fuzz/seeds/four_passes.pickle`): the single pass gives way to
/// two, whose second pass meets a guarded list of entries and runs once more without the
/// fast path: four passes, and the whole-file decode's answer.
#[test]
fn a_single_pass_given_way_and_a_second_pass_run_again_take_four_passes() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fuzz/seeds/four_passes.pickle"
    );
    let bytes = std::fs::read(path).expect("the seed");
    let mut dec = StreamDecoder::new(bytes.len() as u64, DecodeOptions::default());
    let mut passes = 0;
    let got = loop {
        passes += 1;
        assert!(passes <= 4, "a fifth pass asked for");
        let fed = bytes.chunks(61).try_for_each(|p| dec.feed(p));
        match fed.and_then(|()| dec.end_of_input()) {
            Ok(None) => {}
            Ok(Some(snap)) => break Ok(snap),
            Err(e) => break Err(e),
        }
    };
    assert_eq!(passes, 4);
    match (decode_snapshot(&bytes), got) {
        (Ok(a), Ok(b)) => assert_eq!(digest(&a), digest(&b)),
        (Err(a), Err(b)) => assert_eq!(a, b),
        (a, b) => panic!("whole {:?}, streamed {:?}", a.is_ok(), b.is_ok()),
    }
    same_result(&bytes, 61, 1 << 20, "four_passes.pickle");
}
