//! The background thread of one worker: registration, batching, exactly-once delivery.
//!
//! It takes what the worker queued, consolidates each dataflow's raw updates, maps them to the
//! service's locations ([`crate::mapping`]) and posts them as that worker's batches, numbered
//! 0, 1, 2, ... per dataflow. A batch keeps its number and body until the service acknowledges
//! it, however many times it is retried, so a batch applied whose answer was lost is only
//! acknowledged again as a duplicate. While the service cannot be reached, updates keep being
//! consolidated (bounded by the live pointstamps, not by time) and go out in the first batch
//! after it answers again: the service's view skips the outage's intermediate states and
//! resumes exactly where timely is.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::client::{Answer, Client};
use crate::graph::DataflowGraph;
use crate::journal::Journal;
use crate::mapping::{split, updates_json, Mapper, RawKey};
use crate::outbox::{Message, Outbox};
use crate::{Settings, Status};

/// Updates per batch at most; the service refuses bodies over 1 MiB by default.
const BATCH_LIMIT: usize = 5_000;

type Outcome = Result<(String, String), String>;

/// `(name, generation, dataflow index)` to the outcome, and a signal when one is published.
type Slots = (Mutex<HashMap<(String, usize, usize), Outcome>>, Condvar);

/// Where workers of this process meet the registration worker 0 made: `(name, generation,
/// dataflow index)` to the dataflow's id and token, or why it was refused.
fn rendezvous() -> &'static Slots {
    static SLOTS: OnceLock<Slots> = OnceLock::new();
    SLOTS.get_or_init(Default::default)
}

enum Endpoint {
    Pending,
    Ready { id: String, token: String },
    Failed,
}

struct Part {
    seq: u64,
    body: Value,
    index: usize,
    of: usize,
    raw: Option<HashMap<RawKey, i64>>,
}

struct Tracked {
    graph: DataflowGraph,
    mapper: Mapper,
    endpoint: Endpoint,
    seq: u64,
    pending: HashMap<RawKey, i64>,
    in_flight: VecDeque<Part>,
    retry_at: Option<Instant>,
    backoff: Duration,
    since: Instant,
    said_waiting: bool,
}

impl Tracked {
    fn idle(&self) -> bool {
        matches!(self.endpoint, Endpoint::Failed) || (self.pending.is_empty() && self.in_flight.is_empty())
    }
}

/// The sender's loop; returns when the worker is gone and everything is delivered, or the
/// finishing deadline passed.
pub(crate) fn run(outbox: Arc<Outbox>, settings: Arc<Settings>, status: Arc<Status>) {
    let client = Client::new(&settings.url, settings.request_timeout);
    let mut journal = settings.journal.as_ref().and_then(|dir| Journal::open(dir, settings.worker, &status));
    let mut tracked: Vec<Tracked> = Vec::new();
    let mut closed_at: Option<Instant> = None;
    loop {
        let deadline = tracked.iter().filter_map(|t| t.retry_at).min();
        let (messages, closed) =
            outbox.take(deadline, if closed_at.is_some() { Duration::ZERO } else { settings.linger });
        if closed && closed_at.is_none() {
            closed_at = Some(Instant::now());
        }
        for message in messages {
            receive(message, &mut tracked, &status);
        }
        for t in tracked.iter_mut() {
            if t.retry_at.is_some_and(|at| at > Instant::now()) {
                continue;
            }
            t.retry_at = None;
            advance(t, &client, &settings, &status, journal.as_mut());
        }
        outbox.settle(tracked.iter().all(Tracked::idle));
        if let Some(closed_at) = closed_at {
            if tracked.iter().all(Tracked::idle) && outbox.is_empty() {
                break;
            }
            if closed_at.elapsed() > settings.finish_timeout {
                let left: usize =
                    tracked.iter().filter(|t| !t.idle()).map(|t| t.pending.len() + t.in_flight.len()).sum();
                status.note(format!(
                    "gave up after {:?}: {left} pending update groups not delivered to {}",
                    settings.finish_timeout,
                    client.url()
                ));
                break;
            }
        }
    }
    let folded = outbox.folded();
    if folded > 0 {
        status.note(format!("{folded} updates were folded while the sender was behind (nothing lost)"));
    }
    status.set_done();
}

fn receive(message: Message, tracked: &mut Vec<Tracked>, status: &Status) {
    match message {
        Message::Register(graph) => {
            status.registering(&graph.name);
            tracked.push(Tracked {
                mapper: Mapper::new(&graph),
                graph: *graph,
                endpoint: Endpoint::Pending,
                seq: 0,
                pending: HashMap::new(),
                in_flight: VecDeque::new(),
                retry_at: None,
                backoff: Duration::from_millis(50),
                since: Instant::now(),
                said_waiting: false,
            });
        }
        Message::Sends(sends) => {
            for send in sends {
                let mut live = tracked.iter_mut().filter(|t| !matches!(t.endpoint, Endpoint::Failed));
                if let Some(t) = live.find(|t| t.mapper.knows(send.identifier)) {
                    crate::mapping::consolidate_into(&send, &mut t.pending);
                    status.received(&t.graph.name, send.updates.len());
                }
            }
        }
        Message::Folded(folded) => {
            for (key, delta) in folded {
                let mut live = tracked.iter_mut().filter(|t| !matches!(t.endpoint, Endpoint::Failed));
                if let Some(t) = live.find(|t| t.mapper.knows(key.identifier)) {
                    let count = t.pending.entry(key.clone()).or_insert(0);
                    *count += delta;
                    if *count == 0 {
                        t.pending.remove(&key);
                    }
                }
            }
        }
    }
}

fn retry_later(t: &mut Tracked, status: &Status, client: &Client, error: String) {
    status.unreachable(client.url(), &error);
    t.retry_at = Some(Instant::now() + t.backoff);
    t.backoff = (t.backoff * 2).min(Duration::from_secs(2));
}

fn fail(t: &mut Tracked, status: &Status, reason: String) {
    status.failed(&t.graph.name, reason);
    t.endpoint = Endpoint::Failed;
    t.pending.clear();
    t.in_flight.clear();
}

/// Moves one dataflow as far as it goes now: registration, then batches until none is left.
fn advance(t: &mut Tracked, client: &Client, settings: &Settings, status: &Status, mut journal: Option<&mut Journal>) {
    if matches!(t.endpoint, Endpoint::Pending) && !register(t, client, settings, status, journal.as_deref_mut()) {
        return;
    }
    let Endpoint::Ready { id, token } = &t.endpoint else { return };
    let (id, token) = (id.clone(), token.clone());
    let path = format!("/v1/dataflows/{id}/progress");
    loop {
        if t.in_flight.is_empty() {
            if t.pending.is_empty() {
                return;
            }
            let raw = std::mem::take(&mut t.pending);
            let mut mapped = HashMap::new();
            t.mapper.map(&raw, &mut mapped);
            if let Some(what) = t.mapper.first_dropped.take() {
                status.note(format!(
                    "{}: dropping updates at ports the registration does not have (first: {what}); they hold no other location back",
                    t.graph.name
                ));
            }
            if mapped.is_empty() {
                if let Some(j) = journal.as_deref_mut() {
                    j.batch(&id, settings.worker, None, None, (0, 1), 0, Some(&raw));
                }
                continue;
            }
            let parts = split(mapped, BATCH_LIMIT);
            let of = parts.len();
            let mut raw = Some(raw);
            for (index, part) in parts.into_iter().enumerate() {
                let body = json!({"worker": format!("w{}", settings.worker), "seq": t.seq, "updates": updates_json(&t.graph, &part)});
                let last = index + 1 == of;
                t.in_flight.push_back(Part { seq: t.seq, body, index, of, raw: if last { raw.take() } else { None } });
                t.seq += 1;
            }
        }
        let Some(part) = t.in_flight.front() else { return };
        match client.post(&path, &token, &part.body) {
            Answer::Ok(answer) => {
                let duplicate = answer["duplicate"].as_bool().unwrap_or(false);
                let version = if duplicate { None } else { answer["version"].as_u64() };
                let updates = part.body["updates"].as_array().map_or(0, Vec::len);
                if let Some(j) = journal.as_deref_mut() {
                    j.batch(
                        &id,
                        settings.worker,
                        Some(part.seq),
                        version,
                        (part.index, part.of),
                        updates,
                        part.raw.as_ref(),
                    );
                }
                status.delivered(&t.graph.name, updates, answer["version"].as_u64());
                t.in_flight.pop_front();
                t.backoff = Duration::from_millis(50);
            }
            Answer::Retry(error) => return retry_later(t, status, client, error),
            Answer::Refused(code, body) => {
                return fail(t, status, format!("progress refused with HTTP {code}: {body}"));
            }
        }
    }
}

/// Worker 0 registers; the others wait for its outcome. Answers whether the endpoint is ready.
fn register(
    t: &mut Tracked,
    client: &Client,
    settings: &Settings,
    status: &Status,
    journal: Option<&mut Journal>,
) -> bool {
    let key = (t.graph.name.clone(), settings.generation, t.graph.dataflow);
    let (slots, published) = rendezvous();
    if settings.worker == 0 {
        match client.post("/v1/dataflows", &settings.token, &t.graph.registration()) {
            Answer::Ok(answer) => {
                let (Some(id), Some(token)) = (answer["id"].as_str(), answer["token"].as_str()) else {
                    fail(t, status, format!("the registration's answer has no id and token: {answer}"));
                    return false;
                };
                t.endpoint = Endpoint::Ready { id: id.to_owned(), token: token.to_owned() };
                slots.lock().unwrap_or_else(|p| p.into_inner()).insert(key, Ok((id.to_owned(), token.to_owned())));
            }
            Answer::Retry(error) => {
                retry_later(t, status, client, error);
                return false;
            }
            Answer::Refused(code, body) => {
                let reason = format!("registration refused with HTTP {code}: {body}");
                slots.lock().unwrap_or_else(|p| p.into_inner()).insert(key, Err(reason.clone()));
                published.notify_all();
                fail(t, status, reason);
                return false;
            }
        }
        published.notify_all();
    } else {
        let found = slots.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned();
        match found {
            Some(Ok((id, token))) => t.endpoint = Endpoint::Ready { id, token },
            Some(Err(reason)) => {
                fail(t, status, format!("worker 0 could not register it: {reason}"));
                return false;
            }
            None if settings.find_by_name && t.since.elapsed() > Duration::from_secs(2) => {
                match find_by_name(client, &settings.token, &t.graph.name) {
                    Some(id) => t.endpoint = Endpoint::Ready { id, token: settings.token.clone() },
                    None => {
                        t.retry_at = Some(Instant::now() + Duration::from_millis(200));
                        return false;
                    }
                }
            }
            None => {
                if !t.said_waiting && t.since.elapsed() > Duration::from_secs(10) {
                    t.said_waiting = true;
                    status.note(format!(
                        "{}: still waiting for worker 0 of this process to register it; workers in other processes \
                         than worker 0 need Attach::find_by_name",
                        t.graph.name
                    ));
                }
                t.retry_at = Some(Instant::now() + Duration::from_millis(20));
                return false;
            }
        }
    }
    if let (Some(j), Endpoint::Ready { id, .. }) = (journal, &t.endpoint) {
        j.registered(id, settings.worker, &t.graph);
    }
    status.registered(
        &t.graph.name,
        match &t.endpoint {
            Endpoint::Ready { id, .. } => id,
            _ => "",
        },
    );
    true
}

/// The newest live dataflow registered under `name` (for workers in other processes than
/// worker 0), with the admin token.
fn find_by_name(client: &Client, admin: &str, name: &str) -> Option<String> {
    let path = format!("/v1/dataflows?name={}", encode(name));
    match client.get(&path, admin) {
        Answer::Ok(Value::Array(list)) => list.last().and_then(|d| d["id"].as_str()).map(str::to_owned),
        _ => None,
    }
}

fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
