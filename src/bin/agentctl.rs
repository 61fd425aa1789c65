//! `agentctl`: the in-pod supervisor of one coding agent. All logic lives in
//! `kandev_operator::agentctl`; see `agentctl --help`.

fn main() {
    // `process::exit` on purpose: see `run_cli` (a blocking stdin read must not keep us alive).
    std::process::exit(kandev_operator::agentctl::run_cli());
}
