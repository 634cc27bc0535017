//! The hostile-input generator (issue 19): small files built to break the decoder's
//! memory, the models' arithmetic or the recording's consistency, each with what the
//! command line must answer. `hostile.rs` writes them and runs every command on them under
//! a memory and a time limit.

/// What a command must answer for a case.
#[derive(Clone, Copy, Debug)]
pub enum Expect {
    /// Exit 2, one line on stderr naming the file and containing this text.
    Refused(&'static str),
    /// Exit 0 with a consistent answer (peak ≥ final, peak reserved ≥ peak allocated);
    /// `oom` says whether the replay must report an out-of-memory.
    Valid { oom: bool },
}

pub struct Case {
    pub name: String,
    pub bytes: Vec<u8>,
    pub expect: Expect,
}

/// A protocol-2 pickle writer with just the opcodes snapshots use.
#[derive(Default)]
pub struct P {
    pub b: Vec<u8>,
    next_memo: u32,
}

impl P {
    pub fn new() -> P {
        P {
            b: vec![0x80, 2],
            next_memo: 0,
        }
    }
    pub fn dict(&mut self) -> &mut Self {
        self.b.push(b'}');
        self
    }
    pub fn list(&mut self) -> &mut Self {
        self.b.push(b']');
        self
    }
    pub fn mark(&mut self) -> &mut Self {
        self.b.push(b'(');
        self
    }
    pub fn setitems(&mut self) -> &mut Self {
        self.b.push(b'u');
        self
    }
    pub fn appends(&mut self) -> &mut Self {
        self.b.push(b'e');
        self
    }
    pub fn dup(&mut self) -> &mut Self {
        self.b.push(b'2');
        self
    }
    pub fn stop(&mut self) -> Vec<u8> {
        self.b.push(b'.');
        std::mem::take(&mut self.b)
    }
    pub fn s(&mut self, s: &str) -> &mut Self {
        self.b.push(b'X');
        self.b.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.b.extend_from_slice(s.as_bytes());
        self
    }
    /// Any integer (`LONG1`, minimal two's complement).
    pub fn int(&mut self, v: i128) -> &mut Self {
        let mut bytes = v.to_le_bytes().to_vec();
        while bytes.len() > 1 {
            let last = bytes[bytes.len() - 1];
            let prev_sign = bytes[bytes.len() - 2] & 0x80;
            if (last == 0 && prev_sign == 0) || (last == 0xff && prev_sign != 0) {
                bytes.pop();
            } else {
                break;
            }
        }
        self.b.push(0x8a);
        self.b.push(bytes.len() as u8);
        self.b.extend_from_slice(&bytes);
        self
    }
    /// Memoises the top of the stack; its index.
    pub fn put(&mut self) -> u32 {
        let i = self.next_memo;
        self.next_memo += 1;
        self.b.push(b'r');
        self.b.extend_from_slice(&i.to_le_bytes());
        i
    }
    pub fn get(&mut self, i: u32) -> &mut Self {
        self.b.push(b'j');
        self.b.extend_from_slice(&i.to_le_bytes());
        self
    }
    /// `key: <value written by f>` inside an open `MARK … SETITEMS`.
    pub fn kv(&mut self, k: &str, f: impl FnOnce(&mut P)) -> &mut Self {
        self.s(k);
        f(self);
        self
    }
}

pub const BASE: i128 = 0x7f00_0000_0000;
pub const TWO_MIB: i128 = 2 << 20;

/// An event dict.
pub fn event(p: &mut P, action: &str, addr: i128, size: i128) {
    p.dict().mark();
    p.kv("action", |p| {
        p.s(action);
    });
    p.kv(
        if action == "oom" {
            "device_free"
        } else {
            "addr"
        },
        |p| {
            p.int(addr);
        },
    );
    p.kv("size", |p| {
        p.int(size);
    });
    p.kv("stream", |p| {
        p.int(0);
    });
    p.kv("frames", |p| {
        p.list();
    });
    p.setitems();
}

/// A segment dict with one block covering it (`state` of that block).
pub fn segment(p: &mut P, device: i128, addr: i128, size: i128, state: &str) {
    p.dict().mark();
    p.kv("device", |p| {
        p.int(device);
    });
    p.kv("address", |p| {
        p.int(addr);
    });
    p.kv("total_size", |p| {
        p.int(size);
    });
    p.kv("allocated_size", |p| {
        p.int(if state == "inactive" { 0 } else { size });
    });
    p.kv("active_size", |p| {
        p.int(if state == "inactive" { 0 } else { size });
    });
    p.kv("requested_size", |p| {
        p.int(if state == "inactive" { 0 } else { size });
    });
    p.kv("stream", |p| {
        p.int(0);
    });
    p.kv("segment_type", |p| {
        p.s(if size <= TWO_MIB { "small" } else { "large" });
    });
    p.kv("blocks", |p| {
        p.list().mark();
        p.dict().mark();
        p.kv("address", |p| {
            p.int(addr);
        });
        p.kv("size", |p| {
            p.int(size);
        });
        p.kv("requested_size", |p| {
            p.int(if state == "inactive" { 0 } else { size });
        });
        p.kv("state", |p| {
            p.s(state);
        });
        p.setitems();
        p.appends();
    });
    p.setitems();
}

/// A snapshot: `segs` writes the segment list's items, `traces` the device trace lists'
/// items (one per device; `None` leaves `device_traces` out).
pub fn snapshot(segs: impl FnOnce(&mut P), traces: Option<&dyn Fn(&mut P)>) -> Vec<u8> {
    let mut p = P::new();
    p.dict().mark();
    p.s("segments").list().mark();
    segs(&mut p);
    p.appends();
    if let Some(t) = traces {
        p.s("device_traces").list().mark();
        t(&mut p);
        p.appends();
    }
    p.setitems();
    p.stop()
}

/// One device whose trace is `f`'s events.
pub fn one_device(p: &mut P, f: impl Fn(&mut P)) {
    p.list().mark();
    f(p);
    p.appends();
}

fn case(name: &str, bytes: Vec<u8>, expect: Expect) -> Case {
    Case {
        name: name.to_string(),
        bytes,
        expect,
    }
}

/// A trace of `n` alloc/free pairs of 512 bytes in a 2 MiB segment (valid).
fn small_trace(p: &mut P, n: usize) {
    event(p, "segment_alloc", BASE, TWO_MIB);
    for _ in 0..n {
        event(p, "alloc", BASE, 512);
        event(p, "free_requested", BASE, 512);
        event(p, "free_completed", BASE, 512);
    }
}

/// Every hostile case.
pub fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let u64max = i128::from(u64::MAX);

    // 1. Memory amplification through shared references.
    // One memoised list of 4,000 entries referenced by 200,000 devices (0.5 MB → 800 M entries).
    for devices in [128usize, 200_000] {
        let bytes = snapshot(
            |_| {},
            Some(&|p: &mut P| {
                p.list().mark();
                small_trace(p, 1333);
                p.appends();
                let l = p.put();
                for _ in 1..devices {
                    p.get(l);
                }
            }),
        );
        out.push(case(
            &format!("shared_trace_x{devices}"),
            bytes,
            Expect::Refused("shared references"),
        ));
    }
    // Devices by DUP: 4 M devices of one empty list in 4 MB.
    {
        let mut p = P::new();
        p.dict().mark();
        p.s("segments").list();
        p.s("device_traces").list().mark();
        p.list();
        for _ in 0..4_000_000 {
            p.dup();
        }
        p.appends().setitems();
        out.push(case("dup_devices_4m", p.stop(), Expect::Refused("")));
    }
    // One memoised event dict referenced a million times in one device's trace.
    out.push(case(
        "shared_event_x1m",
        snapshot(
            |_| {},
            Some(&|p: &mut P| {
                p.list().mark();
                event(p, "alloc", BASE, 512);
                let e = p.put();
                for _ in 0..1_000_000 {
                    p.get(e);
                }
                p.appends();
            }),
        ),
        Expect::Refused(""),
    ));
    // One segment dict whose block list holds one block 2,000 times, the segment 2,000
    // times in the segment list: 4 M blocks from 20 kB.
    {
        let mut p = P::new();
        p.dict().mark();
        p.s("segments").list().mark();
        p.dict().mark();
        for (k, v) in [
            ("device", 0),
            ("address", BASE),
            ("total_size", TWO_MIB),
            ("allocated_size", 0),
            ("active_size", 0),
            ("requested_size", 0),
            ("stream", 0),
        ] {
            p.s(k).int(v);
        }
        p.s("segment_type").s("small");
        p.s("blocks").list().mark();
        p.dict().mark();
        p.s("address")
            .int(BASE)
            .s("size")
            .int(0)
            .s("state")
            .s("inactive");
        p.setitems();
        let b = p.put();
        for _ in 1..2000 {
            p.get(b);
        }
        p.appends();
        p.setitems();
        let s = p.put();
        for _ in 1..2000 {
            p.get(s);
        }
        p.appends();
        p.s("device_traces").list();
        p.setitems();
        out.push(case("shared_segment_blocks", p.stop(), Expect::Refused("")));
    }

    // 2. Huge device ids.
    for d in [u32::MAX - 1, u32::MAX] {
        out.push(case(
            &format!("device_{d}"),
            snapshot(
                |p| segment(p, i128::from(d), BASE, TWO_MIB, "inactive"),
                Some(&|p: &mut P| one_device(p, |_| {})),
            ),
            Expect::Refused("device"),
        ));
    }

    // 3. Sizes near 2^64: requests no device can serve are OOMs (or refused), never
    // successes.
    for size in [u64max - 511, u64max - 1, u64max, 1i128 << 63] {
        out.push(case(
            &format!("alloc_{size:x}"),
            snapshot(
                |_| {},
                Some(&|p: &mut P| {
                    one_device(p, |p| {
                        event(p, "oom", 1 << 30, size);
                    });
                }),
            ),
            Expect::Valid { oom: true },
        ));
    }

    // 4. Segments without events: the end state counts.
    let seg = |p: &mut P| segment(p, 0, BASE, TWO_MIB, "inactive");
    out.push(case(
        "no_device_traces",
        snapshot(seg, None),
        Expect::Valid { oom: false },
    ));
    out.push(case(
        "empty_device_traces",
        snapshot(seg, Some(&|_: &mut P| {})),
        Expect::Valid { oom: false },
    ));
    {
        let mut p = P::new();
        p.list().mark();
        segment(&mut p, 0, BASE, TWO_MIB, "inactive");
        p.appends();
        out.push(case(
            "legacy_segment_list",
            p.stop(),
            Expect::Valid { oom: false },
        ));
    }

    // 5. Impossible recordings.
    out.push(case(
        "overlapping_segments",
        snapshot(
            |p| {
                segment(p, 0, BASE, 2 * TWO_MIB, "inactive");
                segment(p, 0, BASE + TWO_MIB, TWO_MIB, "inactive");
            },
            Some(&|p: &mut P| one_device(p, |_| {})),
        ),
        Expect::Refused("overlap"),
    ));
    out.push(case(
        "free_of_unknown_segment",
        snapshot(
            |_| {},
            Some(&|p: &mut P| {
                one_device(p, |p| {
                    event(p, "segment_alloc", BASE, 2 * TWO_MIB);
                    event(p, "segment_free", BASE + TWO_MIB, TWO_MIB);
                });
            }),
        ),
        Expect::Refused("segment"),
    ));
    out.push(case(
        "segment_8eib",
        snapshot(
            |p| segment(p, 0, BASE, 1 << 63, "inactive"),
            Some(&|p: &mut P| one_device(p, |_| {})),
        ),
        Expect::Refused("segment"),
    ));
    out.push(case(
        "small_segment_of_512_bytes",
        snapshot(
            |p| segment(p, 0, BASE, 512, "inactive"),
            Some(&|p: &mut P| one_device(p, |_| {})),
        ),
        Expect::Refused("small-pool"),
    ));
    out.push(case(
        "segment_wraps",
        snapshot(
            |p| segment(p, 0, u64max - TWO_MIB + 4097, TWO_MIB, "inactive"),
            Some(&|p: &mut P| one_device(p, |_| {})),
        ),
        Expect::Refused("segment"),
    ));
    out.push(case(
        "segment_alloc_twice",
        snapshot(
            |_| {},
            Some(&|p: &mut P| {
                one_device(p, |p| {
                    event(p, "segment_alloc", BASE, TWO_MIB);
                    event(p, "segment_alloc", BASE, TWO_MIB);
                });
            }),
        ),
        Expect::Refused("overlaps"),
    ));
    // A segment freed that the trace never allocated predates it (a wrapped history):
    // valid.
    out.push(case(
        "free_of_segment_before_the_trace",
        snapshot(
            |_| {},
            Some(&|p: &mut P| {
                one_device(p, |p| {
                    event(p, "segment_free", BASE, TWO_MIB);
                });
            }),
        ),
        Expect::Valid { oom: false },
    ));
    out.push(case(
        "alloc_wraps",
        snapshot(
            |_| {},
            Some(&|p: &mut P| {
                one_device(p, |p| {
                    event(p, "segment_alloc", u64max - 4095, TWO_MIB);
                });
            }),
        ),
        Expect::Refused("segment"),
    ));

    // A free whose size is not its alloc's: PyTorch cannot record it.
    out.push(case(
        "free_size_differs",
        snapshot(
            |_| {},
            Some(&|p: &mut P| {
                one_device(p, |p| {
                    event(p, "segment_alloc", BASE, TWO_MIB);
                    event(p, "alloc", BASE, 512);
                    event(p, "free_requested", BASE, 1024);
                    event(p, "free_completed", BASE, 1024);
                });
            }),
        ),
        Expect::Refused("alloc's size"),
    ));

    // 4 (JSON): the legacy list of segments, a duplicated `device_traces` key, a BOM.
    let seg_json = format!(
        r#"{{"device": 0, "address": {BASE}, "total_size": {TWO_MIB}, "allocated_size": 0, "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "small", "blocks": [{{"address": {BASE}, "size": {TWO_MIB}, "requested_size": 0, "state": "inactive"}}]}}"#
    );
    out.push(case(
        "json_legacy_segment_list",
        format!("[{seg_json}]").into_bytes(),
        Expect::Valid { oom: false },
    ));
    out.push(case(
        "json_duplicated_device_traces",
        format!(r#"{{"segments": [{seg_json}], "device_traces": [[]], "device_traces": []}}"#)
            .into_bytes(),
        Expect::Valid { oom: false },
    ));
    out.push(case(
        "json_bom",
        format!("\u{feff}{{\"segments\": [{seg_json}]}}").into_bytes(),
        Expect::Valid { oom: false },
    ));

    // 8. A gzip bomb: 300 MiB of zeros in ~300 kB, past the 256 MiB floor of the cap.
    {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..300 {
            gz.write_all(&zeros).unwrap();
        }
        out.push(case(
            "gzip_bomb",
            gz.finish().unwrap(),
            Expect::Refused("decompression bomb"),
        ));
    }

    // Valid controls: the contract holds on a small correct trace.
    out.push(case(
        "valid_small",
        snapshot(
            |_| {},
            Some(&|p: &mut P| one_device(p, |p| small_trace(p, 10))),
        ),
        Expect::Valid { oom: false },
    ));
    out
}
