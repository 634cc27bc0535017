//! A snapshot file read in pieces (natively): the desktop app's File > Open, drop and
//! command line, and the CLI's FILE. The file is read [`PIECE_BYTES`] at a time (a plain
//! pickle twice, see core's `snapshot::stream`), so its bytes are never all in memory;
//! progress goes to a callback, which cancels by returning false.

use std::io::Read;
use std::path::Path;
use std::sync::mpsc;

use allocsim_core::build::{self, Streamed};
use allocsim_core::models::ModelSpec;
use allocsim_core::replay::ReplayResult;
use allocsim_core::snapshot::import::{DecodeOptions, ImportError};
use allocsim_core::snapshot::stream::{Progress, StreamDecoder, StreamError};
use allocsim_core::snapshot::{Action, RawSnapshot};
use allocsim_core::trace::{OpsPiece, SnapshotInfo, StartSegment};
use allocsim_core::validate::Validation;

use super::wire::{MainReplay, Response};

/// The file is read this many bytes at a time.
pub const PIECE_BYTES: usize = 4 << 20;

/// Why a file did not decode.
#[derive(Debug)]
pub enum OpenError {
    /// The progress callback asked to stop.
    Cancelled,
    /// One line naming the file: it cannot be read, or is no snapshot (with the byte
    /// offset in the whole file).
    Failed(String),
}

/// Pieces read ahead of the decode: the reading thread may be this many pieces ahead.
const AHEAD: usize = 4;

/// Decodes the snapshot at `path`, read in pieces. The pieces are read on a thread of
/// their own, up to [`AHEAD`] ahead of the decode, so that the kernel's copy of the file
/// (twice for a plain pickle) is not on the decoding thread.
pub fn decode_file(
    path: &Path,
    progress: &mut dyn FnMut(Progress) -> bool,
) -> Result<RawSnapshot, OpenError> {
    let shown = path.display();
    let cannot_read = |e: std::io::Error| OpenError::Failed(format!("{shown}: cannot read: {e}"));
    let len = std::fs::metadata(path).map_err(cannot_read)?.len();
    // A large plain pickle: its second pass on several threads, each reading its part of
    // the file (core's `stream::decode_file_parallel`; `None`: the streamed way below).
    #[cfg(unix)]
    if let Ok(file) = std::fs::File::open(path) {
        use std::os::unix::fs::FileExt;
        let read_at = |at: u64, buf: &mut [u8]| file.read_exact_at(buf, at);
        match allocsim_core::snapshot::stream::decode_file_parallel(&read_at, len, progress) {
            Some(Ok(snap)) => return Ok(snap),
            Some(Err(ImportError::Cancelled)) => return Err(OpenError::Cancelled),
            Some(Err(e)) => return Err(OpenError::Failed(format!("{shown}: {e}"))),
            None => {}
        }
    }
    let mut dec = StreamDecoder::new(len, DecodeOptions::default());
    let failed = |e: StreamError| match e {
        StreamError::Import(ImportError::Cancelled) => OpenError::Cancelled,
        StreamError::Read { offset: 0, error } => cannot_read(error),
        e => OpenError::Failed(format!("{shown}: {e}")),
    };
    loop {
        let file = std::fs::File::open(path).map_err(cannot_read)?;
        read_ahead(file, &mut |piece| {
            dec.feed(piece)?;
            if progress(dec.progress()) {
                Ok(())
            } else {
                Err(ImportError::Cancelled.into())
            }
        })
        .map_err(failed)?;
        if let Some(snap) = dec
            .end_of_input_with(progress)
            .map_err(|e| failed(e.into()))?
        {
            return Ok(snap);
        }
    }
}

/// Reads `reader` to its end in pieces of [`PIECE_BYTES`] on a thread of its own and hands
/// each to `consume`, in order; an error of either ends it (the reader's as
/// [`StreamError::Read`] at the offset of the first byte not handed on), and the thread
/// stops with it. The pieces' buffers go back to the reader once consumed.
fn read_ahead<R: Read + Send>(
    mut reader: R,
    consume: &mut dyn FnMut(&[u8]) -> Result<(), StreamError>,
) -> Result<(), StreamError> {
    std::thread::scope(|s| {
        let (full, pieces) = mpsc::sync_channel::<std::io::Result<(Vec<u8>, usize)>>(AHEAD);
        let (give_back, returned) = mpsc::channel::<Vec<u8>>();
        s.spawn(move || {
            loop {
                let mut buf = returned.try_recv().unwrap_or_else(|_| vec![0; PIECE_BYTES]);
                let read = loop {
                    match reader.read(&mut buf) {
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        r => break r,
                    }
                };
                // A send fails once the decode has stopped: so does this thread.
                let sent = match read {
                    Ok(0) => return,
                    Ok(n) => full.send(Ok((buf, n))),
                    Err(e) => {
                        let _ = full.send(Err(e));
                        return;
                    }
                };
                if sent.is_err() {
                    return;
                }
            }
        });
        let mut offset = 0u64;
        for piece in &pieces {
            let (buf, n) = piece.map_err(|error| StreamError::Read { offset, error })?;
            let bytes = buf.get(..n).unwrap_or(&[]);
            consume(bytes)?;
            offset += n as u64;
            // The reader may have stopped (its last piece): the buffer is then dropped.
            let _ = give_back.send(buf);
        }
        Ok(())
    })
}

/// The main configuration's replay done beside the trace's build ([`build_beside`]):
/// the answer to the UI's [`super::wire::Request::Replay`] of `spec` under
/// `capacity_bytes` on device `device`, should it ask for exactly that.
#[derive(Debug)]
pub struct Beside {
    pub spec: String,
    pub capacity_bytes: Option<u64>,
    pub device: usize,
    pub result: ReplayResult,
}

/// The model of `main` where it may be replayed before the UI asks for it (beside the
/// build, or after it in the browser's worker): not for a recording of `snap` with a
/// refusal on its busiest device under a capacity as recorded (likely inferred: not the
/// unlimited one assumed).
#[must_use]
pub fn replayed_ahead(snap: &RawSnapshot, main: &MainReplay) -> Option<ModelSpec> {
    let d = super::recorded::busiest_device(snap);
    let events = snap
        .device_traces
        .get(d as usize)
        .map_or(&[][..], Vec::as_slice);
    let refused = events.iter().any(|e| e.action == Action::Oom);
    ModelSpec::parse(&main.spec)
        .ok()
        .filter(|_| !(main.as_recorded && refused))
}

/// `main` (its model `spec`: [`replayed_ahead`]) replayed on device `device` of the built
/// `trace` before the UI asks, as the engine replays it when asked (the browser's worker,
/// which has no thread to replay it beside the build).
#[must_use]
pub fn replay_built(
    trace: &allocsim_core::trace::Trace,
    device: usize,
    main: &MainReplay,
    spec: &ModelSpec,
) -> Option<Beside> {
    let capacity = main.capacity_bytes;
    allocsim_core::session::replay_device(trace, device, spec, capacity, super::drawn_replay())
        .ok()
        .map(|result| Beside {
            spec: main.spec.clone(),
            capacity_bytes: capacity,
            device,
            result,
        })
}

/// Builds the trace of `snap` (as `build::build`, no capacity given), keeping the replay of
/// `main` (its model `spec`: [`replayed_ahead`]) on the busiest device where the build's
/// first pass is that replay (`session::build_replaying`: the main configuration is the
/// recorded one, under no capacity, as the build runs, and the pass steps every op as a
/// replay does). For the browser's worker, alone on its thread, which would otherwise
/// replay the trace after building it; whether the device is the built trace's busiest
/// is for the caller to check.
///
/// # Errors
/// The build's.
pub fn build_keeping_replay(
    snap: RawSnapshot,
    main: &MainReplay,
    spec: &ModelSpec,
) -> Result<(Validation, Option<Beside>), allocsim_core::Error> {
    if main.capacity_bytes.is_some() {
        return build::build(snap, None).map(|v| (v, None));
    }
    let d = super::recorded::busiest_device(&snap);
    let (v, replayed) =
        allocsim_core::session::build_replaying(snap, None, d, spec, super::drawn_replay())?;
    let kept = replayed.map(|result| Beside {
        spec: main.spec.clone(),
        capacity_bytes: None,
        device: d as usize,
        result,
    });
    Ok((v, kept))
}

/// Builds the trace of `snap` (as `build::build`, no capacity given) while `main` replays
/// its busiest device on another thread, fed the start state and ops as the build makes
/// them (`build::build_streaming`, as `allocsim replay FILE` does), its checkpoints spaced
/// from the ops expected (`build::expected_ops`). The replay is kept only where the build
/// says what it handed on is the trace's start state and ops and the device is the built
/// trace's busiest; whether its capacity is the one asked for is for the asker to check.
/// A recording with a refusal under a capacity as recorded (likely inferred: not the
/// unlimited one assumed) is not replayed beside.
///
/// Nothing waits that need not: `first` reads the snapshot on the calling thread while
/// the build runs on another (the engine's recorded timeline: it is emitted from there),
/// then what the trace keeps of the entries ([`SnapshotInfo::read`]); the replay's own
/// preparations (the refusal looked for among them) are made on a thread while the build
/// checks the recording and rebuilds its start state. Once the devices are built, the
/// snapshot's entries are dropped before anything else is made (the ops table after them
/// would raise the peak: 0.26 GB more on the 1.12 GB snapshot).
pub fn build_beside(
    snap: RawSnapshot,
    main: &MainReplay,
    first: impl FnOnce(&RawSnapshot),
) -> (Result<Validation, allocsim_core::Error>, Option<Beside>) {
    let d = super::recorded::busiest_device(&snap);
    // Whether the recording was refused memory ([`replayed_ahead`]) is read with the
    // replay's preparations, beside the build.
    let spec = ModelSpec::parse(&main.spec).ok();
    let capacity = main.capacity_bytes;
    let (built, result, read) = std::thread::scope(|s| {
        let snap = &snap;
        let building = s.spawn(move || {
            let Some(spec) = spec else {
                return (build::build_devices(snap, None, None), None);
            };
            let settings = &snap.settings;
            let events = snap
                .device_traces
                .get(d as usize)
                .map_or(&[][..], Vec::as_slice);
            // The replay's preparations, made while the build checks the recording and
            // rebuilds its start state.
            let prepared = s.spawn(|| {
                (
                    main.as_recorded && events.iter().any(|e| e.action == Action::Oom),
                    build::segment_events(events),
                    build::expected_ops(events, &[]),
                )
            });
            build_devices_replaying(snap, None, Some(d), move |start, pieces| {
                let (refused, segment_events, expected) = prepared
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                if refused {
                    return None;
                }
                // The ops of the blocks alive at the start are added to those expected.
                let blocks: usize = start.iter().map(|s| s.blocks.len()).sum();
                let expected = expected + blocks;
                allocsim_core::session::replay_streamed(
                    settings,
                    &segment_events,
                    &spec,
                    capacity,
                    super::drawn_replay(),
                    start,
                    Some(expected),
                    pieces,
                )
                .ok()
            })
        });
        first(snap);
        // What the trace keeps of the entries, read while the build runs.
        let read = SnapshotInfo::read(snap);
        let (built, result) = building
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (built, result, read)
    });
    let built = match built {
        Ok(b) => b,
        Err(e) => return (Err(e), None),
    };
    let (v, exact) = built.validation(snap, read);
    let kept = result
        .filter(|_| exact && v.trace.busiest_device() == d as usize)
        .map(|result| Beside {
            spec: main.spec.clone(),
            capacity_bytes: capacity,
            device: d as usize,
            result,
        });
    (Ok(v), kept)
}

/// Builds `snap` (`build::build_streaming` under `capacity`) while `replay` runs on
/// another thread, given device `device`'s start state and then its ops in pieces as the
/// build makes them (none: no replay). Both answers, and the build's word on whether what
/// it handed on is that device's start state and ops in the trace (else the replay's
/// answer is not the trace's).
pub fn build_replaying<T: Send>(
    snap: RawSnapshot,
    capacity: Option<u64>,
    device: Option<u32>,
    replay: impl FnOnce(&[StartSegment], &mut dyn Iterator<Item = OpsPiece>) -> Option<T> + Send,
) -> (Result<(Validation, bool), allocsim_core::Error>, Option<T>) {
    let (built, replayed) = build_devices_replaying(&snap, capacity, device, replay);
    let built = built.map(|b| {
        let read = SnapshotInfo::read(&snap);
        b.validation(snap, read)
    });
    (built, replayed)
}

/// [`build_replaying`]'s work on every device (`build::build_devices`), the snapshot
/// borrowed.
fn build_devices_replaying<T: Send>(
    snap: &RawSnapshot,
    capacity: Option<u64>,
    device: Option<u32>,
    replay: impl FnOnce(&[StartSegment], &mut dyn Iterator<Item = OpsPiece>) -> Option<T> + Send,
) -> (Result<build::Built, allocsim_core::Error>, Option<T>) {
    std::thread::scope(|s| {
        let (start_tx, start_rx) = mpsc::sync_channel::<Vec<StartSegment>>(1);
        let (ops_tx, ops_rx) = mpsc::sync_channel::<OpsPiece>(8);
        let replayed = s.spawn(move || {
            let start = start_rx.recv().ok()?;
            replay(&start, &mut ops_rx.into_iter())
        });
        // Sends fail only once the replay has stopped: the build goes on regardless.
        let mut sink = move |x: Streamed<'_>| match x {
            Streamed::Start(start) => {
                let _ = start_tx.send(start.to_vec());
            }
            Streamed::Ops(ops, pools) => {
                let _ = ops_tx.send(OpsPiece {
                    ops: ops.to_vec(),
                    pools: pools.to_vec(),
                });
            }
        };
        let built = build::build_devices(
            snap,
            capacity,
            device.map(|d| (d, &mut sink as &mut dyn FnMut(Streamed<'_>))),
        );
        // The replay's pieces end here (and without a device, its start state).
        drop(sink);
        (built, replayed.join().ok().flatten())
    })
}

/// The decode's progress as the engine's [`Response::Progress`], at most every half
/// percent: the share of the whole open (the decode is its first half).
#[derive(Debug)]
pub struct ProgressReport {
    job: u64,
    name: String,
    shown: f32,
}

impl ProgressReport {
    #[must_use]
    pub fn new(job: u64, name: &str) -> ProgressReport {
        ProgressReport {
            job,
            name: name.to_string(),
            shown: -1.0,
        }
    }

    pub fn report(&mut self, p: Progress, emit: &mut dyn FnMut(Response)) {
        let fraction = 0.05 + 0.45 * p.fraction();
        if fraction - self.shown >= 0.005 {
            self.shown = fraction;
            emit(Response::Progress {
                job: self.job,
                stage: if p.passes > 1 {
                    format!("reading {} ({} of {})", self.name, p.pass, p.passes)
                } else {
                    format!("reading {}", self.name)
                },
                fraction,
            });
        }
    }
}

/// What one wasm instance of the browser's app holds at its peak while it opens a snapshot
/// of `plain_bytes` (uncompressed), as a multiple of that size. The engine's worker and the
/// page each have a memory of their own, and neither is ever given back. Measured in
/// headless Chromium on the 1.12 GB generated snapshot (`web/tests/bench.mjs`, which reads
/// both memories after the open): the worker 2,223 MiB (2.07× the file: the decode's
/// high-water mark, 1,583 MiB, then two replays), the page 2,210 MiB (2.06×: the ops table,
/// the recorded timeline, the replays' views, the bands). With a margin: 2.5, so files up
/// to 1.7 GB are tried. A frame-less snapshot costs more per byte (the 1 M-event synthetic's
/// decode peaks at 2.9× its 74.5 MB), so one near that size may still run out: its worker
/// then stops and the open fails with a message (`worker.js`), never a hang.
pub const PEAK_MEMORY_PER_BYTE: f64 = 2.5;

/// Where a WebAssembly engine cannot open a snapshot (its memory ends at 4 GiB): the
/// one-line message to show before starting, or `None`. `plain_bytes`: the file's size,
/// or for gzip the size its trailer states (at least 8 times the compressed size, what
/// PyTorch's pickles inflate to at the least).
#[must_use]
pub fn too_big_for_wasm(name: &str, plain_bytes: u64) -> Option<String> {
    const WASM_MEMORY: f64 = 4.0 * (1u64 << 30) as f64;
    let need = plain_bytes as f64 * PEAK_MEMORY_PER_BYTE;
    (need > WASM_MEMORY).then(|| {
        format!(
            "{name}: {:.1} GB of snapshot needs about {:.1} GB of memory to open, more than the \
             4 GiB a browser gives WebAssembly: open it in the desktop app (allocsim open FILE)",
            plain_bytes as f64 / 1e9,
            need / 1e9
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source of `len` bytes (byte `i` is `i % 251`) that fails with `fail` once
    /// `fail_at` bytes are read, handing out at most `step` bytes a read.
    struct Source {
        at: usize,
        len: usize,
        step: usize,
        fail_at: Option<usize>,
    }

    impl Read for Source {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.fail_at.is_some_and(|f| self.at >= f) {
                return Err(std::io::Error::other("the disk said no"));
            }
            let end = self
                .len
                .min(self.at + self.step.min(buf.len()))
                .min(self.fail_at.unwrap_or(usize::MAX));
            let n = end - self.at;
            for (k, b) in buf[..n].iter_mut().enumerate() {
                *b = ((self.at + k) % 251) as u8;
            }
            self.at = end;
            Ok(n)
        }
    }

    fn source(len: usize, fail_at: Option<usize>) -> Source {
        Source {
            at: 0,
            len,
            step: PIECE_BYTES / 3 + 7,
            fail_at,
        }
    }

    #[test]
    fn every_byte_arrives_once_and_in_order() {
        let len = (AHEAD + 3) * PIECE_BYTES + 12_345;
        let mut seen = 0usize;
        read_ahead(source(len, None), &mut |piece| {
            for (k, &b) in piece.iter().enumerate() {
                assert_eq!(b, ((seen + k) % 251) as u8, "byte {}", seen + k);
            }
            seen += piece.len();
            Ok(())
        })
        .expect("reads");
        assert_eq!(seen, len);
    }

    #[test]
    fn a_read_error_names_the_offset_of_the_first_byte_not_handed_on() {
        let fail_at = 2 * PIECE_BYTES + 1_000;
        let mut seen = 0usize;
        let e = read_ahead(source(10 * PIECE_BYTES, Some(fail_at)), &mut |piece| {
            seen += piece.len();
            Ok(())
        })
        .expect_err("fails");
        assert_eq!(seen, fail_at);
        match e {
            StreamError::Read { offset, error } => {
                assert_eq!(offset, fail_at as u64);
                assert_eq!(error.to_string(), "the disk said no");
            }
            other @ StreamError::Import(_) => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_decode_that_stops_stops_the_reader() {
        // A source far longer than the decode reads: the reader, blocked ahead of it,
        // must stop with it (else this test hangs).
        let mut pieces = 0;
        let e = read_ahead(source(usize::MAX / 2, None), &mut |_| {
            pieces += 1;
            if pieces == 3 {
                Err(ImportError::Cancelled.into())
            } else {
                Ok(())
            }
        })
        .expect_err("stopped");
        assert!(
            matches!(e, StreamError::Import(ImportError::Cancelled)),
            "{e:?}"
        );
        assert_eq!(pieces, 3);
    }
}
