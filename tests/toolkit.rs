//! The offline parts of the e2e toolkit (`tests/e2e_support/`), checked without a cluster: the
//! agent profiles of `tests/data/profiles/` load as the operator loads them, the reconcile count
//! is read from the operator's real exposition, and Events are ordered and matched as the e2e
//! tests assert them.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod e2e_support;

use std::time::Duration;

use e2e_support::operator::{RECONCILES, sum_of};
use e2e_support::repo_path;
use e2e_support::sessions::{in_order, occurred};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kandev_operator::agents::AgentRegistry;
use kandev_operator::controller::metrics::Metrics;

/// Each file loads with `--agent-profiles` and adds the profiles its tests name.
#[test]
fn every_profiles_file_loads_with_the_profiles_its_tests_use() {
    for (file, profiles) in [
        (
            "operator",
            &[
                "test-inconclusive",
                "test-new-fails",
                "test-no-restore",
                "test-hostile",
                "test-hostile-id",
            ][..],
        ),
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

fn event(reason: &str, event_time: Option<&str>, created: &str) -> Event {
    let at = |t: &str| t.parse::<Timestamp>().expect("timestamp");
    let mut event = Event {
        reason: Some(reason.into()),
        event_time: event_time.map(|t| MicroTime(at(t))),
        ..Event::default()
    };
    event.metadata.creation_timestamp = Some(Time(at(created)));
    event
}

/// Events created within one second are ordered by their microsecond eventTime; an Event
/// without one (another writer's) by its creation.
#[test]
fn events_are_ordered_by_event_time_then_creation() {
    let mut events = [
        event(
            "Resumed",
            Some("2026-01-01T00:00:01.000300Z"),
            "2026-01-01T00:00:01Z",
        ),
        event("Other", None, "2026-01-01T00:00:00Z"),
        event(
            "AgentLost",
            Some("2026-01-01T00:00:01.000100Z"),
            "2026-01-01T00:00:01Z",
        ),
        event(
            "ResumeRequested",
            Some("2026-01-01T00:00:01.000200Z"),
            "2026-01-01T00:00:01Z",
        ),
    ];
    events.sort_by_key(occurred);
    let reasons: Vec<&str> = events.iter().filter_map(|e| e.reason.as_deref()).collect();
    assert_eq!(
        reasons,
        ["Other", "AgentLost", "ResumeRequested", "Resumed"]
    );
}

#[test]
fn events_in_order_is_a_subsequence() {
    let reasons: Vec<String> = [
        "Starting",
        "DecoyPod",
        "AgentLost",
        "ResumeRequested",
        "Resumed",
    ]
    .map(String::from)
    .to_vec();
    assert!(in_order(&reasons, &["Starting", "AgentLost", "Resumed"]));
    assert!(in_order(&reasons, &[]));
    assert!(!in_order(&reasons, &["AgentLost", "Starting"]));
    assert!(!in_order(&reasons, &["Starting", "NodeLost"]));
}

/// `make demo` builds and installs only what it uses (issue 29): the `core` set of e2e/bin.sh
/// (the cluster's binaries and helm) holds none of the test-only peers that `make test` builds,
/// and the demo, `cluster.sh up`, `make chart` and `make manifests` ask for `core`, the demo for
/// the claude-code agent alone.
#[test]
fn the_demo_builds_no_test_only_tool() {
    let list = |set: &str| -> Vec<String> {
        let out = std::process::Command::new("bash")
            .arg(repo_path("e2e/bin.sh"))
            .args(["--list", set])
            .output()
            .expect("bash runs e2e/bin.sh");
        assert!(out.status.success(), "e2e/bin.sh --list {set}: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    };
    let core = list("core");
    let all = list("all");
    let test_only = [
        "agent-sandbox-controller",
        "toxiproxy-server",
        "jaeger-all-in-one",
        "kandev-apiproxy",
        "kandev-kstatus",
    ];
    for tool in test_only {
        assert!(!core.iter().any(|t| t == tool), "{tool} in core: {core:?}");
        assert!(all.iter().any(|t| t == tool), "{tool} not in all: {all:?}");
    }
    for tool in [
        "etcd",
        "kube-apiserver",
        "kwok",
        "kwokctl",
        "kubectl",
        "helm",
    ] {
        assert!(
            core.iter().any(|t| t == tool),
            "{tool} not in core: {core:?}"
        );
    }
    let read = |path: &str| std::fs::read_to_string(repo_path(path)).expect(path);
    let demo = read("e2e/demo.sh");
    assert!(demo.contains(r#"bin="$(bash "$here/bin.sh" core | tail -n 1)""#));
    assert!(demo.contains("export KANDEV_AGENTS=claude-code"));
    assert!(demo.contains(r#"bash "$here/agents.sh" "$KANDEV_AGENTS""#));
    let cluster = read("e2e/cluster.sh");
    assert!(cluster.contains("local set=core") && cluster.contains("set=real"));
    assert!(cluster.contains(r#"bin="$("$here/bin.sh" "$set" | tail -n 1)""#));
    assert!(read("Makefile").contains("bash e2e/bin.sh core"));
    assert!(read("deploy/render.sh").contains(r#"e2e/bin.sh" core"#));
}
