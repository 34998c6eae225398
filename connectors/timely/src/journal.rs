//! An optional record of what the connector sent, for checking the service against timely.
//!
//! With [`Attach::journal`](crate::Attach::journal), each worker's sender writes
//! `<dir>/w<index>.jsonl`: one line per registered dataflow (its graph as the connector built
//! it) and one per batch the service acknowledged, with the service's version and the raw
//! updates (as timely sent them, consolidated) the batch carried. [`crate::replay`] feeds those
//! raw updates to timely's own `reachability::Tracker`s in the service's order and compares
//! every version's frontiers. Writing it costs the sender thread, never the worker.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use serde_json::json;

use crate::graph::DataflowGraph;
use crate::mapping::{Counts, RawKey};
use crate::Status;

/// One worker's journal file.
pub(crate) struct Journal {
    out: BufWriter<File>,
}

impl Journal {
    pub(crate) fn open(dir: &Path, worker: usize, status: &Status) -> Option<Journal> {
        let path = dir.join(format!("w{worker}.jsonl"));
        match std::fs::create_dir_all(dir).and_then(|()| File::create(&path)) {
            Ok(file) => Some(Journal { out: BufWriter::new(file) }),
            Err(error) => {
                status.note(format!("cannot write the journal {}: {error}", path.display()));
                None
            }
        }
    }

    fn line(&mut self, value: serde_json::Value) {
        // A journal that cannot be written only loses the check, never the progress.
        let _ = writeln!(self.out, "{value}").and_then(|()| self.out.flush());
    }

    pub(crate) fn registered(&mut self, id: &str, worker: usize, graph: &DataflowGraph) {
        self.line(json!({"registered": {"id": id, "worker": worker, "graph": graph}}));
    }

    /// A batch: `seq` and `version` are `None` for raw updates that mapped to nothing (they
    /// belong just before the worker's next batch); `part` is `(index, of)` when a batch was
    /// split, and the raw updates ride on its last part.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn batch(
        &mut self,
        id: &str,
        worker: usize,
        seq: Option<u64>,
        version: Option<u64>,
        part: (usize, usize),
        updates: usize,
        raw: Option<&Counts<RawKey>>,
    ) {
        let raw: Vec<_> = raw
            .map(|raw| {
                raw.iter().map(|(k, d)| json!([k.identifier, k.node, k.port, k.source, k.time.as_slice(), d])).collect()
            })
            .unwrap_or_default();
        self.line(json!({"batch": {"id": id, "worker": worker, "seq": seq, "version": version,
                                   "part": [part.0, part.1], "updates": updates, "raw": raw}}));
    }
}
