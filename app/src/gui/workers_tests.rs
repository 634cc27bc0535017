//! The workers' scheduling ([`Host`]) with workers that are engines on the test's thread:
//! each request and answer crosses as the wire's bytes, as to a Web Worker, and each call
//! of `take` lets every live worker run one request (so the workers interleave).

use std::collections::{BTreeMap, VecDeque};

use super::{Awaited, Host, WorkerId, Workers, pool_size};
use crate::engine::Engine;
use crate::engine::multi::ranks_of;
use crate::engine::wire::{self, NamedBytes, Request, Response};

#[derive(Default)]
struct Fake {
    live: BTreeMap<WorkerId, (bool, Engine, VecDeque<Vec<u8>>)>,
    next: WorkerId,
    spawned: Vec<WorkerId>,
    terminated: Vec<WorkerId>,
    /// Requests each worker ran.
    ran: BTreeMap<WorkerId, Vec<String>>,
    /// The answers the host waits on ([`Workers::awaiting`]).
    awaited: Awaited,
    /// The sweeps' replays posted (`true`) and the answers as they came, each with
    /// whether it would wake the page at once.
    log: Vec<(bool, String, bool)>,
    /// Every request posted (`post W Name`) and run (`run W Name`), in order.
    events: Vec<String>,
    /// The size `bytes` tells of every message, instead of its own.
    claimed_bytes: Option<u64>,
}

/// A request's name, as `Fake` logs it.
fn request_name(req: &Request) -> String {
    format!("{req:?}").chars().take(24).collect()
}

impl Workers for &mut Fake {
    type Msg = Vec<u8>;

    fn encode(&self, req: &Request) -> Result<Vec<u8>, String> {
        wire::encode(req)
    }

    fn spawn(&mut self, search: bool) -> Result<WorkerId, String> {
        self.next += 1;
        self.live
            .insert(self.next, (search, Engine::new(), VecDeque::new()));
        self.spawned.push(self.next);
        Ok(self.next)
    }

    fn post(&mut self, w: WorkerId, msg: &Vec<u8>) {
        if let Ok(req) = wire::decode::<Request>(msg) {
            let name = request_name(&req);
            self.events.push(format!(
                "post {w} {}",
                name.split([' ', '{']).next().unwrap_or("")
            ));
            if let Request::SweepReplays { indices, .. } = req {
                self.log
                    .push((true, format!("{} replays", indices.len()), false));
            }
        }
        self.live
            .get_mut(&w)
            .expect("a live worker")
            .2
            .push_back(msg.clone());
    }

    fn bytes(&self, msg: &Vec<u8>) -> u64 {
        self.claimed_bytes.unwrap_or(msg.len() as u64)
    }

    fn terminate(&mut self, w: WorkerId) {
        assert!(self.live.remove(&w).is_some(), "worker {w} ended twice");
        self.terminated.push(w);
    }

    fn awaiting(&mut self, answers: usize) {
        self.awaited = Awaited::new(answers);
    }

    fn take(&mut self) -> Vec<(WorkerId, Response)> {
        let mut out = Vec::new();
        for (w, (search, engine, queue)) in &mut self.live {
            let Some(msg) = queue.pop_front() else {
                continue;
            };
            let req: Request = wire::decode(&msg).expect("a request");
            let name = request_name(&req);
            self.events.push(format!(
                "run {w} {}",
                name.split([' ', '{']).next().unwrap_or("")
            ));
            self.ran.entry(*w).or_default().push(name);
            let mut emit = |r: Response| {
                let bytes = wire::encode(&r).expect("encodes");
                let name = format!("{r:?}").chars().take(16).collect();
                self.log.push((false, name, self.awaited.arrived() == 0));
                out.push((*w, wire::decode(&bytes).expect("decodes")));
            };
            if *search {
                engine.handle_search(req, &mut emit);
            } else {
                engine.handle(req, &mut emit);
            }
        }
        out
    }
}

fn rank_files(names: &[&str]) -> Vec<NamedBytes> {
    names
        .iter()
        .map(|n| NamedBytes {
            name: (*n).to_string(),
            bytes: std::fs::read(format!(
                "{}/../tests/traces/ranks/{n}.pickle.gz",
                env!("CARGO_MANIFEST_DIR")
            ))
            .expect("a rank of the repository"),
        })
        .collect()
}

/// Polls until `done` holds of an answer (at most `rounds` rounds); every answer.
fn poll_until(
    host: &mut Host<&mut Fake>,
    rounds: usize,
    done: impl Fn(&Response) -> bool,
) -> Vec<Response> {
    let mut all = Vec::new();
    for _ in 0..rounds {
        let got = host.poll();
        let finished = got.iter().any(&done);
        all.extend(got);
        if finished {
            return all;
        }
    }
    panic!("no answer after {rounds} rounds: {all:?}");
}

/// `req` routed as the page routes it, beside `engine` as the engine's worker: what the
/// host hands back runs there, then the share it asks for, and a trace shared reaches
/// the host as the page hands it on (the `Request::SearchTrace` the engine's worker
/// posts). What was handed back.
fn route(host: &mut Host<&mut Fake>, engine: &mut Engine, req: Request) -> Option<Request> {
    let back = host.route(req);
    let mut shared = Vec::new();
    for r in back.iter().cloned().chain(host.share_request()) {
        engine.handle(r, &mut |r| {
            if let Response::SharedTrace { job, device, trace } = r {
                let req = Request::SearchTrace { job, device, trace };
                shared.push((job, wire::encode(&req).expect("encodes")));
            }
        });
    }
    for (job, msg) in shared {
        host.shared_trace(job, msg);
    }
    back
}

/// A small workload sent to the host (kept for the search workers, handed back) and
/// loaded in `engine`, the engine's worker.
fn load_workload(host: &mut Host<&mut Fake>, engine: &mut Engine) {
    let workload = Request::Workload {
        job: 1,
        spec: "kvcache:tokens=200".into(),
    };
    assert!(host.route(workload.clone()).is_some());
    engine.handle(workload, &mut |_| {});
}

/// `engine`'s own answer to "What would fit?" as job `job` (its `Debug` form).
fn engines_what_if(engine: &mut Engine, job: u64) -> String {
    let mut answers = Vec::new();
    engine.handle(
        Request::WhatIf {
            job,
            capacity_bytes: None,
        },
        &mut |r| answers.push(r),
    );
    format!("{:?}", answers.last())
}

/// "What would fit?" routed: it runs on the search workers (the engine's worker at most
/// shares the trace first).
fn start_what_if(host: &mut Host<&mut Fake>, engine: &mut Engine, job: u64) {
    let back = route(
        host,
        engine,
        Request::WhatIf {
            job,
            capacity_bytes: None,
        },
    );
    assert!(
        matches!(back, None | Some(Request::ShareTrace { .. })),
        "{back:?}"
    );
}

#[test]
fn a_share_job_crosses_as_a_js_number_exactly() {
    // worker.js's `{trace, job}` carries the job as an f64: a job that rounds is dropped
    // as a share for another trace, and the sweep waits for ever.
    for job in [
        super::SHARE_JOBS,
        super::SHARE_JOBS + 1,
        super::SHARE_JOBS + 12_345,
    ] {
        assert_eq!(job as f64 as u64, job);
    }
}

#[test]
fn the_pool_is_the_hardware_concurrency_at_least_two_and_at_most_eight() {
    assert_eq!(pool_size(Some(1), None), 2);
    assert_eq!(pool_size(None, None), 2);
    assert_eq!(pool_size(Some(6), None), 6);
    assert_eq!(pool_size(Some(64), None), 8);
    assert_eq!(pool_size(Some(6), Some(1)), 1, "the page asked for one");
    assert_eq!(pool_size(Some(6), Some(0)), 1);
    assert_eq!(pool_size(Some(6), Some(99)), 8);
}

#[test]
fn ranks_in_a_pool_of_two_workers_answer_as_the_engine_does() {
    let names = ["ddp4_rank0", "ddp4_rank1", "ddp4_rank2", "ddp4_rank3"];
    let mut files = rank_files(&names);
    // A corrupt file among them: named among the failed, the others shown.
    files.insert(
        1,
        NamedBytes {
            name: "ddp4_rank9.pickle".into(),
            bytes: vec![0x80, 0x04, 1, 2, 3],
        },
    );
    let what_if = allocsim_core::ranks::DEFAULT_WHAT_IF.to_string();
    let want = ranks_of(&files, what_if.clone());
    let mut fake = Fake::default();
    let mut host = Host::new(&mut fake, 2);
    let routed = host.route(Request::Ranks {
        job: 7,
        files,
        what_if,
    });
    assert!(routed.is_none(), "the pool runs the ranks");
    let answers = poll_until(&mut host, 20, |r| matches!(r, Response::Ranked { .. }));
    assert_eq!(host.counts().rank_workers, 2, "both workers answered ranks");
    let Some(Response::Ranked { job: 7, data }) = answers.last() else {
        panic!("{answers:?}");
    };
    let (report, want_report) = (data.report.as_ref(), want.report.as_ref());
    assert_eq!(report, want_report);
    assert_eq!(data.failed, want.failed);
    assert_eq!(data.failed.len(), 1);
    assert_eq!(data.failed[0].file, "ddp4_rank9.pickle");
    let report = report.expect("a report");
    assert_eq!(report.ranks.len(), 4);
    assert_eq!(report.outlier.as_ref().map(|o| o.rank), Some(2));
    // Progress as the ranks came back, the last at 1.
    let progress: Vec<f32> = answers
        .iter()
        .filter_map(|r| match r {
            Response::Progress { fraction, .. } => Some(*fraction),
            _ => None,
        })
        .collect();
    assert_eq!(progress.len(), 6, "{progress:?}");
    assert!((progress[5] - 1.0).abs() < f32::EPSILON);
    drop(host);
    // Each worker ran ranks; both ended once the queue was empty.
    assert_eq!(fake.spawned.len(), 2);
    assert!(fake.live.is_empty(), "every worker ended");
    assert!(fake.ran.values().all(|r| r.len() >= 2), "{:?}", fake.ran);
}

#[test]
fn ranks_of_different_devices_are_refused_through_the_pool_too() {
    // The rows do not carry how many devices each process saw; the answer does.
    let mut files = rank_files(&["ddp4_rank0"]);
    files.push(NamedBytes {
        name: "two_gpu_pipeline.pickle.gz".into(),
        bytes: std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/traces/two_gpu_pipeline.pickle.gz"
        ))
        .expect("the shared traces"),
    });
    let what_if = allocsim_core::ranks::DEFAULT_WHAT_IF.to_string();
    let want = ranks_of(&files, what_if.clone());
    assert!(want.error.is_some(), "{want:?}");
    let mut fake = Fake::default();
    let mut host = Host::new(&mut fake, 4);
    assert!(
        host.route(Request::Ranks {
            job: 1,
            files,
            what_if,
        })
        .is_none()
    );
    let answers = poll_until(&mut host, 20, |r| matches!(r, Response::Ranked { .. }));
    let Some(Response::Ranked { data, .. }) = answers.last() else {
        panic!("{answers:?}");
    };
    assert_eq!(data.error, want.error);
    drop(host);
    assert_eq!(fake.spawned.len(), 2, "no more workers than ranks");
}

#[test]
fn cancel_terminates_every_search_worker_and_the_other_searches_go_on_in_a_fresh_one() {
    let mut fake = Fake::default();
    let mut host = Host::new(&mut fake, 2);
    let mut engine = Engine::new();
    let spec = "kvcache:tokens=500";
    // The load goes to the engine's worker and is kept for the search worker.
    assert!(matches!(
        route(
            &mut host,
            &mut engine,
            Request::Workload {
                job: 1,
                spec: spec.into()
            }
        ),
        Some(Request::Workload { .. })
    ));
    assert!(
        host.route(Request::Layout {
            job: 2,
            slot: 0,
            op: 3
        })
        .is_some(),
        "layouts stay with the engine"
    );
    // The engine's worker shared its trace right after the workload: the search workers
    // never decode anything.
    assert_eq!(host.counts().traces_shared, 1);
    let back = route(
        &mut host,
        &mut engine,
        Request::WhatIf {
            job: 3,
            capacity_bytes: None,
        },
    );
    assert!(back.is_none(), "{back:?}");
    assert!(
        host.route(Request::MinCapacity {
            job: 4,
            slot: 0,
            spec: "pytorch".into()
        })
        .is_none()
    );
    // The sweep's two search workers build the trace; the sweep has not answered yet.
    assert_eq!(host.counts().search_live, 2, "a pool of two");
    let early = host.poll();
    assert!(
        early
            .iter()
            .all(|r| matches!(r, Response::Progress { job: 3, .. })),
        "{early:?}"
    );
    assert!(
        host.route(Request::Cancel { job: 99 }).is_some(),
        "not a search of the worker: the engine's"
    );
    assert!(host.route(Request::Cancel { job: 3 }).is_none());
    assert_eq!(host.counts().search_terminated, 2, "both at once");
    assert_eq!(
        host.counts().search_started,
        3,
        "a fresh worker took the rest"
    );
    assert_eq!(host.counts().search_live, 1);
    let answers = poll_until(&mut host, 10, |r| {
        matches!(r, Response::MinCapacity { job: 4, .. })
    });
    assert!(
        matches!(&answers[0], Response::Failed { job: 3, message } if message == "cancelled"),
        "{answers:?}"
    );
    assert!(
        !answers
            .iter()
            .any(|r| matches!(r, Response::WhatIf { .. } | Response::Loaded { .. })),
        "no answer of the cancelled sweep, none of the setup: {answers:?}"
    );
    // The next sweep runs in that worker, which has the trace, and a fresh helper: the
    // trace is not shared again.
    assert!(
        host.route(Request::WhatIf {
            job: 5,
            capacity_bytes: None
        })
        .is_none()
    );
    assert_eq!(host.counts().traces_shared, 1);
    let answers = poll_until(&mut host, 400, |r| matches!(r, Response::WhatIf { .. }));
    assert!(
        matches!(answers.last(), Some(Response::WhatIf { job: 5, answer }) if answer.candidates_tried > 100),
        "{answers:?}"
    );
    assert_eq!(host.counts().search_started, 4);
    assert_eq!(host.counts().sweep_workers, 2, "both replayed settings");
    // Each worker took its share of a batch in one message, not a replay at a time.
    let shares = |fake: &Fake| -> usize {
        (fake.ran.values().flatten())
            .filter(|r| r.starts_with("SweepReplays"))
            .count()
    };
    // A new trace lets the idle worker go.
    host.route(Request::Workload {
        job: 6,
        spec: spec.into(),
    });
    drop(host);
    let first = fake.spawned[0];
    assert_eq!(
        fake.ran[&first].len(),
        1,
        "the first worker ran the setup only"
    );
    assert_eq!(fake.terminated.len(), 4);
    assert!(fake.live.is_empty());
    let replayed = fake.ran.values().flatten().count();
    assert!(
        (1..=2 * 4).contains(&shares(&fake)),
        "a message per worker and batch: {:?}",
        fake.ran
    );
    assert!(replayed < 20, "{replayed} messages for over 100 replays");
}

/// A small workload loaded in `engine` (the engine's worker) and swept on the host's
/// search workers, to its answer.
fn sweep_a_workload(host: &mut Host<&mut Fake>, engine: &mut Engine) {
    route(
        host,
        engine,
        Request::Workload {
            job: 1,
            spec: "kvcache:tokens=200".into(),
        },
    );
    start_what_if(host, engine, 2);
    poll_until(host, 400, |r| matches!(r, Response::WhatIf { .. }));
}

#[test]
fn the_answers_a_sweep_waits_on_wake_the_page_at_once_and_no_other() {
    let mut fake = Fake::default();
    let mut host = Host::new(&mut fake, 2);
    let mut engine = Engine::new();
    sweep_a_workload(&mut host, &mut engine);
    drop(host);
    let woke: Vec<&String> = fake.log.iter().filter(|e| e.2).map(|e| &e.1).collect();
    assert!(woke[0].starts_with("SweepSizes"), "{:?}", fake.log);
    // Each batch: its replays posted (a message per worker), then one answer per replay,
    // the last of which (and only it) wakes the page to hand out the next batch or rank.
    let mut batches = 0;
    let mut k = 0;
    while k < fake.log.len() {
        if !fake.log[k].0 {
            k += 1;
            continue;
        }
        let mut posted = 0;
        while k < fake.log.len() && fake.log[k].0 {
            posted += fake.log[k]
                .1
                .split(' ')
                .next()
                .and_then(|n| n.parse::<usize>().ok())
                .expect("a count");
            k += 1;
        }
        let answers: Vec<&(bool, String, bool)> = fake.log[k..]
            .iter()
            .take_while(|e| !e.0)
            .filter(|e| e.1.starts_with("SweepReplayed"))
            .collect();
        assert_eq!(answers.len(), posted, "{:?}", fake.log);
        let wakes: Vec<bool> = answers.iter().map(|e| e.2).collect();
        let mut expected = vec![false; posted];
        expected[posted - 1] = true;
        assert_eq!(wakes, expected, "batch {batches}: {:?}", fake.log);
        batches += 1;
    }
    assert!(batches >= 1);
    assert_eq!(woke.len(), 1 + batches, "{:?}", fake.log);
}

#[test]
fn an_awaited_count_wakes_on_its_last_answer_only() {
    let mut a = Awaited::new(3);
    let (slow, usual) = (super::AWAITED_WAKE_AFTER_MS, super::WAKE_AFTER_MS);
    assert_eq!(
        [a.arrived(), a.arrived(), a.arrived(), a.arrived()],
        [slow, slow, 0, usual]
    );
    assert_eq!(Awaited::default().arrived(), usual);
}

#[test]
fn a_file_the_engine_opens_itself_is_opened_by_the_next_search_worker_too() {
    let mut fake = Fake::default();
    let mut host = Host::new(&mut fake, 2);
    let mut engine = Engine::new();
    sweep_a_workload(&mut host, &mut engine);
    // A dropped file: the engine's worker reads it itself (no request passes the host);
    // the open is what a search worker must run first from now on. Here the fake's
    // workers read it as the load of the same bytes.
    let ex = &crate::engine::examples::EXAMPLES[0];
    let load = Request::Load {
        job: 3,
        name: ex.file.into(),
        bytes: ex.bytes.to_vec(),
    };
    let mut direct = Engine::new();
    direct.handle(load.clone(), &mut |_| {});
    engine.handle(load.clone(), &mut |_| {});
    host.opening(wire::encode(&load).expect("encodes"));
    start_what_if(&mut host, &mut engine, 4);
    let answers = poll_until(&mut host, 400, |r| matches!(r, Response::WhatIf { .. }));
    assert_eq!(
        format!("{:?}", answers.last()),
        engines_what_if(&mut direct, 4),
        "the sweep ran on the opened file's trace, its replays on two workers, ranked \
         as the engine ranks them on one"
    );
    assert_eq!(host.counts().sweep_workers, 2);
    drop(host);
    assert_eq!(
        fake.terminated.len(),
        2,
        "the idle search workers with the old trace went"
    );
    for fresh in &fake.spawned[2..] {
        assert!(
            fake.ran[fresh][0].starts_with("SearchTrace"),
            "a fresh worker took the trace the engine shared, not the file: {:?}",
            fake.ran[fresh]
        );
    }
    assert!(
        !fake.ran.values().flatten().any(|r| r.starts_with("Load")),
        "no search worker decoded the file: {:?}",
        fake.ran
    );
    assert_eq!(fake.spawned.len(), 4);
}

#[test]
fn a_sweep_cancelled_while_the_trace_is_shared_starts_nothing_and_the_next_takes_it() {
    let mut fake = Fake::default();
    let mut host = Host::new(&mut fake, 2);
    let mut engine = Engine::new();
    load_workload(&mut host, &mut engine);
    // The page's "What would fit?" before the trace was shared (the page asks for it as
    // it sends the trace; here not): the host asks for it once; cancelled before it came.
    let back = host.route(Request::WhatIf {
        job: 2,
        capacity_bytes: None,
    });
    assert!(
        matches!(back, Some(Request::ShareTrace { job }) if job >= super::SHARE_JOBS),
        "{back:?}"
    );
    assert!(host.share_request().is_none(), "asked once");
    assert_eq!(host.counts().search_live, 0, "no worker before the trace");
    assert!(host.route(Request::Cancel { job: 2 }).is_none());
    let mut shared = Vec::new();
    engine.handle(back.expect("asked"), &mut |r| shared.push(r));
    let Some(Response::SharedTrace { job, device, trace }) = shared.pop() else {
        panic!("{shared:?}");
    };
    // Bytes that are no trace: the search worker holds none (a search fails, it does
    // not panic).
    let mut bad = Engine::new();
    bad.handle_search(
        Request::SearchTrace {
            job,
            device,
            trace: trace[..trace.len() / 2].to_vec(),
        },
        &mut |_| {},
    );
    let mut answers = Vec::new();
    bad.handle_search(Request::SweepSizes { job: 9 }, &mut |r| answers.push(r));
    assert!(
        matches!(&answers[..], [Response::Failed { job: 9, .. }]),
        "{answers:?}"
    );
    let req = Request::SearchTrace { job, device, trace };
    let msg = wire::encode(&req).expect("encodes");
    host.shared_trace(job, msg.clone());
    assert_eq!(host.counts().traces_shared, 1);
    let after = host.poll();
    assert!(
        matches!(after.last(), Some(Response::Failed { job: 2, message }) if message == "cancelled")
            && after
                .iter()
                .all(|r| r.job() == 2 && !matches!(r, Response::WhatIf { .. })),
        "only the cancel's answer: {after:?}"
    );
    assert_eq!(
        host.counts().search_live,
        0,
        "the cancelled sweep started nothing"
    );
    // The next sweep takes the shared trace without asking again.
    assert!(
        host.route(Request::WhatIf {
            job: 3,
            capacity_bytes: None
        })
        .is_none()
    );
    let answers = poll_until(&mut host, 400, |r| matches!(r, Response::WhatIf { .. }));
    assert!(matches!(
        answers.last(),
        Some(Response::WhatIf { job: 3, .. })
    ));
    // A trace shared for a trace since replaced is dropped.
    host.route(Request::Workload {
        job: 4,
        spec: "kvcache:tokens=100".into(),
    });
    host.shared_trace(job, msg);
    assert_eq!(host.counts().traces_shared, 1);
    assert!(
        matches!(host.share_request(), Some(Request::ShareTrace { job: j }) if j != job),
        "the new trace is asked for"
    );
    drop(host);
    assert!(
        fake.ran.values().all(|r| r[0].starts_with("SearchTrace")),
        "{:?}",
        fake.ran
    );
}

#[test]
fn a_trace_the_engine_cannot_share_is_swept_on_the_file_and_not_asked_again() {
    let mut fake = Fake::default();
    let mut host = Host::new(&mut fake, 2);
    // The engine's worker holds no trace (its load failed, say): the share fails.
    let mut engine = Engine::new();
    let workload = Request::Workload {
        job: 1,
        spec: "kvcache:tokens=100".into(),
    };
    assert!(host.route(workload).is_some());
    let Some(share) = host.share_request() else {
        panic!("a share is asked for the workload");
    };
    let mut answers = Vec::new();
    engine.handle(share.clone(), &mut |r| answers.push(r));
    assert!(
        matches!(&answers[..], [Response::Failed { .. }]),
        "{answers:?}"
    );
    start_what_if(&mut host, &mut engine, 2);
    assert_eq!(host.counts().search_live, 0, "waiting for the share");
    host.share_failed(share.job());
    let answers = poll_until(&mut host, 400, |r| matches!(r, Response::WhatIf { .. }));
    assert!(matches!(
        answers.last(),
        Some(Response::WhatIf { job: 2, .. })
    ));
    // The next sweep does not wait for a share again.
    assert!(
        host.route(Request::WhatIf {
            job: 3,
            capacity_bytes: None
        })
        .is_none()
    );
    poll_until(&mut host, 400, |r| {
        matches!(r, Response::WhatIf { job: 3, .. })
    });
    drop(host);
    assert!(
        fake.ran.values().all(|r| r[0].starts_with("Workload")),
        "the search workers built the workload themselves: {:?}",
        fake.ran
    );
}

/// A workload in the engine's worker, its share asked with the pool started (as
/// `EngineHandle::prepare_search` does), the share handed to the host, the workers left
/// to run what they were told; then "What would fit?" to its answer. The events.
fn share_then_sweep(claimed_bytes: Option<u64>) -> Vec<String> {
    let mut fake = Fake {
        claimed_bytes,
        ..Fake::default()
    };
    let mut host = Host::new(&mut fake, 2);
    let mut engine = Engine::new();
    load_workload(&mut host, &mut engine);
    let share = host.share_request().expect("a share asked");
    host.start_pool();
    assert_eq!(
        host.counts().search_live,
        2,
        "the pool starts with the share"
    );
    assert_eq!(host.counts().search_started, 2);
    let mut shared = Vec::new();
    engine.handle(share, &mut |r| shared.push(r));
    let Some(Response::SharedTrace { job, device, trace }) = shared.pop() else {
        panic!("{shared:?}");
    };
    let msg = wire::encode(&Request::SearchTrace { job, device, trace }).expect("encodes");
    host.shared_trace(job, msg);
    for _ in 0..3 {
        assert!(host.poll().is_empty(), "a trace taken answers nothing");
    }
    assert!(
        host.route(Request::WhatIf {
            job: 2,
            capacity_bytes: None
        })
        .is_none(),
        "the sweep runs on the trace shared, without waiting"
    );
    let answers = poll_until(&mut host, 400, |r| matches!(r, Response::WhatIf { .. }));
    assert!(matches!(
        answers.last(),
        Some(Response::WhatIf { job: 2, .. })
    ));
    assert_eq!(host.counts().search_started, 2, "no other worker started");
    drop(host);
    for w in [1, 2] {
        let trace = format!("post {w} SearchTrace");
        assert_eq!(
            fake.events.iter().filter(|e| **e == trace).count(),
            1,
            "each worker told the trace once: {:?}",
            fake.events
        );
    }
    fake.events
}

#[test]
fn the_search_workers_started_with_the_share_decode_a_small_trace_as_it_comes() {
    let events = share_then_sweep(None);
    let at = |e: &str| events.iter().position(|x| x == e);
    let sizes = at("post 1 SweepSizes").expect("the plan asked");
    for w in [1, 2] {
        let decoded = at(&format!("run {w} SearchTrace")).expect("decoded");
        assert!(
            decoded < sizes,
            "worker {w} decoded the trace before the sweep started: {events:?}"
        );
    }
}

#[test]
fn a_trace_over_the_eager_limit_is_decoded_only_when_a_sweep_starts() {
    let events = share_then_sweep(Some(super::EAGER_DECODE_MAX_BYTES + 1));
    assert_eq!(
        events[..2],
        ["post 1 SearchTrace", "post 1 SweepSizes"],
        "nothing told before the sweep: {events:?}"
    );
    // At the limit, it is decoded at once.
    let events = share_then_sweep(Some(super::EAGER_DECODE_MAX_BYTES));
    assert_eq!(events[..2], ["post 1 SearchTrace", "post 2 SearchTrace"]);
    assert_eq!(events[2], "run 1 SearchTrace");
}

#[test]
fn a_sweep_waiting_for_the_share_starts_on_the_plan_the_engine_sent_ahead_of_it() {
    let mut fake = Fake::default();
    let mut host = Host::new(&mut fake, 2);
    let mut engine = Engine::new();
    load_workload(&mut host, &mut engine);
    // As `EngineHandle::prepare_search` asks: the plan, the share, the pool started; the
    // sweep asked in the same frame waits for the share.
    let share = host.share_request().expect("a share asked");
    let plan = host.plan_request().expect("a plan asked");
    assert!(host.plan_request().is_none(), "asked once per trace");
    host.start_pool();
    let waiting = host.route(Request::WhatIf {
        job: 2,
        capacity_bytes: None,
    });
    assert!(waiting.is_none(), "{waiting:?}");
    let mut from_engine = Vec::new();
    engine.handle(plan, &mut |r| from_engine.push(r));
    engine.handle(share, &mut |r| from_engine.push(r));
    let [sizes, Response::SharedTrace { job, device, trace }] = &from_engine[..] else {
        panic!("{from_engine:?}");
    };
    assert!(matches!(sizes, Response::SweepSizes { .. }), "{sizes:?}");
    assert!(
        host.take_plan(sizes),
        "the plan is the host's, not the UI's"
    );
    let shared = Request::SearchTrace {
        job: *job,
        device: *device,
        trace: trace.clone(),
    };
    host.shared_trace(*job, wire::encode(&shared).expect("encodes"));
    assert_eq!(host.counts().sweeps_planned, 1, "planned as the trace came");
    let answers = poll_until(&mut host, 400, |r| matches!(r, Response::WhatIf { .. }));
    assert_eq!(
        format!("{:?}", answers.last()),
        engines_what_if(&mut engine, 2),
        "the sweep on the engine's plan answers as the engine does"
    );
    assert_eq!(host.counts().sweep_workers, 2);
    // A device chosen drops the plan: the next sweep asks a search worker for its own.
    host.route(Request::SelectDevice { job: 3, device: 0 });
    assert!(
        !host.take_plan(&Response::Failed {
            job: 4,
            message: String::new()
        }),
        "a UI job is the UI's"
    );
    assert!(
        host.route(Request::WhatIf {
            job: 5,
            capacity_bytes: None
        })
        .is_none()
    );
    poll_until(&mut host, 400, |r| {
        matches!(r, Response::WhatIf { job: 5, .. })
    });
    drop(host);
    let sizes_posted: Vec<&String> = fake
        .events
        .iter()
        .filter(|e| e.starts_with("post") && e.ends_with("SweepSizes"))
        .collect();
    assert_eq!(
        sizes_posted,
        ["post 1 SweepSizes"],
        "no search worker was asked for the first sweep's plan, one for the second: {:?}",
        fake.events
    );
    assert_eq!(
        fake.events[..4],
        [
            "post 1 SearchTrace",
            "post 2 SearchTrace",
            "post 1 SweepReplays",
            "post 2 SweepReplays"
        ],
        "the first replays handed out with the trace"
    );
}

/// The frames a page paints after `wake` (an answer arriving between frames): as eframe's
/// web runner does, a frame is run whenever egui's repaint callback asked for one.
fn frames_after(wake: impl FnOnce(&egui::Context)) -> usize {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let ctx = egui::Context::default();
    let asked = Arc::new(AtomicBool::new(true));
    let flag = asked.clone();
    ctx.set_request_repaint_callback(move |_| flag.store(true, Ordering::SeqCst));
    let run = |ctx: &egui::Context| {
        let mut frames = 0;
        while asked.swap(false, Ordering::SeqCst) {
            frames += 1;
            assert!(frames < 20, "the page never settled");
            let mut out = ctx.run_ui(egui::RawInput::default(), |ui| {
                ui.label("the sweep's progress");
            });
            out.textures_delta.clear();
        }
        frames
    };
    run(&ctx);
    wake(&ctx);
    run(&ctx)
}

#[test]
fn an_answer_that_wakes_the_page_at_once_costs_one_frame() {
    assert_eq!(frames_after(|ctx| super::wake(ctx, 0)), 1);
    assert_eq!(frames_after(|ctx| super::wake(ctx, 500)), 1);
    // What it replaces: egui paints twice after a repaint asked with no delay.
    assert_eq!(frames_after(egui::Context::request_repaint), 2);
}

#[test]
fn the_bounds_sent_beside_are_computed_by_the_search_worker_as_the_engine_would() {
    let mut fake = Fake::default();
    let mut host = Host::new(&mut fake, 2);
    let mut engine = Engine::new();
    load_workload(&mut host, &mut engine);
    let mut want = Vec::new();
    engine.handle(Request::Bounds { job: 7 }, &mut |r| want.push(r));
    assert!(
        matches!(want.last(), Some(Response::Bounds { job: 7, .. })),
        "{want:?}"
    );
    let layout = Request::Layout {
        job: 8,
        slot: 0,
        op: 1,
    };
    assert!(
        host.beside(layout).is_some(),
        "only the bounds go beside the engine"
    );
    assert!(host.beside(Request::Bounds { job: 7 }).is_none());
    let answers = poll_until(&mut host, 20, |r| matches!(r, Response::Bounds { .. }));
    assert_eq!(
        format!("{:?}", answers.last()),
        format!("{:?}", want.last())
    );
    // Bounds asked, then another trace opened before they came: they fail at once and the
    // search worker, busy with nothing else, stops.
    assert!(host.beside(Request::Bounds { job: 9 }).is_none());
    assert_eq!(host.counts().search_live, 1);
    load_workload(&mut host, &mut engine);
    assert_eq!(host.counts().search_live, 0, "{:?}", host.counts());
    let answers = host.poll();
    assert!(
        matches!(answers.as_slice(), [Response::Failed { job: 9, .. }]),
        "{answers:?}"
    );
    drop(host);
    assert_eq!(fake.spawned.len(), 1, "one search worker");
    assert!(
        fake.ran[&fake.spawned[0]]
            .iter()
            .any(|r| r.starts_with("Bounds")),
        "{:?}",
        fake.ran
    );
}
