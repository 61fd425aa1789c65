//! The krew manifest `plugins/kandev.yaml` that `make dist` writes: its structure (always), and
//! (run by `make dist`, `KANDEV_DIST=<dir of the archives>`) that it matches the archives built.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml_ng::Value;
use support::process::run;

const PLATFORMS: [(&str, &str); 4] = [
    ("linux", "amd64"),
    ("linux", "arm64"),
    ("darwin", "amd64"),
    ("darwin", "arm64"),
];

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn manifest() -> Value {
    let path = repo("plugins/kandev.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

fn str_at<'a>(value: &'a Value, path: &[&str]) -> &'a str {
    let mut at = value;
    for key in path {
        at = &at[*key];
    }
    at.as_str()
        .unwrap_or_else(|| panic!("{} is not a string: {at:?}", path.join(".")))
}

/// One platform entry: (os, arch, uri, sha256).
fn platforms(manifest: &Value) -> Vec<(String, String, String, String)> {
    manifest["spec"]["platforms"]
        .as_sequence()
        .expect("spec.platforms is a list")
        .iter()
        .map(|p| {
            (
                str_at(p, &["selector", "matchLabels", "os"]).to_string(),
                str_at(p, &["selector", "matchLabels", "arch"]).to_string(),
                str_at(p, &["uri"]).to_string(),
                str_at(p, &["sha256"]).to_string(),
            )
        })
        .collect()
}

fn archive_name(os: &str, arch: &str) -> String {
    format!(
        "kubectl-kandev_v{}_{os}_{arch}.tar.gz",
        env!("CARGO_PKG_VERSION")
    )
}

#[test]
fn the_manifest_is_a_krew_plugin_of_this_version() {
    let m = manifest();
    assert_eq!(
        str_at(&m, &["apiVersion"]),
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(str_at(&m, &["kind"]), "Plugin");
    // krew names the binary kubectl-<name>: `kubectl kandev`.
    assert_eq!(str_at(&m, &["metadata", "name"]), "kandev");
    assert_eq!(
        str_at(&m, &["spec", "version"]),
        format!("v{}", env!("CARGO_PKG_VERSION"))
    );
    assert!(str_at(&m, &["spec", "homepage"]).starts_with("https://"));
    let short = str_at(&m, &["spec", "shortDescription"]);
    assert!(!short.is_empty() && short.len() <= 60, "{short:?}");
    assert!(str_at(&m, &["spec", "description"]).contains("kubectl kandev"));
    assert!(str_at(&m, &["spec", "caveats"]).contains("kubectl_complete-kandev"));

    let entries = platforms(&m);
    assert!(!entries.is_empty(), "no platform in the manifest");
    let mut seen = BTreeSet::new();
    for (os, arch, uri, sha256) in &entries {
        assert!(
            PLATFORMS.contains(&(os.as_str(), arch.as_str())),
            "{os}/{arch}"
        );
        assert!(seen.insert((os, arch)), "{os}/{arch} listed twice");
        assert!(
            uri.starts_with("https://") && uri.ends_with(&format!("/{}", archive_name(os, arch))),
            "{uri}"
        );
        assert!(
            sha256.len() == 64
                && sha256
                    .chars()
                    .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)),
            "{sha256:?} is not a lowercase sha256"
        );
    }
    for platform in m["spec"]["platforms"].as_sequence().expect("platforms") {
        assert_eq!(str_at(platform, &["bin"]), "kubectl-kandev");
        let files: Vec<&str> = platform["files"]
            .as_sequence()
            .expect("files")
            .iter()
            .map(|f| str_at(f, &["from"]))
            .collect();
        assert_eq!(files, ["kubectl-kandev", "LICENSE", "README.md"]);
    }
    // The LICENSE that the archives carry (krew's validator wants one).
    assert!(repo("LICENSE").is_file());
}

/// `make dist` runs this with `KANDEV_DIST=target/dist`: every archive built is in the manifest
/// with its sha256 (and in SHA256SUMS), every platform of the manifest has its archive, and each
/// archive holds exactly the binary, LICENSE and README.md.
#[test]
#[ignore = "dist: needs the archives of `make dist` (KANDEV_DIST)"]
fn the_manifest_matches_the_archives_built() {
    let dist = PathBuf::from(
        std::env::var_os("KANDEV_DIST").expect("KANDEV_DIST: the directory of make dist"),
    );
    let sums = std::fs::read_to_string(dist.join("SHA256SUMS")).expect("SHA256SUMS");
    let m = manifest();
    let entries = platforms(&m);
    let mut archives: Vec<String> = std::fs::read_dir(&dist)
        .expect("dist dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".tar.gz"))
        .collect();
    archives.sort();
    let mut listed: Vec<String> = entries
        .iter()
        .map(|(o, a, _, _)| archive_name(o, a))
        .collect();
    listed.sort();
    assert_eq!(
        archives, listed,
        "archives built vs platforms of the manifest"
    );
    for (os, arch, _, sha256) in &entries {
        let name = archive_name(os, arch);
        let path = dist.join(&name);
        let actual = run(Command::new("sha256sum").arg(&path))
            .stdout
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string();
        assert_eq!(&actual, sha256, "{name}: the manifest's sha256");
        assert!(
            sums.lines().any(|l| l == format!("{actual}  {name}")),
            "{name} missing from SHA256SUMS:\n{sums}"
        );
        let listing = run(Command::new("tar").arg("-tvzf").arg(&path)).stdout;
        let mut names: Vec<&str> = listing
            .lines()
            .filter_map(|l| l.split_whitespace().last())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["LICENSE", "README.md", "kubectl-kandev"],
            "{listing}"
        );
        assert!(
            listing
                .lines()
                .any(|l| l.starts_with("-rwxr-xr-x") && l.ends_with("kubectl-kandev")),
            "the binary is executable: {listing}"
        );
    }
}
