//! Pinned host memory (`host_segments`, `host_traces`): only displayed, so what does not
//! read is skipped and counted, never refused.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::snapshot::json::{EventSeed, Json, JsonList, ListSeed, drain_map, drain_seq, int};
use crate::snapshot::schema::{Builder, HostSegmentFields, Key, Loc, Scalar};
use crate::snapshot::{HostSegment, RawEvent};

pub(super) struct HostSegmentsSeed;

seed!(HostSegmentsSeed, (Vec<HostSegment>, u64));

impl HostSegmentsSeed {
    fn found<E: de::Error>(self, s: Scalar<'_>) -> Result<(Vec<HostSegment>, u64), E> {
        Ok((Vec::new(), u64::from(s != Scalar::None)))
    }
}

impl<'de> Visitor<'de> for HostSegmentsSeed {
    type Value = (Vec<HostSegment>, u64);
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of host segments")
    }
    found_scalars!();
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        drain_map(map)?;
        self.found(Scalar::Other("a dict"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let (mut out, mut skipped) = (Vec::new(), 0);
        while let Some(item) = seq.next_element_seed(ListSeed)? {
            let seg = match item {
                JsonList::Dict(pairs) => {
                    let mut fields = HostSegmentFields::default();
                    for (k, v) in pairs {
                        if let Scalar::Str(name) = k.get() {
                            fields.set(Key::from_bytes(name), v);
                        }
                    }
                    fields.map(Json::get).host_segment()
                }
                JsonList::List(_) | JsonList::One(_) => None,
            };
            match seg {
                Some(h) => out.push(h),
                None => skipped += 1,
            }
        }
        Ok((out, skipped))
    }
}

/// `host_traces`: one list of entries or one list per device, concatenated (the lists'
/// entries after the top list's own); deeper lists are skipped.
pub(super) struct HostTracesSeed<'b> {
    pub(super) b: &'b mut Builder,
}

seed!(HostTracesSeed<'_>, (Vec<RawEvent>, u64));

impl HostTracesSeed<'_> {
    fn found<E: de::Error>(self, _: Scalar<'_>) -> Result<(Vec<RawEvent>, u64), E> {
        Ok((Vec::new(), 1))
    }
}

impl<'de> Visitor<'de> for HostTracesSeed<'_> {
    type Value = (Vec<RawEvent>, u64);
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of host trace entries")
    }
    found_scalars!();
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        drain_map(map)?;
        self.found(Scalar::Other("a dict"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let (mut out, mut nested, mut skipped) = (Vec::new(), Vec::new(), 0);
        while let Some(item) = seq.next_element_seed(HostItemSeed {
            b: &mut *self.b,
            depth: 0,
        })? {
            match item {
                HostItem::Event(e) => out.push(e),
                HostItem::Skipped => skipped += 1,
                HostItem::List(events, s) => {
                    nested.extend(events);
                    skipped += s;
                }
            }
        }
        out.append(&mut nested);
        Ok((out, skipped))
    }
}

enum HostItem {
    Event(RawEvent),
    Skipped,
    /// A nested list: its entries and how many of its items were skipped.
    List(Vec<RawEvent>, u64),
}

struct HostItemSeed<'b> {
    b: &'b mut Builder,
    depth: u8,
}

seed!(HostItemSeed<'_>, HostItem);

impl HostItemSeed<'_> {
    fn found<E: de::Error>(self, _: Scalar<'_>) -> Result<HostItem, E> {
        Ok(HostItem::Skipped)
    }
}

impl<'de> Visitor<'de> for HostItemSeed<'_> {
    type Value = HostItem;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a host trace entry")
    }
    found_scalars!();
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<HostItem, A::Error> {
        let seed = EventSeed {
            b: self.b,
            loc: Loc::HostTraces,
            lenient: true,
        };
        Ok(seed
            .visit_map(map)?
            .map_or(HostItem::Skipped, HostItem::Event))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<HostItem, A::Error> {
        if self.depth > 0 {
            drain_seq(seq)?;
            return Ok(HostItem::Skipped);
        }
        let (mut out, mut skipped) = (Vec::new(), 0);
        while let Some(item) = seq.next_element_seed(HostItemSeed {
            b: &mut *self.b,
            depth: self.depth + 1,
        })? {
            match item {
                HostItem::Event(e) => out.push(e),
                HostItem::Skipped | HostItem::List(..) => skipped += 1,
            }
        }
        Ok(HostItem::List(out, skipped))
    }
}
