//! The checked-in YAML under `crds/` must be exactly what the Rust types generate.
//! Regenerate with `make crds` after changing `src/api/`.

use std::path::Path;

#[test]
fn checked_in_crds_match_the_rust_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    let files = kandev_operator::api::crd_files().expect("CRDs render as YAML");
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
        .expect("crds/ exists")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "executorrunnings.kandev.dev.yaml",
            "tasksessions.kandev.dev.yaml"
        ],
        "no stale CRD files"
    );
}
