//! Makes a timely-dataflow program a client of the timely progress service.
//!
//! One call per worker, before the worker builds its dataflows, and the service then hosts
//! every dataflow the worker builds: its graph (nested scopes included), each worker's progress
//! as that worker's batches, and so the frontiers, `explain` (which operator, which worker,
//! which pointstamp holds a frontier back), lag per operator and the Delta history.
//!
//! ```no_run
//! use timely::dataflow::operators::{Inspect, ToStream};
//!
//! let guards = timely::execute(timely::Config::process(4), |worker| {
//!     let attached = timely_progress_service::attach(worker, "http://127.0.0.1:8000", "program-token", "demo")
//!         .expect("logging is available in timely workers");
//!     worker.dataflow::<u64, _, _>(|scope| {
//!         (0..10u64).to_stream(scope).container::<Vec<_>>().inspect(|x| println!("{x}"));
//!     });
//!     attached // returned, so that the program waits for the last batches below
//! })
//! .unwrap();
//! for attached in guards.join().into_iter().flatten() {
//!     println!("{}", attached.finish());
//! }
//! ```
//!
//! How it works: the connector registers loggers for timely's own log streams (`timely` for
//! operators and channels, `timely/summary/T` for each operator's connectivity and
//! `timely/progress/T` for the progress messages each worker sends, for each timestamp type
//! `T` it maps, see [`time`]). When a dataflow is built, worker 0 registers its graph
//! ([`graph`]) with every worker's initial capabilities, using the service's *program token*
//! (which may register dataflows and report their progress, nothing else: the admin token stays
//! out of the program), and the other workers of the process find it; each worker then posts exactly the updates its own progress channels send, mapped
//! across scope boundaries ([`mapping`]), from a background thread ([`Attached`]) with the
//! service's exactly-once `(worker, seq)` protocol. [`replay`] checks the service against
//! timely's own reachability trackers, version by version.

#![warn(missing_docs)]

mod capture;
pub mod client;
pub mod graph;
mod journal;
pub mod mapping;
mod outbox;
mod rendezvous;
pub mod replay;
mod replay_check;
mod sender;
mod stats;
mod status;
pub mod time;

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use timely::logging_core::Registry;
use timely::order::Product;
use timely::worker::Worker;

pub(crate) use status::Status;
pub use status::{DataflowReport, Report};
pub use time::ServiceTimestamp;

use capture::{Capture, Flushers};
use outbox::Outbox;

type RegisterTime = fn(&mut Registry, &Rc<RefCell<Capture>>, &Flushers);

/// What a sender needs to know; shared with its thread.
pub(crate) struct Settings {
    pub(crate) url: String,
    pub(crate) token: String,
    pub(crate) worker: usize,
    pub(crate) generation: usize,
    pub(crate) linger: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) finish_timeout: Duration,
    pub(crate) journal: Option<PathBuf>,
    pub(crate) find_by_name: bool,
    /// Measuring only (feature `bench`): everything but the requests, which are answered at once.
    pub(crate) offline: bool,
}

/// How to attach: the service, the name, and options; [`Attach::attach`] does it.
///
/// Every setter says what it changes; the defaults suit a service on the same machine.
pub struct Attach {
    url: String,
    token: String,
    name: String,
    times: Vec<RegisterTime>,
    linger: Duration,
    request_timeout: Duration,
    finish_timeout: Duration,
    journal: Option<PathBuf>,
    find_by_name: bool,
    offline: bool,
    statistics: Option<Duration>,
}

/// `R` and iterative scopes of it with `u32`, `u64` or `usize` loop counters.
///
/// Only these by default because every registered logger costs every `step` of the worker a
/// clock read when timely flushes its logs, whether or not a dataflow uses its type (about 10%
/// of a step-heavy program's CPU time for the 39 types of two levels of loops; a quarter of
/// that for these twelve).
fn register_catalogue<R: ServiceTimestamp>(
    registry: &mut Registry,
    capture: &Rc<RefCell<Capture>>,
    flushers: &Flushers,
) {
    capture::register_time::<R>(registry, capture, flushers);
    capture::register_time::<Product<R, u32>>(registry, capture, flushers);
    capture::register_time::<Product<R, u64>>(registry, capture, flushers);
    capture::register_time::<Product<R, usize>>(registry, capture, flushers);
}

impl Attach {
    /// Attaching to the service at `url` (e.g. `http://127.0.0.1:8000`) with `token` (the
    /// program token, `TRACKER_PROGRAM_TOKEN` or `<warehouse>/program-token`: worker 0 registers
    /// with it; progress then uses the dataflow's own token; the admin token works too, but a
    /// program does not need it) under `name` (the first dataflow the worker builds is registered as `name`, later ones as
    /// `name/<index>`; give each run its own name when several runs share a service).
    ///
    /// Maps the timestamp types most programs use: `u32`, `u64`, `usize` at the root and one
    /// level of iterative scopes in them (`Product<_, u32 | u64 | usize>`); add others (a loop
    /// in a loop, say) with [`Attach::timestamp`], or declare exactly the program's with
    /// [`Attach::declared_timestamps_only`].
    pub fn new(url: &str, token: &str, name: &str) -> Attach {
        Attach {
            url: url.to_owned(),
            token: token.to_owned(),
            name: name.to_owned(),
            times: vec![register_catalogue::<u32>, register_catalogue::<u64>, register_catalogue::<usize>],
            linger: Duration::from_millis(100),
            request_timeout: Duration::from_secs(10),
            finish_timeout: Duration::from_secs(30),
            journal: None,
            find_by_name: false,
            offline: false,
            statistics: None,
        }
    }

    /// Also maps scopes whose time is `T` (any [`ServiceTimestamp`]: unsigned integers and
    /// `Product`s of them, nested to any depth). Types outside that trait do not compile here;
    /// a scope of a type that is not mapped makes its dataflow refused when it is built, with
    /// the operator named.
    pub fn timestamp<T: ServiceTimestamp>(mut self) -> Attach {
        self.times.push(capture::register_time::<T>);
        self
    }

    /// Maps only the types declared with [`Attach::timestamp`], none by default: each mapped
    /// type costs the worker a little at every `step` (timely flushes every registered logger).
    pub fn declared_timestamps_only(mut self) -> Attach {
        self.times.clear();
        self
    }

    /// How long the sender waits for more progress before posting a batch (default 100 ms):
    /// longer means fewer, larger batches (more of a worker's updates cancel before they are
    /// sent, so the service does less work: a third less of its CPU time at 100 ms than at 20 ms
    /// on a step-heavy program) and a service view that lags by as much. The worker's last
    /// batch never waits for it.
    pub fn linger(mut self, linger: Duration) -> Attach {
        self.linger = linger;
        self
    }

    /// How long [`Attached::finish`] (or dropping the handle after the worker ended) waits for
    /// the last batches when the service does not answer (default 30 s).
    pub fn finish_timeout(mut self, timeout: Duration) -> Attach {
        self.finish_timeout = timeout;
        self
    }

    /// Writes what was sent to `<dir>/w<index>.jsonl`, for [`replay`]'s check.
    pub fn journal(mut self, dir: impl Into<PathBuf>) -> Attach {
        self.journal = Some(dir.into());
        self
    }

    /// Lets workers that are not in worker 0's process find the dataflow by its name with the
    /// program token (they then post progress with it: the program token may, to the dataflows it
    /// registered). Off by default: in one process, workers
    /// meet worker 0's registration directly, which a stale dataflow of the same name cannot
    /// confuse.
    pub fn find_by_name(mut self, yes: bool) -> Attach {
        self.find_by_name = yes;
        self
    }

    /// Also sends why the program is slow, every `every` (1 s suits most programs; off by
    /// default): per operator, the time the worker spent in it (timely's `Schedule` events), and
    /// per channel, the messages and records it sent (`Messages` events), summed on the worker
    /// and sent as one small request per interval and dataflow, never per event. The service
    /// shows them beside the frontiers (busy share per operator, records per second per
    /// channel). Off, nothing of them is counted or sent.
    pub fn statistics(mut self, every: Duration) -> Attach {
        self.statistics = Some(every.max(Duration::from_millis(10)));
        self
    }

    /// Does everything but talk to the service (feature `bench`): capture, consolidation,
    /// mapping and the batches' bodies, each request answered at once. Separates the
    /// connector's own cost from the service's in `python -m bench timely`.
    #[cfg(feature = "bench")]
    pub fn without_service(mut self) -> Attach {
        self.offline = true;
        self
    }

    /// Attaches `worker`: registers the loggers and starts the worker's sender thread.
    ///
    /// Call it before the worker builds the dataflows to be tracked (earlier ones are not).
    /// Errors only when timely offers no logging or the thread cannot start; the service being
    /// unreachable is not an error (the connector says so once and catches up later).
    pub fn attach(self, worker: &mut Worker) -> Result<Attached, AttachError> {
        let index = worker.index();
        let generation = next_generation(&self.name, index);
        let settings = Arc::new(Settings {
            url: self.url,
            token: self.token,
            worker: index,
            generation,
            linger: self.linger,
            request_timeout: self.request_timeout,
            finish_timeout: self.finish_timeout,
            journal: self.journal,
            find_by_name: self.find_by_name,
            offline: self.offline,
        });
        let status = Arc::new(Status::new(index));
        let outbox = Arc::new(Outbox::default());
        let first = worker.next_dataflow_index();
        if first > 0 {
            status.note(format!("{first} dataflows were built before attaching; they are not tracked"));
        }
        {
            let mut registry =
                worker.log_register().ok_or(AttachError("this worker has no logging registry".into()))?;
            let mut capture = Capture::new(self.name, worker.peers(), first, Arc::clone(&outbox), Arc::clone(&status));
            if let Some(every) = self.statistics {
                capture = capture.with_statistics(every);
            }
            let capture = Rc::new(RefCell::new(capture));
            let flushers: Flushers = Rc::default();
            for register in &self.times {
                register(&mut registry, &capture, &flushers);
            }
            capture::register_structure(&mut registry, &capture, &flushers);
        }
        let thread = {
            let (outbox, settings, status) = (Arc::clone(&outbox), Arc::clone(&settings), Arc::clone(&status));
            std::thread::Builder::new()
                .name(format!("progress-service-w{index}"))
                .spawn(move || sender::run(outbox, settings, status))
                .map_err(|e| AttachError(format!("cannot start the sender thread: {e}")))?
        };
        Ok(Attached { status, outbox, thread: Some(thread) })
    }
}

/// Attaches `worker` to the service at `url` under `name` with the default options (see
/// [`Attach::new`]).
pub fn attach(worker: &mut Worker, url: &str, token: &str, name: &str) -> Result<Attached, AttachError> {
    Attach::new(url, token, name).attach(worker)
}

/// Why a worker could not be attached.
#[derive(Debug, Clone)]
pub struct AttachError(pub String);

impl std::fmt::Display for AttachError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot attach to the progress service: {}", self.0)
    }
}

impl std::error::Error for AttachError {}

/// One worker's connection to the service.
///
/// Keep it until the worker has finished (return it from the worker's closure), then call
/// [`Attached::finish`] or drop it: either waits, up to the finishing timeout, until the last
/// progress is acknowledged, which the process would otherwise lose by exiting. Dropped while
/// the worker still runs, it waits for nothing and the sender goes on alone.
pub struct Attached {
    status: Arc<Status>,
    outbox: Arc<Outbox>,
    thread: Option<JoinHandle<()>>,
}

impl Attached {
    /// What was sent so far, and everything the connector had to say.
    pub fn report(&self) -> Report {
        self.status.report()
    }

    /// Waits until everything the worker handed over so far is acknowledged (or given up), at
    /// most `timeout`; answers whether it was. Progress is handed over when timely flushes its
    /// logs, at the end of each `worker.step()`.
    pub fn flush(&self, timeout: Duration) -> bool {
        self.status.wait_idle(&self.outbox, timeout)
    }

    /// Waits for the worker's last batches (see the type's documentation) and reports.
    pub fn finish(mut self) -> Report {
        self.join();
        self.status.report()
    }

    fn join(&mut self) {
        if self.outbox.is_closed() {
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.join();
    }
}

fn next_generation(name: &str, worker: usize) -> usize {
    static GENERATIONS: OnceLock<Mutex<HashMap<(String, usize), usize>>> = OnceLock::new();
    let mut map = GENERATIONS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    let slot = map.entry((name.to_owned(), worker)).or_insert(0);
    *slot += 1;
    *slot - 1
}
