//! `kubectl-kandev`: the kubectl plugin (`kubectl kandev status|resume|restart|prompt|history|
//! complete|cancel|permissions|approve|deny`). All logic lives in `kandev_operator::plugin`; see
//! `kubectl kandev --help`.

fn main() {
    // `process::exit` so the exit code is exactly the documented one (see `run_cli`).
    std::process::exit(kandev_operator::plugin::run_cli());
}
