//! `timely-progress-check --journal DIR --history FILE`: checks a dataflow's published
//! frontiers, version by version, against timely's own trackers fed what the workers sent.
//!
//! `DIR` holds the workers' journals (`Attach::journal`); `FILE` is a JSON object with the
//! dataflow's `id`, the `snapshot` of `GET .../frontier?version=0` and the `changes` events of
//! its SSE stream after version 0. Prints the report as JSON; exits 1 unless every version
//! matched and every frontier ended empty, 2 on bad arguments.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut journal, mut history) = (None, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--journal" => journal = args.next().map(PathBuf::from),
            "--history" => history = args.next().map(PathBuf::from),
            _ => {
                eprintln!("usage: timely-progress-check --journal DIR --history FILE");
                return ExitCode::from(2);
            }
        }
    }
    let (Some(journal), Some(history)) = (journal, history) else {
        eprintln!("usage: timely-progress-check --journal DIR --history FILE");
        return ExitCode::from(2);
    };
    let mut journals = Vec::new();
    let mut paths: Vec<_> = match std::fs::read_dir(&journal) {
        Ok(dir) => dir
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
            .collect(),
        Err(e) => {
            eprintln!("cannot read {}: {e}", journal.display());
            return ExitCode::from(2);
        }
    };
    paths.sort();
    for path in paths {
        match std::fs::read_to_string(&path) {
            Ok(text) => journals.push(text),
            Err(e) => {
                eprintln!("cannot read {}: {e}", path.display());
                return ExitCode::from(2);
            }
        }
    }
    let history: serde_json::Value = match std::fs::read_to_string(&history)
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
    {
        Ok(value) => value,
        Err(e) => {
            eprintln!("cannot read {}: {e}", history.display());
            return ExitCode::from(2);
        }
    };
    let id = history["id"].as_str().unwrap_or_default();
    let changes = history["changes"].as_array().cloned().unwrap_or_default();
    let report = timely_progress_service::replay::check(&journals, id, &history["snapshot"], &changes);
    println!("{}", serde_json::to_string(&report).expect("a report serializes"));
    if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
