//! What a worker's connection did, and what it says: each event once, on standard error.
//!
//! A program keeps running whatever the service does; the connector's only voice is a line on
//! standard error when something changes (the service unreachable, reachable again, a dataflow
//! refused) and the [`Report`] its handle returns.

use std::fmt;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::outbox::Outbox;

/// One dataflow's delivery so far.
#[derive(Clone, Debug, Default)]
pub struct DataflowReport {
    /// The name it is registered under.
    pub name: String,
    /// The service's id, once registered (or found).
    pub id: Option<String>,
    /// Batches acknowledged.
    pub batches: u64,
    /// Updates in them (after consolidation and mapping).
    pub updates: u64,
    /// Updates timely's progress channels sent, before consolidation.
    pub raw_updates: u64,
    /// The service's version after this worker's last batch.
    pub last_version: Option<u64>,
    /// Statistics reports acknowledged (with [`crate::Attach::statistics`]; 0 without).
    pub statistics_reports: u64,
    /// `registering`, `registered`, or `refused: ...` / `failed: ...` with the reason.
    pub state: String,
}

/// A worker's connection, as [`crate::Attached::report`] and [`crate::Attached::finish`] see it.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The worker's index.
    pub worker: usize,
    /// Every dataflow the worker built since attaching.
    pub dataflows: Vec<DataflowReport>,
    /// Everything the connector said, in order.
    pub notes: Vec<String>,
    /// Whether the sender finished with everything delivered or given up for a stated reason.
    pub done: bool,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.dataflows {
            write!(
                f,
                "worker {}: dataflow {} ({}): {}, {} batches, {} updates ({} sent by timely)",
                self.worker,
                d.name,
                d.id.as_deref().unwrap_or("-"),
                d.state,
                d.batches,
                d.updates,
                d.raw_updates
            )?;
            if let Some(v) = d.last_version {
                write!(f, ", last version {v}")?;
            }
            if d.statistics_reports > 0 {
                write!(f, ", {} statistics reports", d.statistics_reports)?;
            }
            writeln!(f)?;
        }
        for note in &self.notes {
            writeln!(f, "worker {}: {note}", self.worker)?;
        }
        Ok(())
    }
}

#[derive(Default)]
struct Inner {
    report: Report,
    unreachable: Option<Instant>,
}

/// Shared between a worker's handle and its sender thread.
pub(crate) struct Status {
    inner: Mutex<Inner>,
    changed: Condvar,
}

impl Status {
    pub(crate) fn new(worker: usize) -> Status {
        let report = Report { worker, ..Report::default() };
        Status { inner: Mutex::new(Inner { report, unreachable: None }), changed: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn say(inner: &mut Inner, note: String) {
        eprintln!("timely-progress-service (worker {}): {note}", inner.report.worker);
        inner.report.notes.push(note);
    }

    fn dataflow<'a>(inner: &'a mut Inner, name: &str) -> &'a mut DataflowReport {
        if let Some(i) = inner.report.dataflows.iter().position(|d| d.name == name) {
            return &mut inner.report.dataflows[i];
        }
        inner.report.dataflows.push(DataflowReport { name: name.to_owned(), ..DataflowReport::default() });
        inner.report.dataflows.last_mut().expect("just pushed")
    }

    pub(crate) fn note(&self, note: String) {
        Self::say(&mut self.lock(), note);
    }

    pub(crate) fn refuse(&self, name: &str, reason: String) {
        let mut inner = self.lock();
        Self::dataflow(&mut inner, name).state = format!("refused: {reason}");
        Self::say(&mut inner, format!("dataflow {name} is not tracked: {reason}"));
    }

    pub(crate) fn failed(&self, name: &str, reason: String) {
        let mut inner = self.lock();
        Self::dataflow(&mut inner, name).state = format!("failed: {reason}");
        Self::say(&mut inner, format!("dataflow {name} is no longer tracked: {reason}"));
    }

    pub(crate) fn registering(&self, name: &str) {
        Self::dataflow(&mut self.lock(), name).state = "registering".into();
    }

    pub(crate) fn registered(&self, name: &str, id: &str) {
        let mut inner = self.lock();
        let d = Self::dataflow(&mut inner, name);
        d.state = "registered".into();
        d.id = Some(id.to_owned());
        Self::back(&mut inner);
    }

    pub(crate) fn received(&self, name: &str, raw_updates: usize) {
        Self::dataflow(&mut self.lock(), name).raw_updates += raw_updates as u64;
    }

    pub(crate) fn delivered(&self, name: &str, updates: usize, version: Option<u64>) {
        let mut inner = self.lock();
        let d = Self::dataflow(&mut inner, name);
        d.batches += 1;
        d.updates += updates as u64;
        d.last_version = version.or(d.last_version);
        Self::back(&mut inner);
    }

    pub(crate) fn statistics_delivered(&self, name: &str) {
        let mut inner = self.lock();
        Self::dataflow(&mut inner, name).statistics_reports += 1;
        Self::back(&mut inner);
    }

    fn back(inner: &mut Inner) {
        if let Some(since) = inner.unreachable.take() {
            Self::say(
                inner,
                format!(
                    "the service answers again after {:.1} s; progress held meanwhile was sent",
                    since.elapsed().as_secs_f64()
                ),
            );
        }
    }

    pub(crate) fn unreachable(&self, url: &str, error: &str) {
        let mut inner = self.lock();
        if inner.unreachable.is_none() {
            inner.unreachable = Some(Instant::now());
            Self::say(&mut inner, format!(
                "the service at {url} does not answer ({error}); the program goes on, progress is kept and sent when it answers"
            ));
        }
    }

    pub(crate) fn set_done(&self) {
        let mut inner = self.lock();
        inner.report.done = true;
        self.changed.notify_all();
    }

    pub(crate) fn wait_idle(&self, outbox: &Outbox, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut inner = self.lock();
        loop {
            if outbox.quiet() || inner.report.done {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            // The sender settles the outbox after each round; poll it.
            let wait = (deadline - now).min(Duration::from_millis(20));
            inner = self.changed.wait_timeout(inner, wait).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    pub(crate) fn report(&self) -> Report {
        self.lock().report.clone()
    }
}
