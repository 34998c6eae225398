//! What every example shares: its options, attaching, and reporting at the end.
//!
//! Options (beside timely's own, e.g. `-w 4`): `--name NAME` (default: the example's name),
//! `--journal DIR` (record what was sent, for `timely-progress-check`), `--detached` (run
//! without the connector, to measure its overhead), `--logging-only` (no connector, but
//! timely's logging turned on as attaching does, with loggers that do nothing: the share of
//! the overhead that is timely's own), `--without-service` (the connector without its requests, built
//! with the feature `bench`: the connector's own share), `--declared-only` (the connector maps only
//! the three time types the examples use, as `--logging-only` registers them: what the default's
//! other types cost), `--linger-ms N` (`Attach::linger`), `--statistics-ms N` (`Attach::statistics`:
//! busy time per operator and records per channel, every N ms), `--find-by-name` (for timely clusters of
//! several processes, `-n`/`-p`), and the example's numeric arguments as `--KEY VALUE`; timely's
//! own options (`-w`, `-n`, `-p`, `-h`, `--progress-mode eager|demand`) go to timely. The service
//! is `TRACKER_URL` (default `http://127.0.0.1:8000`) with the program token
//! `TRACKER_PROGRAM_TOKEN` (the service generates it into `<warehouse>/program-token`).

#![allow(dead_code)]

use std::collections::HashMap;
use std::time::Instant;

use timely::logging::{TimelyEventBuilder, TimelyProgressEventBuilder, TimelySummaryEventBuilder};
use timely::logging_core::Registry;
use timely::order::Product;
use timely::progress::Timestamp;
use timely::worker::Worker;
use timely_progress_service::{Attach, Attached};

/// Parsed command line: the example's options and what goes to timely.
pub struct Options {
    pub name: String,
    pub journal: Option<String>,
    pub detached: bool,
    pub logging_only: bool,
    pub without_service: bool,
    pub declared_only: bool,
    pub find_by_name: bool,
    pub numbers: HashMap<String, u64>,
    pub timely: Vec<String>,
    pub url: String,
    pub token: String,
}

impl Options {
    pub fn parse(example: &str) -> Options {
        let mut options = Options {
            name: example.to_owned(),
            journal: None,
            detached: false,
            logging_only: false,
            without_service: false,
            declared_only: false,
            find_by_name: false,
            numbers: HashMap::new(),
            timely: Vec::new(),
            url: std::env::var("TRACKER_URL").unwrap_or_else(|_| "http://127.0.0.1:8000".into()),
            token: std::env::var("TRACKER_PROGRAM_TOKEN").unwrap_or_default(),
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--name" => options.name = args.next().expect("--name NAME"),
                "--journal" => options.journal = Some(args.next().expect("--journal DIR")),
                "--detached" => options.detached = true,
                "--logging-only" => options.logging_only = true,
                "--without-service" => options.without_service = true,
                "--declared-only" => options.declared_only = true,
                "--find-by-name" => options.find_by_name = true,
                "-w" | "-n" | "-p" | "-h" | "--workers" | "--processes" | "--process" | "--hostfile"
                | "--progress-mode" => {
                    options.timely.push(arg);
                    options.timely.extend(args.next());
                }
                key if key.starts_with("--") => {
                    let value = args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{key} NUMBER"));
                    options.numbers.insert(key[2..].to_owned(), value);
                }
                _ => options.timely.push(arg),
            }
        }
        options
    }

    pub fn number(&self, key: &str, default: u64) -> u64 {
        self.numbers.get(key).copied().unwrap_or(default)
    }

    /// Attaches `worker` unless `--detached` or `--logging-only`.
    pub fn attach(&self, worker: &mut Worker) -> Option<Attached> {
        if self.logging_only {
            let mut registry = worker.log_register().expect("a registry");
            registry.insert::<TimelyEventBuilder, _>("timely", |_, _| {});
            nothing::<u64>(&mut registry);
            nothing::<Product<u64, u32>>(&mut registry);
            nothing::<Product<u64, u64>>(&mut registry);
        }
        if self.detached || self.logging_only {
            return None;
        }
        let mut attach = Attach::new(&self.url, &self.token, &self.name).find_by_name(self.find_by_name);
        if let Some(dir) = &self.journal {
            attach = attach.journal(dir);
        }
        #[cfg(feature = "bench")]
        if self.without_service {
            attach = attach.without_service();
        }
        #[cfg(not(feature = "bench"))]
        assert!(!self.without_service, "--without-service needs the crate's feature `bench`");
        if self.declared_only {
            attach = attach
                .declared_timestamps_only()
                .timestamp::<u64>()
                .timestamp::<Product<u64, u32>>()
                .timestamp::<Product<u64, u64>>();
        }
        if let Some(ms) = self.numbers.get("linger-ms") {
            attach = attach.linger(std::time::Duration::from_millis(*ms));
        }
        if let Some(ms) = self.numbers.get("statistics-ms") {
            attach = attach.statistics(std::time::Duration::from_millis(*ms));
        }
        Some(attach.attach(worker).expect("attach"))
    }

    /// Waits for every worker's last batches and prints what was sent, then the run time.
    pub fn finish(&self, started: Instant, attached: Vec<Result<Option<Attached>, String>>) {
        let ran = started.elapsed();
        for result in attached {
            if let Some(attached) = result.expect("a worker failed") {
                eprint!("{}", attached.finish());
            }
        }
        println!("elapsed_seconds {:.6}", ran.as_secs_f64());
    }
}

/// Loggers that do nothing, under the names the connector uses for time `T`.
fn nothing<T: Timestamp>(registry: &mut Registry) {
    let name = std::any::type_name::<T>();
    registry.insert::<TimelyProgressEventBuilder<T>, _>(&format!("timely/progress/{name}"), |_, _| {});
    registry.insert::<TimelySummaryEventBuilder<T::Summary>, _>(&format!("timely/summary/{name}"), |_, _| {});
}
