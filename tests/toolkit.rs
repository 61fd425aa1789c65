//! The offline parts of the e2e toolkit (`tests/e2e_support/`), checked without a cluster: the
//! agent profiles of `tests/data/profiles/` load as the operator loads them.

mod e2e_support;

use e2e_support::repo_path;
use kandev_operator::agents::AgentRegistry;

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
