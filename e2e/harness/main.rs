//! e2e harness: plays the container for kwok pods (being written).
fn main() {}
