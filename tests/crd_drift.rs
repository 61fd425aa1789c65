//! Every checked-in copy of the CRDs must be exactly what the Rust types generate: `crds/`, and
//! the chart's templates under `charts/kandev-operator/templates/crds/` (the same CRDs with the
//! chart's labels and `helm.sh/resource-policy: keep`). Regenerate both with `make crds` after
//! changing `src/api/`.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

use std::path::Path;

use kandev_operator::api::{CHART_CRD_DIR, CrdFile, chart_crd_templates, crd_files};

fn assert_on_disk(dir: &str, files: Vec<CrdFile>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    assert_eq!(files.len(), 2, "both CRDs are generated");
    for file in files {
        let path = dir.join(&file.file_name);
        let on_disk = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{} is missing ({e}); run `make crds`", path.display()));
        assert!(
            on_disk == file.yaml,
            "{} differs from the Rust types in src/api/; run `make crds` and commit the result",
            path.display()
        );
    }
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "executorrunnings.kandev.dev.yaml",
            "tasksessions.kandev.dev.yaml"
        ],
        "no stale files in {}",
        dir.display()
    );
}

#[test]
fn checked_in_crds_match_the_rust_types() {
    assert_on_disk("crds", crd_files().expect("CRDs render as YAML"));
}

#[test]
fn chart_crd_templates_match_the_rust_types() {
    assert_on_disk(
        CHART_CRD_DIR,
        chart_crd_templates().expect("CRDs render as chart templates"),
    );
    // Helm never upgrades files under a chart's crds/: the CRDs live in templates only.
    let legacy = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/kandev-operator/crds");
    assert!(
        !legacy.exists(),
        "{} must not exist: the chart's CRDs are templates ({CHART_CRD_DIR})",
        legacy.display()
    );
}
