//! The recorded device: the recording's own segment events handed back to the model that
//! replays it.

use std::borrow::Cow;

use crate::device::{Device, DeviceOom, SimulatedDevice};
use crate::snapshot::{Action, RawEvent};

/// The recorded device: hands out the addresses of the recording's own segment events for
/// the malloc being replayed. With `oracle`, it refuses a segment request exactly where the
/// recording shows that malloc went down the out-of-memory path (a release is recorded
/// before the next segment, or nothing is recorded at all).
///
/// `synth` is borrowed and copied only when the model first asks it for memory: most
/// groups (every free, most mallocs) never do, and the build makes one device per group.
#[derive(Debug, Clone)]
pub struct RecordedDevice<'a> {
    group: &'a [RawEvent],
    cursor: usize,
    oracle: bool,
    synth: Cow<'a, SimulatedDevice>,
}

impl<'a> RecordedDevice<'a> {
    /// A device that hands out `group` (a malloc group's segment events) in order, then
    /// what a copy of `synth` hands out (or, with `oracle`, refuses).
    #[must_use]
    pub fn new(group: &'a [RawEvent], oracle: bool, synth: &'a SimulatedDevice) -> Self {
        RecordedDevice {
            group,
            cursor: 0,
            oracle,
            synth: Cow::Borrowed(synth),
        }
    }

    fn peek(&self) -> Option<&RawEvent> {
        self.group.get(self.cursor)
    }
}

impl Device for RecordedDevice<'_> {
    fn malloc(&mut self, size: u64, stream: u64) -> Result<u64, DeviceOom> {
        match self.peek().copied() {
            Some(e) if e.action == Action::SegmentAlloc => {
                self.cursor += 1;
                if e.size == size {
                    Ok(e.addr)
                } else {
                    self.synth.to_mut().malloc(size, stream)
                }
            }
            _ if self.oracle => Err(DeviceOom),
            _ => self.synth.to_mut().malloc(size, stream),
        }
    }

    fn free(&mut self, addr: u64, _size: u64) {
        if self
            .peek()
            .is_some_and(|e| e.action == Action::SegmentFree && e.addr == addr)
        {
            self.cursor += 1;
        }
    }

    fn reserve(&mut self, size: u64, page: u64, stream: u64) -> Result<u64, DeviceOom> {
        match self.peek() {
            Some(e) if e.action == Action::SegmentMap => Ok(e.addr),
            _ if self.oracle => Err(DeviceOom),
            _ => self.synth.to_mut().reserve(size, page, stream),
        }
    }

    fn release(&mut self, _addr: u64, _size: u64) {}

    fn map(&mut self, _addr: u64, _size: u64, _stream: u64) -> Result<(), DeviceOom> {
        match self.peek().copied() {
            Some(e) if e.action == Action::SegmentMap => {
                self.cursor += 1;
                Ok(())
            }
            _ if self.oracle => Err(DeviceOom),
            _ => Ok(()),
        }
    }

    fn unmap(&mut self, addr: u64, _size: u64) {
        if self
            .peek()
            .is_some_and(|e| e.action == Action::SegmentUnmap && e.addr == addr)
        {
            self.cursor += 1;
        }
    }

    fn free_bytes(&self) -> u64 {
        self.group
            .iter()
            .rev()
            .find(|e| e.action == Action::Oom)
            .map_or(0, |e| e.addr)
    }
}
