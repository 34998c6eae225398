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

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::{Answer, Client};
use crate::graph::DataflowGraph;
use crate::journal::Journal;
use crate::mapping::{add_raw, batch_body, split, Counts, Mapper, RawKey, TimeKey};
use crate::outbox::{Message, Outbox};
use crate::rendezvous::register;
use crate::stats::{post_activity, DataflowActivity};
use crate::{Settings, Status};

/// Updates per batch at most; the service refuses bodies over 1 MiB by default.
const BATCH_LIMIT: usize = 5_000;

/// Where a dataflow's batches go: not known yet, known, or nowhere any more.
pub(crate) enum Endpoint {
    Pending,
    Ready { id: String, token: String },
    Failed,
}

/// One batch (or part of a split one), numbered, its body fixed until acknowledged.
pub(crate) struct Part {
    seq: u64,
    body: String,
    updates: usize,
    index: usize,
    of: usize,
    raw: Option<Counts<RawKey>>,
}

/// One dataflow as its worker's sender handles it.
pub(crate) struct Tracked {
    pub(crate) graph: DataflowGraph,
    pub(crate) mapper: Mapper,
    pub(crate) endpoint: Endpoint,
    pub(crate) seq: u64,
    pub(crate) pending: Counts<RawKey>,
    pub(crate) in_flight: VecDeque<Part>,
    pub(crate) retry_at: Option<Instant>,
    pub(crate) backoff: Duration,
    pub(crate) since: Instant,
    pub(crate) said_waiting: bool,
    /// Worker 0: the ids registered under this name before its first attempt, so that an
    /// attempt whose answer was lost is found rather than repeated.
    pub(crate) before: Option<Vec<String>>,
    /// Statistics not yet acknowledged (intervals merged), and whether the service refused them.
    pub(crate) activity: Option<DataflowActivity>,
    pub(crate) activity_refused: bool,
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
        // Statistics after the rest: a dataflow registered in the same take is known by then.
        let (activity, messages): (Vec<Message>, Vec<Message>) =
            messages.into_iter().partition(|m| matches!(m, Message::Activity(_)));
        for message in messages.into_iter().chain(activity) {
            receive(message, &mut tracked, &status);
        }
        for t in tracked.iter_mut() {
            if t.retry_at.is_some_and(|at| at > Instant::now()) {
                continue;
            }
            t.retry_at = None;
            advance(t, &client, &settings, &status, journal.as_mut());
            if t.retry_at.is_none() {
                post_activity(t, &client, &settings, &status);
            }
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
                pending: Counts::default(),
                in_flight: VecDeque::new(),
                retry_at: None,
                backoff: Duration::from_millis(50),
                since: Instant::now(),
                said_waiting: false,
                before: None,
                activity: None,
                activity_refused: false,
            });
        }
        Message::Sends(sends) => {
            // Updates of one scope come in runs: look its dataflow up once per run.
            let mut route: Option<(usize, Option<usize>)> = None;
            let mut counts = vec![0; tracked.len()];
            for (identifier, node, port, source, time, delta) in sends.iter() {
                let target = match route {
                    Some((known, target)) if known == identifier => target,
                    _ => {
                        let target = tracked.iter().position(|t| live(t) && t.mapper.knows(identifier));
                        route = Some((identifier, target));
                        target
                    }
                };
                if let Some(i) = target {
                    add_raw(
                        &mut tracked[i].pending,
                        RawKey { identifier, node, port, source, time: TimeKey::new(time) },
                        delta,
                    );
                    counts[i] += 1;
                }
            }
            for (t, count) in tracked.iter().zip(counts).filter(|(_, count)| *count > 0) {
                status.received(&t.graph.name, count);
            }
        }
        Message::Folded(folded) => {
            for (key, delta) in folded {
                if let Some(t) = tracked.iter_mut().find(|t| live(t) && t.mapper.knows(key.identifier)) {
                    add_raw(&mut t.pending, key, delta);
                }
            }
        }
        Message::Activity(activity) => {
            for (dataflow, counted) in activity {
                if let Some(t) = tracked.iter_mut().find(|t| live(t) && t.graph.dataflow == dataflow) {
                    if !t.activity_refused {
                        t.activity.get_or_insert_with(DataflowActivity::default).merge(counted);
                    }
                }
            }
        }
    }
}

fn live(t: &Tracked) -> bool {
    !matches!(t.endpoint, Endpoint::Failed)
}

pub(crate) fn retry_later(t: &mut Tracked, status: &Status, client: &Client, error: String) {
    status.unreachable(client.url(), &error);
    t.retry_at = Some(Instant::now() + t.backoff);
    t.backoff = (t.backoff * 2).min(Duration::from_secs(2));
}

pub(crate) fn fail(t: &mut Tracked, status: &Status, reason: String) {
    status.failed(&t.graph.name, reason);
    t.endpoint = Endpoint::Failed;
    t.pending.clear();
    t.in_flight.clear();
}

/// Moves one dataflow as far as it goes now: registration, then batches until none is left.
fn advance(t: &mut Tracked, client: &Client, settings: &Settings, status: &Status, mut journal: Option<&mut Journal>) {
    if matches!(t.endpoint, Endpoint::Pending) && settings.offline {
        t.endpoint = Endpoint::Ready { id: "offline".into(), token: String::new() };
    }
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
            let mut mapped = Counts::default();
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
                let body = batch_body(&t.graph, &format!("w{}", settings.worker), t.seq, &part);
                let updates = part.len();
                let last = index + 1 == of;
                t.in_flight.push_back(Part {
                    seq: t.seq,
                    body,
                    updates,
                    index,
                    of,
                    raw: if last { raw.take() } else { None },
                });
                t.seq += 1;
            }
        }
        let Some(part) = t.in_flight.front() else { return };
        let answer = if settings.offline {
            Answer::Ok(serde_json::json!({"version": part.seq}))
        } else {
            client.post_text(&path, &token, &part.body)
        };
        match answer {
            Answer::Ok(answer) => {
                let duplicate = answer["duplicate"].as_bool().unwrap_or(false);
                let version = if duplicate { None } else { answer["version"].as_u64() };
                let updates = part.updates;
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

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;

    use super::*;
    use crate::graph::{Node, Scope};
    use crate::time::ScopeKind;

    /// A service answering each connection from a script (`None`: drop it after reading the
    /// request, as if the answer were lost); answers the request lines and bodies it received.
    pub(crate) fn scripted_service(
        script: Vec<Option<&'static str>>,
    ) -> (String, std::thread::JoinHandle<Vec<(String, String)>>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        let handle = std::thread::spawn(move || {
            let mut requests = Vec::new();
            for answer in script {
                let (mut stream, _) = listener.accept().expect("a connection");
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let (mut first, mut length) = (String::new(), 0);
                reader.read_line(&mut first).expect("a request line");
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).expect("a header");
                    if line.to_ascii_lowercase().starts_with("content-length:") {
                        length = line[15..].trim().parse().expect("a length");
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body).expect("a body");
                requests.push((first.trim().to_owned(), String::from_utf8(body).expect("utf-8")));
                if let Some(answer) = answer {
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        answer.len()
                    );
                    stream
                        .write_all(head.as_bytes())
                        .and_then(|()| stream.write_all(answer.as_bytes()))
                        .expect("an answer");
                }
            }
            requests
        });
        (url, handle)
    }

    pub(crate) fn tracked(endpoint: Endpoint) -> Tracked {
        let node =
            Node { index: 1, name: "Input".into(), inputs: 0, outputs: 1, connections: Some(vec![]), scope: None };
        let root = Scope {
            identifier: 3,
            addr: vec![0],
            parent: None,
            kind: ScopeKind::Root,
            arity: 1,
            nodes: vec![node],
            edges: vec![],
        };
        let graph = DataflowGraph { name: "g".into(), dataflow: 0, peers: 1, scopes: vec![root] };
        Tracked {
            mapper: Mapper::new(&graph),
            graph,
            endpoint,
            seq: 0,
            pending: Counts::default(),
            in_flight: VecDeque::new(),
            retry_at: None,
            backoff: Duration::from_millis(1),
            since: Instant::now(),
            said_waiting: false,
            before: None,
            activity: None,
            activity_refused: false,
        }
    }

    pub(crate) fn settings(url: &str, worker: usize) -> Settings {
        Settings {
            url: url.to_owned(),
            token: "program".into(),
            worker,
            generation: 0,
            linger: Duration::ZERO,
            request_timeout: Duration::from_secs(5),
            finish_timeout: Duration::from_secs(5),
            journal: None,
            find_by_name: false,
            offline: false,
        }
    }

    #[test]
    fn a_batch_is_retried_with_its_seq_and_body_until_acknowledged() {
        let (url, service) = scripted_service(vec![
            None,
            Some(r#"{"applied":false,"duplicate":true,"version":4}"#),
            Some(r#"{"applied":true,"duplicate":false,"version":5}"#),
        ]);
        let mut t = tracked(Endpoint::Ready { id: "abc".into(), token: "tok".into() });
        t.pending.insert(RawKey { identifier: 3, node: 1, port: 0, source: true, time: TimeKey::new(&[0]) }, -1);
        let (settings, status) = (settings(&url, 2), Status::new(2));
        let client = Client::new(&url, Duration::from_secs(5));
        advance(&mut t, &client, &settings, &status, None);
        assert!(t.retry_at.is_some() && t.in_flight.len() == 1, "the lost answer means: try again");
        // Progress arriving meanwhile waits behind the batch in flight, it does not join it.
        t.pending.insert(RawKey { identifier: 3, node: 1, port: 0, source: true, time: TimeKey::new(&[1]) }, 1);
        advance(&mut t, &client, &settings, &status, None);
        let bodies: Vec<String> = service.join().expect("the fake service").into_iter().map(|(_, b)| b).collect();
        assert_eq!(bodies[0], bodies[1], "the same batch, byte for byte");
        assert!(bodies[0].contains(r#""seq":0"#) && bodies[0].contains(r#""worker":"w2""#), "{}", bodies[0]);
        assert!(bodies[2].contains(r#""seq":1"#) && bodies[2].contains(r#""time":[1]"#), "{}", bodies[2]);
        assert_eq!((t.seq, t.in_flight.len(), t.pending.len()), (2, 0, 0));
        assert_eq!(status.report().dataflows[0].last_version, Some(5));
        let notes = status.report().notes;
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].contains("does not answer") && notes[1].contains("answers again"), "{notes:?}");
    }

    #[test]
    fn a_registration_whose_answer_was_lost_is_found_not_repeated() {
        let (url, service) =
            scripted_service(vec![Some(r#"[{"id":"old"}]"#), None, Some(r#"[{"id":"old"},{"id":"new"}]"#)]);
        let mut t = tracked(Endpoint::Pending);
        t.graph.name = format!("lost-answer-{}", std::process::id());
        let (settings, status) = (settings(&url, 0), Status::new(0));
        let client = Client::new(&url, Duration::from_secs(5));
        assert!(!crate::rendezvous::register(&mut t, &client, &settings, &status, None));
        assert!(crate::rendezvous::register(&mut t, &client, &settings, &status, None));
        let requests = service.join().expect("the fake service");
        let lines: Vec<&str> = requests.iter().map(|(line, _)| line.split(' ').next().unwrap_or_default()).collect();
        assert_eq!(lines, ["GET", "POST", "GET"], "{requests:?}");
        assert!(matches!(&t.endpoint, Endpoint::Ready { id, token } if id == "new" && token == "program"));
    }
}
