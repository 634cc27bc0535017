//! The engine's messages between the page and its Web Workers without a whole copy of the
//! encoded message in either side's wasm memory (memory that WebAssembly never gives
//! back): the sender encodes into chunks of [`CHUNK`] bytes that go straight to JS memory
//! ([`encode_js`]); the receiver decodes from the JS array it was given, a window of
//! [`CHUNK`] bytes at a time ([`decode_js`]). The bytes are [`crate::engine::wire`]'s
//! (postcard), so either side may also use [`wire::encode`] and [`wire::decode`]. A trace's
//! `Loaded` answer is 85 MB encoded on the 1 M-event synthetic: the wasm memory of the page
//! held it whole beside its decoded form, and the worker's beside the trace.
//!
//! The chunking is written over [`Sink`] and [`Source`] so that the native tests run it.
//!
//! [`wire::encode`]: crate::engine::wire::encode
//! [`wire::decode`]: crate::engine::wire::decode

use postcard::{de_flavors, ser_flavors};

/// The bytes a side holds of a message in its wasm memory at a time (beside a string or
/// byte field longer than this, held whole while it is decoded).
pub const CHUNK: usize = 1 << 20;

/// Where the encoded chunks go, in order.
pub trait Sink {
    type Output;
    fn chunk(&mut self, bytes: &[u8]);
    fn finish(self) -> Self::Output;
}

/// An encoded message the decoder reads from, a range at a time.
pub trait Source {
    /// Its bytes.
    fn size(&self) -> usize;
    /// Copies bytes `from..from + into.len()` into `into` (within [`Source::size`]).
    fn copy(&self, from: usize, into: &mut [u8]);
}

/// Encodes `msg` as [`crate::engine::wire::encode`] does, into `sink` in chunks of `chunk`
/// bytes.
pub fn encode_into<T: serde::Serialize, S: Sink>(
    msg: &T,
    sink: S,
    chunk: usize,
) -> Result<S::Output, String> {
    let chunks = Chunks {
        buf: Vec::new(),
        chunk: chunk.max(1),
        sink,
    };
    postcard::serialize_with_flavor(msg, chunks)
        .map_err(|e| format!("cannot encode a message: {e}"))
}

/// The length of `msg` encoded ([`crate::engine::wire::encode`]'s bytes), counted without
/// keeping them.
pub fn encoded_len<T: serde::Serialize>(msg: &T) -> Result<u64, String> {
    encode_into(msg, Count::default(), CHUNK)
}

/// A [`Request::SearchTrace`] of `trace` (device `device` shown) as [`wire::encode`]
/// writes it, into the sink `make` returns for its length: the message's head, then the
/// trace's bytes as [`binary::encode_into`] hands them on, never all held (the browser's
/// engine worker writes them straight into the JS array it posts; the 1.12 GB snapshot's
/// 406 MiB of them sat in its wasm memory, never given back, beside the trace).
///
/// [`Request::SearchTrace`]: crate::engine::wire::Request::SearchTrace
/// [`wire::encode`]: crate::engine::wire::encode
/// [`binary::encode_into`]: allocsim_core::trace::binary::encode_into
pub fn search_trace_into<S: Sink>(
    job: u64,
    device: u32,
    trace: &allocsim_core::trace::Trace,
    make: impl FnOnce(u64) -> Result<S, String>,
) -> Result<S::Output, String> {
    use allocsim_core::trace::binary;
    let body = binary::encoded_len(trace);
    let mut head = crate::engine::wire::encode(&crate::engine::wire::Request::SearchTrace {
        job,
        device,
        trace: Vec::new(),
    })?;
    // Postcard ends the head with the bytes' length, a varint (0 here: one byte), and
    // the bytes follow it.
    if head.pop() != Some(0) {
        return Err("a search trace's head does not end with its length".into());
    }
    let mut n = body as u64;
    while n >= 0x80 {
        head.push((n as u8) | 0x80);
        n >>= 7;
    }
    head.push(n as u8);
    let mut sink = make(head.len() as u64 + body as u64)?;
    sink.chunk(&head);
    binary::encode_into(trace, &mut |piece| sink.chunk(piece));
    Ok(sink.finish())
}

/// A [`Sink`] that only counts the bytes.
#[derive(Default)]
struct Count(u64);

impl Sink for Count {
    type Output = u64;

    fn chunk(&mut self, bytes: &[u8]) {
        self.0 += bytes.len() as u64;
    }

    fn finish(self) -> u64 {
        self.0
    }
}

/// Decodes a message [`crate::engine::wire::encode`] (or [`encode_into`]) made from
/// `source`, reading it `chunk` bytes at a time.
pub fn decode_from<T: serde::de::DeserializeOwned, S: Source>(
    source: S,
    chunk: usize,
) -> Result<T, String> {
    let window = Window {
        source,
        chunk: chunk.max(1),
        from: 0,
        at: 0,
        bytes: Vec::new(),
    };
    let mut de = postcard::Deserializer::from_flavor(window);
    T::deserialize(&mut de).map_err(|e| format!("cannot decode a message: {e}"))
}

struct Chunks<S> {
    buf: Vec<u8>,
    chunk: usize,
    sink: S,
}

impl<S: Sink> Chunks<S> {
    fn spill(&mut self) {
        if !self.buf.is_empty() {
            self.sink.chunk(&self.buf);
            self.buf.clear();
        }
    }
}

impl<S: Sink> ser_flavors::Flavor for Chunks<S> {
    type Output = S::Output;

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        if self.buf.len() >= self.chunk {
            self.spill();
        }
        self.buf.push(data);
        Ok(())
    }

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        if self.buf.len() + data.len() > self.chunk {
            self.spill();
        }
        if data.len() >= self.chunk {
            self.sink.chunk(data);
        } else {
            self.buf.extend_from_slice(data);
        }
        Ok(())
    }

    fn finalize(mut self) -> postcard::Result<S::Output> {
        self.spill();
        Ok(self.sink.finish())
    }
}

/// The decoder's view of a [`Source`]: `bytes` are the source's from `from`, `at` the next
/// one to read among them.
struct Window<S> {
    source: S,
    chunk: usize,
    from: usize,
    at: usize,
    bytes: Vec<u8>,
}

impl<S: Source> Window<S> {
    /// Moves the window to the next unread byte, holding at least `need` bytes.
    fn refill(&mut self, need: usize) -> postcard::Result<()> {
        let start = self.from + self.at;
        let end = (start + self.chunk.max(need)).min(self.source.size());
        if end < start + need {
            return Err(postcard::Error::DeserializeUnexpectedEnd);
        }
        self.bytes.resize(end - start, 0);
        self.source.copy(start, &mut self.bytes);
        self.from = start;
        self.at = 0;
        Ok(())
    }
}

impl<'de, S: Source + 'de> de_flavors::Flavor<'de> for Window<S> {
    type Remainder = ();
    type Source = ();

    fn pop(&mut self) -> postcard::Result<u8> {
        if self.at >= self.bytes.len() {
            self.refill(1)?;
        }
        let b = self
            .bytes
            .get(self.at)
            .copied()
            .ok_or(postcard::Error::DeserializeUnexpectedEnd)?;
        self.at += 1;
        Ok(b)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.source.size().saturating_sub(self.from + self.at))
    }

    /// Messages are decoded into owned values: nothing borrows from the source.
    fn try_take_n(&mut self, _ct: usize) -> postcard::Result<&'de [u8]> {
        Err(postcard::Error::DeserializeUnexpectedEnd)
    }

    fn try_take_n_temp<'a>(&'a mut self, ct: usize) -> postcard::Result<&'a [u8]>
    where
        'de: 'a,
    {
        if self.bytes.len() - self.at < ct {
            self.refill(ct)?;
        }
        let taken = self
            .bytes
            .get(self.at..self.at + ct)
            .ok_or(postcard::Error::DeserializeUnexpectedEnd)?;
        self.at += ct;
        Ok(taken)
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// A message in several pieces, in order (the chunks it was sent in), read as one.
#[derive(Debug)]
pub struct Joined<P> {
    pieces: Vec<P>,
    /// Where each piece starts in the message, and the message's size last.
    starts: Vec<usize>,
}

impl<P: Source> Joined<P> {
    #[must_use]
    pub fn new(pieces: Vec<P>) -> Joined<P> {
        let mut starts = vec![0];
        for p in &pieces {
            starts.push(starts.last().copied().unwrap_or(0) + p.size());
        }
        Joined { pieces, starts }
    }
}

impl<P: Source> Source for Joined<P> {
    fn size(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    fn copy(&self, from: usize, into: &mut [u8]) {
        // The last piece starting at or before `from`, then on across pieces.
        let mut i = self
            .starts
            .partition_point(|&s| s <= from)
            .saturating_sub(1);
        let (mut at, mut done) = (from, 0);
        while done < into.len() {
            let (Some(p), Some(&start)) = (self.pieces.get(i), self.starts.get(i)) else {
                return;
            };
            let n = (p.size() - (at - start)).min(into.len() - done);
            if let Some(dst) = into.get_mut(done..done + n) {
                p.copy(at - start, dst);
            }
            done += n;
            at += n;
            i += 1;
        }
    }
}

impl Source for [u8] {
    fn size(&self) -> usize {
        self.len()
    }

    fn copy(&self, from: usize, into: &mut [u8]) {
        if let Some(src) = self.get(from..from + into.len()) {
            into.copy_from_slice(src);
        }
    }
}

impl Source for Vec<u8> {
    fn size(&self) -> usize {
        self.len()
    }

    fn copy(&self, from: usize, into: &mut [u8]) {
        self.as_slice().copy(from, into);
    }
}

impl<S: Source + ?Sized> Source for &S {
    fn size(&self) -> usize {
        (**self).size()
    }

    fn copy(&self, from: usize, into: &mut [u8]) {
        (**self).copy(from, into);
    }
}

/// Encoded chunks in JS memory.
#[cfg(target_arch = "wasm32")]
#[derive(Default)]
struct JsChunks {
    chunks: Vec<js_sys::Uint8Array>,
    len: u64,
}

#[cfg(target_arch = "wasm32")]
impl Sink for JsChunks {
    type Output = Self;

    fn chunk(&mut self, bytes: &[u8]) {
        self.chunks.push(js_sys::Uint8Array::from(bytes));
        self.len += bytes.len() as u64;
    }

    fn finish(self) -> Self {
        self
    }
}

#[cfg(target_arch = "wasm32")]
impl Source for js_sys::Uint8Array {
    fn size(&self) -> usize {
        self.length() as usize
    }

    fn copy(&self, from: usize, into: &mut [u8]) {
        self.subarray(from as u32, (from + into.len()) as u32)
            .copy_to(into);
    }
}

/// The encoded bytes written into one JS array of their exact length, in order.
#[cfg(target_arch = "wasm32")]
struct JsArray {
    out: js_sys::Uint8Array,
    at: u32,
}

#[cfg(target_arch = "wasm32")]
impl Sink for JsArray {
    type Output = js_sys::Uint8Array;

    fn chunk(&mut self, bytes: &[u8]) {
        // Within the counted length (`encode_js`); `u32` as the array is.
        let end = self.at + bytes.len() as u32;
        self.out.subarray(self.at, end).copy_from(bytes);
        self.at = end;
    }

    fn finish(self) -> js_sys::Uint8Array {
        self.out
    }
}

/// Encodes `msg` into one JS array, [`CHUNK`] bytes at a time (a request to a worker):
/// its length counted first ([`encoded_len`]), so that JS memory holds the message once,
/// not its chunks beside the array they are joined into (on the 1.12 GB snapshot the
/// shared trace, 406 MiB, was held twice).
#[cfg(target_arch = "wasm32")]
pub fn encode_js<T: serde::Serialize>(msg: &T) -> Result<js_sys::Uint8Array, String> {
    let len = u32::try_from(encoded_len(msg)?).map_err(|_| "a message over 4 GiB".to_string())?;
    let sink = JsArray {
        out: js_sys::Uint8Array::new_with_length(len),
        at: 0,
    };
    encode_into(msg, sink, CHUNK)
}

/// [`search_trace_into`] one JS array of the message's length.
#[cfg(target_arch = "wasm32")]
pub fn search_trace_js(
    job: u64,
    device: u32,
    trace: &allocsim_core::trace::Trace,
) -> Result<js_sys::Uint8Array, String> {
    search_trace_into(job, device, trace, |len| {
        let len = u32::try_from(len).map_err(|_| "a message over 4 GiB".to_string())?;
        Ok(JsArray {
            out: js_sys::Uint8Array::new_with_length(len),
            at: 0,
        })
    })
}

/// Encodes `msg` as a JS array of its chunks, and the list of their buffers to transfer
/// with it (an answer to the page: the chunks are never joined).
#[cfg(target_arch = "wasm32")]
pub fn encode_chunks<T: serde::Serialize>(
    msg: &T,
) -> Result<(js_sys::Array, js_sys::Array), String> {
    let c = encode_into(msg, JsChunks::default(), CHUNK)?;
    let (chunks, buffers) = (js_sys::Array::new(), js_sys::Array::new());
    for chunk in c.chunks {
        buffers.push(&chunk.buffer());
        chunks.push(&chunk);
    }
    Ok((chunks, buffers))
}

/// Decodes a message from what a worker posted: one array (or buffer) of its bytes, or an
/// array of its chunks ([`encode_chunks`]); `None` when `data` is neither.
#[cfg(target_arch = "wasm32")]
#[must_use]
pub fn decode_js<T: serde::de::DeserializeOwned>(
    data: &wasm_bindgen::JsValue,
) -> Option<Result<T, String>> {
    use wasm_bindgen::JsCast;
    let pieces: Vec<js_sys::Uint8Array> = if let Some(a) = data.dyn_ref::<js_sys::Uint8Array>() {
        vec![a.clone()]
    } else if let Some(b) = data.dyn_ref::<js_sys::ArrayBuffer>() {
        vec![js_sys::Uint8Array::new(b)]
    } else if let Some(list) = data.dyn_ref::<js_sys::Array>() {
        list.iter()
            .map(JsCast::dyn_into::<js_sys::Uint8Array>)
            .collect::<Result<_, _>>()
            .ok()?
    } else {
        return None;
    };
    Some(decode_from(Joined::new(pieces), CHUNK))
}
