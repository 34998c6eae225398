//! The service's HTTP routes the connector uses, over a blocking client.
//!
//! Every call answers an [`Answer`] that tells the sender what to do next: a transport failure
//! or a 5xx/429 is worth retrying with the same body (the service's `(worker, seq)` makes a
//! repeated batch harmless), a 4xx is not.

use std::time::Duration;

use serde_json::Value;
use ureq::Agent;

/// The outcome of one call (`T`: what a 2xx carries, the JSON body unless said otherwise).
#[derive(Debug)]
pub enum Answer<T = Value> {
    /// 2xx, with the JSON body (`Null` when empty).
    Ok(T),
    /// The service could not be reached, or answered 5xx or 429: try again later.
    Retry(String),
    /// The service refused the request (4xx): the status and its JSON body.
    Refused(u16, Value),
}

/// A client for one service.
pub struct Client {
    agent: Agent,
    url: String,
}

impl Client {
    /// A client of the service at `url` (e.g. `http://127.0.0.1:8000`), each call bounded by
    /// `timeout`.
    pub fn new(url: &str, timeout: Duration) -> Client {
        let agent: Agent =
            Agent::config_builder().http_status_as_error(false).timeout_global(Some(timeout)).build().into();
        Client { agent, url: url.trim_end_matches('/').to_owned() }
    }

    /// `POST {path}` with a JSON body.
    pub fn post(&self, path: &str, token: &str, body: &Value) -> Answer {
        let request = self
            .agent
            .post(format!("{}{path}", self.url))
            .header("Authorization", format!("Bearer {token}"))
            .content_type("application/json");
        answer(request.send(body.to_string()))
    }

    /// `POST {path}` with a body that is JSON already.
    pub fn post_text(&self, path: &str, token: &str, body: &str) -> Answer {
        let request = self
            .agent
            .post(format!("{}{path}", self.url))
            .header("Authorization", format!("Bearer {token}"))
            .content_type("application/json");
        answer(request.send(body))
    }

    /// `GET {path}`.
    pub fn get(&self, path: &str, token: &str) -> Answer {
        answer(self.agent.get(format!("{}{path}", self.url)).header("Authorization", format!("Bearer {token}")).call())
    }

    /// The service's address, for messages.
    pub fn url(&self) -> &str {
        &self.url
    }
}

fn answer(result: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Answer {
    match result {
        Err(error) => Answer::Retry(error.to_string()),
        Ok(mut response) => {
            let status = response.status().as_u16();
            let text = response.body_mut().read_to_string().unwrap_or_default();
            let body =
                if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) };
            match status {
                200..=299 => Answer::Ok(body),
                429 | 500..=599 => Answer::Retry(format!("HTTP {status}: {body}")),
                _ => Answer::Refused(status, body),
            }
        }
    }
}
