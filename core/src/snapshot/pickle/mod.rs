//! A pickle decoder for the subset snapshots use; it never executes anything.
//!
//! PyTorch writes snapshots with `pickle.dump` (protocol 4 on current Pythons, 5 on some):
//! plain dicts, lists, tuples, strings, ints, floats and bools. This module runs the
//! pickle machine over exactly those opcodes and refuses every opcode that would import
//! or call code (`GLOBAL`, `REDUCE`, `BUILD`, …).
//!
//! Why it is shaped the way it is:
//! - **No generic tree of the whole file.** A trace entry is ~86 bytes of pickle but would
//!   be several hundred as a tree, so the machine converts as it goes: a frame dict
//!   becomes a [`FrameId`] and a trace-entry dict a [`RawEvent`] the moment a list
//!   consumes it (`APPEND`/`APPENDS`), and a list stored under a `frames` key becomes a
//!   [`StackId`] the moment its dict consumes it (`SETITEM(S)`). Objects are complete
//!   when consumed: `pickle.dump` builds each object fully before using it.
//! - **A pre-pass over the opcodes** finds which memo slots are ever read back (`GET`).
//!   Only those are stored (protocol 4 memoizes every object, so storing all would cost
//!   16 bytes per object), and only objects stored there can be seen twice. Every other
//!   converted object is dropped on the spot and its slot reused.
//! - Memo-shared frame dicts and frame lists (each frame dict is referenced by many
//!   stacks) are converted once and remember the result ("sealed"); a pickle that changes
//!   a sealed object afterwards is refused rather than decoded wrongly.
//! - Strings, bytes and wide integers are byte ranges into the input, never copied
//!   (escaped protocol-0 text is decoded into one scratch buffer).
//! - The machine is a loop over an explicit stack: nesting depth costs heap, not call
//!   stack. Every length is checked against the remaining input before use.

mod chunked;
mod convert;
mod entry;
mod fields;
mod ints;
mod machine;
mod mapping;
mod memo;
mod opcodes;
mod parallel;
mod prepass;
mod run;
mod segments;
mod stream;
mod text;
mod tree;
mod value;

pub use chunked::ReadAt;
pub use mapping::{BYTES_PER_ELEMENT, ELEMENT_SLACK};
pub use stream::{PickleStream, SINGLE_PASS_MAX_BYTES, WINDOW_STEP};
pub use tree::{MAX_VALUE_DEPTH, PyValue, decode_value};

use super::RawSnapshot;
use super::error::ImportError;
use machine::Vm;

/// Decodes a snapshot pickle (uncompressed); a large one on several threads
/// ([`parallel`]) where the machine has them.
pub(crate) fn decode_snapshot_pickle(data: &[u8]) -> Result<RawSnapshot, ImportError> {
    #[cfg(not(target_arch = "wasm32"))]
    if data.len() >= parallel::PARALLEL_MIN_BYTES {
        let plan = parallel::Plan::for_input(data.len());
        if plan.threads > 1 {
            return parallel::decode(data, plan, &|_| {}).0;
        }
    }
    decode_serial(data)
}

/// Decodes a snapshot pickle (uncompressed) on `threads` threads whatever its size, or
/// serially for 0 (benchmarks); also the chunks decoded apart (0: serially).
#[doc(hidden)]
pub fn decode_with_threads(
    data: &[u8],
    threads: usize,
) -> (Result<RawSnapshot, ImportError>, usize) {
    if threads == 0 {
        return (decode_serial(data), 0);
    }
    let plan = parallel::Plan {
        threads,
        ..parallel::Plan::for_input(data.len())
    };
    parallel::decode(data, plan, &|_| {})
}

/// Decodes the plain pickle file of `len` bytes that `read_at` reads, its second pass on
/// several threads, where the file is large (64 MiB or more) and the machine has them
/// (native); `progress(pass, bytes done)` returns false to cancel. `None`: not decoded
/// this way (large-file conditions unmet, or anything unexpected, bad input included):
/// decode it the streamed way, which reports as ever.
pub(crate) fn decode_file_parallel(
    read_at: &ReadAt<'_>,
    len: u64,
    progress: &mut dyn FnMut(u8, u64) -> bool,
) -> Option<Result<RawSnapshot, ImportError>> {
    if cfg!(target_arch = "wasm32") || len < parallel::PARALLEL_MIN_BYTES as u64 {
        return None;
    }
    let plan = parallel::Plan::for_input(usize::try_from(len).ok()?);
    if plan.threads < 2 {
        return None;
    }
    chunked::decode(read_at, len, plan, progress).map(|r| r.map(|(snap, _)| snap))
}

/// Decodes a snapshot pickle (uncompressed) on this thread.
pub(crate) fn decode_serial(data: &[u8]) -> Result<RawSnapshot, ImportError> {
    let mut vm = Vm::new(data, true);
    let (root, stop_at) = vm.run().map_err(|e| *e)?;
    vm.snapshot(root, stop_at).map_err(|e| *e)
}
