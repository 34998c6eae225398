//! `timely-progress-replay --journal DIR --dataflow ID`: what a program's workers sent to dataflow
//! `ID`, as their journals (`Attach::journal`) recorded it, ready to post to the service again.
//!
//! Prints JSON lines: first `{"registration": BODY}` (the `POST /v1/dataflows` body the connector
//! sent), then one `{"version", "worker", "body"}` per batch, in the service's version order
//! (`body` is the `POST .../progress` body, `seq` numbered afresh per worker). Posting them to a
//! new registration reproduces every state the service passed through; a journal edited first
//! shows what the service makes of a program that sent the edit. Exits 2 on bad arguments or a
//! journal that cannot be read.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let usage = "usage: timely-progress-replay --journal DIR --dataflow ID";
    let mut args = std::env::args().skip(1);
    let (mut journal, mut dataflow) = (None, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--journal" => journal = args.next().map(PathBuf::from),
            "--dataflow" => dataflow = args.next(),
            _ => {
                eprintln!("{usage}");
                return ExitCode::from(2);
            }
        }
    }
    let (Some(journal), Some(dataflow)) = (journal, dataflow) else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };
    let mut paths: Vec<PathBuf> = match std::fs::read_dir(&journal) {
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
    let mut journals = Vec::new();
    for path in paths {
        match std::fs::read_to_string(&path) {
            Ok(text) => journals.push(text),
            Err(e) => {
                eprintln!("cannot read {}: {e}", path.display());
                return ExitCode::from(2);
            }
        }
    }
    match timely_progress_service::replay::service_batches(&journals, &dataflow) {
        Ok((registration, batches)) => {
            println!("{}", serde_json::json!({ "registration": registration }));
            for batch in batches {
                println!("{}", serde_json::to_string(&batch).expect("a batch serializes"));
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{}: {error}", journal.display());
            ExitCode::from(2)
        }
    }
}
