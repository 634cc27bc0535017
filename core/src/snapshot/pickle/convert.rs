//! Conversions as objects are consumed: frame dicts into frames, trace-entry dicts into
//! events, lists under `frames` into stacks.

use super::fields::{Fields, pair, scalar};
use super::machine::{Item, Res, Vm, malformed};
use super::value::{Kind, Seal, Text, Value};
use crate::snapshot::StackId;
use crate::snapshot::schema::{Key, entry_pool_id, word};

impl Vm<'_> {
    /// A list consumes `v`: frame dicts become frames, trace-entry dicts events.
    pub(super) fn convert_item(&mut self, v: Value) -> Item {
        let Value::Obj(id) = v else {
            return Item::Value(v);
        };
        let Some(c) = self.heap.get(id as usize) else {
            return Item::Value(v);
        };
        match c.seal {
            Seal::Frame(f) => return Item::Value(Value::Frame(f)),
            Seal::Stack(_) => return Item::Value(v),
            Seal::Open => {}
        }
        if c.kind != Kind::Dict {
            return Item::Value(v);
        }
        let text = Text {
            data: self.data,
            scratch: &self.scratch,
        };
        let mut fields = Fields::default();
        fields.read(&text, &c.items);
        let heap = &self.heap[..];
        let event = fields.event.map(|&v| scalar(&text, heap, v));
        if event.is_event() {
            // A shared entry could be read again elsewhere: the schema pass converts it.
            if c.shared {
                return Item::Value(v);
            }
            let stack = match fields.frames {
                None => Some(StackId::EMPTY),
                Some(Value::Stack(s)) => Some(s),
                Some(Value::Obj(j)) => match heap.get(j as usize).map(|c| c.seal) {
                    Some(Seal::Stack(s)) => Some(s),
                    _ => None,
                },
                Some(_) => None,
            };
            let pool = entry_pool_id(pair(&text, heap, fields.pool_id));
            if let Some(ev) = stack.and_then(|s| self.builder.event(&event, s, pool).ok()) {
                // The entry's own `pool_id` tuple goes with it.
                if let Some(Value::Obj(t)) = fields.pool_id
                    && self
                        .heap
                        .get(t as usize)
                        .is_some_and(|c| !c.shared && c.seal == Seal::Open && c.kind == Kind::Tuple)
                {
                    self.release(t);
                }
                self.release(id);
                return Item::Event(ev);
            }
        } else {
            let frame = fields.frame.map(|&v| scalar(&text, heap, v));
            if frame.is_frame()
                && let Ok(f) = self.builder.frame(&frame)
            {
                self.seal(id, Seal::Frame(f));
                return Item::Value(Value::Frame(f));
            }
        }
        Item::Value(v)
    }

    /// A dict consumes a list under `frames`: a list of frames becomes a stack.
    pub(super) fn convert_stack(&mut self, id: u32) -> Option<StackId> {
        let c = self.heap.get(id as usize)?;
        match c.seal {
            Seal::Stack(s) => return Some(s),
            Seal::Frame(_) => return None,
            Seal::Open => {}
        }
        if c.kind != Kind::List || c.events != 0 {
            return None;
        }
        self.frame_buf.clear();
        for item in &c.items {
            let f = match *item {
                Value::Frame(f) => f,
                Value::Obj(j) => match self.heap.get(j as usize)?.seal {
                    Seal::Frame(f) => f,
                    _ => return None,
                },
                _ => return None,
            };
            self.frame_buf.push(f);
        }
        let hash = self.frame_buf.iter().fold(0u64, |h, f| {
            (h.rotate_left(5) ^ u64::from(f.0)).wrapping_mul(0x517c_c1b7_2722_0a95)
        });
        let s = match self.stack_cache.get(&hash) {
            Some(&s) if self.builder.frames.stack(s) == self.frame_buf.as_slice() => s,
            _ => {
                let s = self.builder.frames.intern_stack(&self.frame_buf);
                self.stack_cache.insert(hash, s);
                s
            }
        };
        self.seal(id, Seal::Stack(s));
        Some(s)
    }

    pub(super) fn is_frames_key(&self, k: Value) -> bool {
        const FRAMES: u64 = word(Key::Frames.name());
        matches!(k, Value::Str { len: 6, off } if self.text().word(6, off) == Some(FRAMES))
    }

    /// The number (from 1) of `list`'s own vector of events, made for it on its first.
    #[inline]
    pub(super) fn events_of(&mut self, list: u32) -> u32 {
        let events = self.heap.get(list as usize).map_or(0, |c| c.events);
        if events != 0 {
            return events;
        }
        let new = self.new_event_list();
        self.event_lists.push(new);
        let events = self.event_lists.len() as u32;
        if let Some(c) = self.heap.get_mut(list as usize) {
            c.events = events;
        }
        events
    }

    pub(super) fn append(&mut self, list: u32, v: Value) {
        let item = if self.eager {
            self.convert_item(v)
        } else {
            Item::Value(v)
        };
        let Some(c) = self.heap.get_mut(list as usize) else {
            return;
        };
        match item {
            Item::Event(ev) if c.items.is_empty() => {
                let events = self.events_of(list);
                if events == 1
                    && let Some(r) = self.region.as_mut()
                {
                    r.put(ev);
                } else if let Some(list) = self.event_lists.get_mut(events as usize - 1) {
                    list.push(ev);
                }
            }
            Item::Event(ev) => {
                c.items.push(Value::Event(self.extra_events.len() as u32));
                self.extra_events.push(ev);
            }
            Item::Value(v) => {
                if c.events != 0 {
                    // The list mixes entries with other items: keep order via extra_events.
                    if let Some(evs) = self.event_lists.get_mut(c.events as usize - 1) {
                        for ev in evs.drain(..) {
                            c.items.push(Value::Event(self.extra_events.len() as u32));
                            self.extra_events.push(ev);
                        }
                        // Its room (reserved by a hint) is not needed any more.
                        *evs = Vec::new();
                    }
                    c.events = 0;
                }
                c.items.push(v);
            }
        }
    }

    /// `dict.update(pairs)`; converts lists under `frames` in place first.
    pub(super) fn set_items(
        &mut self,
        dict: u32,
        pairs: &mut [Value],
        at: usize,
        what: &'static str,
    ) -> Res<()> {
        if !pairs.len().is_multiple_of(2) {
            return Err(malformed(at, format!("{what} with an odd number of items")));
        }
        if self.eager {
            for pair in pairs.chunks_exact_mut(2) {
                if let [k, v] = pair
                    && let Value::Obj(id) = *v
                    && self.is_frames_key(*k)
                    && let Some(s) = self.convert_stack(id)
                {
                    *v = Value::Stack(s);
                } else if let [k, v] = pair
                    && let Value::Frame(f) = *v
                    && self.outer.is_some()
                    && self.is_frames_key(*k)
                    && let Some(s) = self.stand_in_stack(f)
                {
                    *v = Value::Stack(s);
                }
            }
        }
        if let Some(c) = self.heap.get_mut(dict as usize) {
            c.items.extend_from_slice(pairs);
        }
        Ok(())
    }
}
