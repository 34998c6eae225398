//! Where the workers of one dataflow meet: worker 0 registers it, the others take its answer.
//!
//! In one process (timely's `Config::process(n)`, the common case), the other workers read
//! worker 0's outcome from a process-wide table keyed by the dataflow's name, the attach's
//! generation (the how-many-th attach under that name this worker makes, so that successive
//! runs in one process never meet a previous run's dataflow) and the dataflow index; they post
//! with the dataflow's own token. Workers in other processes can instead look the name up in
//! the service with the program token (`Attach::find_by_name`), taking the newest live dataflow
//! of that name: names must then be unique per run.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::client::{Answer, Client};
use crate::journal::Journal;
use crate::sender::{fail, retry_later, Endpoint, Tracked};
use crate::{Settings, Status};

type Outcome = Result<(String, String), String>;

/// `(name, generation, dataflow index)` to the outcome, and a signal when one is published.
type Slots = (Mutex<HashMap<(String, usize, usize), Outcome>>, Condvar);

/// Where workers of this process meet the registration worker 0 made: `(name, generation,
/// dataflow index)` to the dataflow's id and token, or why it was refused.
fn rendezvous() -> &'static Slots {
    static SLOTS: OnceLock<Slots> = OnceLock::new();
    SLOTS.get_or_init(Default::default)
}

/// Worker 0 registers; the others wait for its outcome. Answers whether the endpoint is ready.
pub(crate) fn register(
    t: &mut Tracked,
    client: &Client,
    settings: &Settings,
    status: &Status,
    journal: Option<&mut Journal>,
) -> bool {
    let key = (t.graph.name.clone(), settings.generation, t.graph.dataflow);
    let (slots, published) = rendezvous();
    if settings.worker == 0 {
        let outcome = match registered_by_name(client, &settings.token, &t.graph.name) {
            // A registration is not idempotent: an earlier attempt whose answer was lost may
            // have been applied. Its dataflow is the one that was not there before the first.
            Answer::Ok(ids) => match &t.before {
                None => {
                    t.before = Some(ids);
                    client.post("/v1/dataflows", &settings.token, &t.graph.registration())
                }
                Some(before) => match ids.iter().find(|id| !before.contains(id)) {
                    Some(id) => Answer::Ok(serde_json::json!({"id": id, "token": settings.token})),
                    None => client.post("/v1/dataflows", &settings.token, &t.graph.registration()),
                },
            },
            Answer::Retry(error) => Answer::Retry(error),
            Answer::Refused(code, body) => Answer::Refused(code, body),
        };
        match outcome {
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

/// The live dataflows registered under `name`, oldest first (the answer's JSON is the list of
/// their ids).
fn registered_by_name(client: &Client, token: &str, name: &str) -> Answer<Vec<String>> {
    match client.get(&format!("/v1/dataflows?name={}", encode(name)), token) {
        Answer::Ok(Value::Array(list)) => {
            Answer::Ok(list.iter().filter_map(|d| d["id"].as_str().map(str::to_owned)).collect())
        }
        Answer::Ok(other) => Answer::Retry(format!("unexpected listing: {other}")),
        Answer::Retry(error) => Answer::Retry(error),
        Answer::Refused(code, body) => Answer::Refused(code, body),
    }
}

/// The newest live dataflow registered under `name` (for workers in other processes than
/// worker 0), with the program token (which lists only the dataflows it registered).
fn find_by_name(client: &Client, token: &str, name: &str) -> Option<String> {
    match registered_by_name(client, token, name) {
        Answer::Ok(ids) => ids.last().cloned(),
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
