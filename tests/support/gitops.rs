//! The statuses GitOps tools read: the TaskSessions the operator wrote in an e2e run
//! (`tests/data/gitops/statuses.json`, recorded by `tests/e2e_gitops.rs`) and the verdict table
//! of docs/gitops.md ("Argo CD and kstatus agree") that the health checks must match.

use serde_json::Value;

/// The recorded statuses, relative to the crate.
pub const RECORD: &str = "tests/data/gitops/statuses.json";

fn read(path: &str) -> String {
    let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// The recorded TaskSessions by case, in the order of the record.
pub fn recorded() -> Vec<(String, Value)> {
    let record: Value = serde_json::from_str(&read(RECORD)).expect("the record is JSON");
    record
        .as_array()
        .expect("an array")
        .iter()
        .map(|entry| {
            let case = entry["case"].as_str().expect("case").to_string();
            (case, entry["object"].clone())
        })
        .collect()
}

/// One row of the verdict table: the recorded case, Argo CD's health, kstatus's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub case: String,
    pub argo: String,
    pub kstatus: String,
}

/// The verdict table of docs/gitops.md.
pub fn verdicts() -> Vec<Verdict> {
    let page = read("docs/gitops.md");
    let section = page
        .split("## Argo CD and kstatus agree")
        .nth(1)
        .expect("the verdict section in docs/gitops.md");
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            Verdict {
                case: cells[1].trim_matches('`').to_string(),
                argo: cells[3].to_string(),
                kstatus: cells[4].to_string(),
            }
        })
        .collect()
}

/// kstatus's status that each Argo CD health stands for.
pub fn kstatus_of_argo(health: &str) -> &'static str {
    match health {
        "Healthy" | "Suspended" => "Current",
        "Progressing" => "InProgress",
        "Degraded" => "Failed",
        other => panic!("no kstatus status for Argo CD health {other:?}"),
    }
}
