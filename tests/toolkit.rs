//! The offline parts of the e2e toolkit (`tests/e2e_support/`), checked without a cluster: the
//! agent profiles of `tests/data/profiles/` load as the operator loads them, and the reconcile
//! count is read from the operator's real exposition.

mod e2e_support;

use std::time::Duration;

use e2e_support::operator::{RECONCILES, sum_of};
use e2e_support::repo_path;
use kandev_operator::agents::AgentRegistry;
use kandev_operator::controller::metrics::Metrics;

/// Each file loads with `--agent-profiles` and adds the profiles its tests name.
#[test]
fn every_profiles_file_loads_with_the_profiles_its_tests_use() {
    for (file, profiles) in [
        ("operator", &["test-inconclusive", "test-new-fails"][..]),
        (
            "plugin",
            &[
                "plugin-echo",
                "plugin-echo-ids",
                "plugin-hang",
                "plugin-hang-once",
            ],
        ),
        ("faults", &["faults-agent"]),
        ("reach", &["reach-agent"]),
    ] {
        let path = repo_path(&format!("tests/data/profiles/{file}.yaml"));
        let registry =
            AgentRegistry::load_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for name in profiles {
            assert!(registry.get(name).is_some(), "{name} in {}", path.display());
        }
    }
    let files = std::fs::read_dir(repo_path("tests/data/profiles"))
        .expect("tests/data/profiles")
        .count();
    assert_eq!(files, 4, "every profiles file is checked here");
}

/// `Operator::reconciles` reads the operator's own exposition: ok and error reconciles summed,
/// and no other counter whose name starts the same.
#[test]
fn the_reconcile_count_sums_every_result_of_the_real_exposition() {
    let metrics = Metrics::new();
    let text = metrics.render();
    assert!(text.contains(RECONCILES), "{text}");
    assert_eq!(sum_of(&text, RECONCILES), 0);
    metrics.reconciled(None, Duration::from_millis(3));
    metrics.reconciled(None, Duration::from_millis(4));
    metrics.reconciled(Some("kube"), Duration::from_millis(5));
    assert_eq!(sum_of(&metrics.render(), RECONCILES), 3);
}
