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
/// The build keeps the copy of the group it goes on from ([`RecordedDevice::into_synth`]):
/// a synthetic segment stays taken until the model frees it, so the next group's do not
/// overlap it.
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

    /// The synthetic device as this one left it, where it handed out or took back a
    /// synthetic segment (None: unchanged): what the next group's device must start from.
    #[must_use]
    pub fn into_synth(self) -> Option<SimulatedDevice> {
        match self.synth {
            Cow::Owned(s) => Some(s),
            Cow::Borrowed(_) => None,
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

    fn free(&mut self, addr: u64, size: u64) {
        if self
            .peek()
            .is_some_and(|e| e.action == Action::SegmentFree && e.addr == addr)
        {
            self.cursor += 1;
        } else if self.synth.holds_synthetic(addr) {
            // A segment the recording never had: back to the synthetic heap.
            self.synth.to_mut().free(addr, size);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The synthetic heap a group's device leaves is the next group's: a segment stays
    /// taken until the model frees it, then its range is handed out again.
    #[test]
    fn synthetic_segments_stay_taken_from_one_group_to_the_next() {
        let heap = SimulatedDevice::new(80 << 30, None);
        let mut first = RecordedDevice::new(&[], false, &heap);
        let a = first.malloc(20 << 20, 0).expect("a segment");
        let heap = first.into_synth().expect("the heap changed");
        assert!(heap.holds_synthetic(a));
        let mut second = RecordedDevice::new(&[], false, &heap);
        let b = second.malloc(20 << 20, 0).expect("another");
        assert!(
            b >= a + (20 << 20) || b + (20 << 20) <= a,
            "{a:#x} and {b:#x} overlap"
        );
        // A group that only frees: the range goes back.
        let heap = second.into_synth().expect("changed");
        let mut third = RecordedDevice::new(&[], false, &heap);
        third.free(a, 20 << 20);
        let heap = third.into_synth().expect("changed");
        assert!(!heap.holds_synthetic(a) && heap.holds_synthetic(b));
        // A device that neither hands out nor takes back leaves the heap as it was.
        let mut idle = RecordedDevice::new(&[], false, &heap);
        idle.free(0x7f00_0000_0000, 2 << 20);
        assert!(idle.into_synth().is_none());
    }
}
