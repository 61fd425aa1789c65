//! `kubectl-kandev` as a subprocess, without a cluster: usage errors of the kubectl flags and
//! `-o`, `--request-timeout` against an API server that never answers, and the completion
//! executable's answers that need no cluster. The cluster side (session names, `--as`,
//! `--token`, `-o` on real objects, completion through the real kubectl) is in
//! `tests/e2e_plugin.rs`.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod support;

use std::io::Write;
use std::process::Command;
use std::time::Duration;

use support::process::{Output, run_within};

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubectl-kandev");

/// Runs `program` (the plugin under one of its names) without a kubeconfig from the
/// environment; a run longer than a minute is killed and fails the test (a hang).
fn run_as(program: &std::path::Path, args: &[&str]) -> Output {
    run_within(
        Command::new(program).args(args).env_remove("KUBECONFIG"),
        Duration::from_secs(60),
    )
}

fn run(args: &[&str]) -> Output {
    run_as(std::path::Path::new(PLUGIN), args)
}

/// A kubeconfig whose server accepts connections and never answers (the listener's backlog
/// completes the TCP handshake; nothing reads the request).
fn silent_server() -> (std::net::TcpListener, tempfile::NamedTempFile) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let mut kubeconfig = tempfile::NamedTempFile::new().expect("kubeconfig");
    write!(
        kubeconfig,
        r#"apiVersion: v1
kind: Config
clusters:
- name: silent
  cluster: {{server: "http://127.0.0.1:{port}"}}
users:
- name: someone
  user: {{token: not-checked}}
contexts:
- name: silent
  context: {{cluster: silent, user: someone, namespace: team}}
current-context: silent
"#
    )
    .expect("write kubeconfig");
    (listener, kubeconfig)
}

#[test]
fn request_timeout_ends_a_request_the_server_never_answers() {
    let (_listener, kubeconfig) = silent_server();
    let path = kubeconfig.path().to_str().expect("utf-8 path");
    let output = run(&[
        "--kubeconfig",
        path,
        "status",
        "demo",
        "--request-timeout",
        "1s",
    ]);
    let stderr = &output.stderr;
    assert_eq!(output.status.code(), Some(6), "{stderr}");
    assert!(stderr.contains("timed out"), "{stderr}");
    assert!(stderr.contains("reading tasksession \"demo\""), "{stderr}");
}

#[test]
fn kubectl_flag_and_output_usage_errors() {
    for (args, says) in [
        (
            &["status", "demo", "--as-group", "team-a"][..],
            "--as-group needs --as",
        ),
        (
            &["status", "demo", "--request-timeout", "soon"],
            "invalid duration",
        ),
        (&["status", "demo", "-o", "wide"], "unknown output format"),
        (
            &["resume", "demo", "-o", "jsonpath={.state"],
            "bad jsonpath template",
        ),
        (
            &["complete", "demo", "-o", "jsonpath={end}"],
            "{end} without {range}",
        ),
    ] {
        let output = run(args);
        let stderr = &output.stderr;
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[test]
fn the_completion_executable_answers_without_a_cluster() {
    // kubectl runs `kubectl_complete-kandev ARGS… WORD`: the plugin linked under that name.
    let dir = tempfile::tempdir().expect("dir");
    let link = dir.path().join("kubectl_complete-kandev");
    std::os::unix::fs::symlink(PLUGIN, &link).expect("link");
    let output = run_as(&link, &["resu"]);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        output.stdout,
        "resume\tAsk the operator to resume a session whose agent is gone\n:4\n"
    );
    let output = run(&["__complete", "status", "demo", "-o", "j"]);
    assert_eq!(
        output.stdout,
        "json\tthe object as JSON\njsonpath=\tfields picked with a kubectl JSONPath template\n:6\n"
    );
    // No cluster to ask for session names: nothing, and no error in the command line.
    let (_listener, kubeconfig) = silent_server();
    let path = kubeconfig.path().to_str().expect("utf-8 path");
    let output = run(&[
        "__complete",
        "--kubeconfig",
        path,
        "--request-timeout",
        "1s",
        "status",
        "",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", output.stderr);
    assert_eq!(output.stdout, ":4\n");
}

#[test]
fn the_permission_verbs_are_documented_and_completed() {
    for (verb, says) in [
        ("permissions", "status.pendingPermissions"),
        ("approve", "kandev.dev/permission-answer"),
        ("deny", "kandev.dev/permission-answer"),
    ] {
        let output = run(&[verb, "--help"]);
        assert_eq!(output.status.code(), Some(0), "{verb}: {}", output.stderr);
        let help = &output.stdout;
        assert!(help.contains(says), "{verb}: {help}");
        assert!(help.contains("Exit codes:"), "{verb}: {help}");
        assert!(help.contains("--namespace"), "{verb}: {help}");
    }
    let output = run(&["approve", "--help"]);
    for words in [
        "allow_once",
        "allow_always",
        "kandev-plugin",
        "--always",
        "--wait",
    ] {
        assert!(output.stdout.contains(words), "{words}: {}", output.stdout);
    }
    let output = run(&["deny", "--help"]);
    for words in ["reject_once", "reject_always"] {
        assert!(output.stdout.contains(words), "{words}: {}", output.stdout);
    }

    let output = run(&["__complete", "perm"]);
    assert_eq!(
        output.stdout,
        "permissions\tList the agent's permission requests that wait for a person's answer\n:4\n"
    );
    let output = run(&["__complete", "de"]);
    assert_eq!(
        output.stdout,
        "deny\tReject a permission request the agent waits on (reject_once; --always: reject_always)\n:4\n"
    );
    let output = run(&["__complete", "permissions", "demo", "-o", "n"]);
    assert_eq!(output.stdout, "name\tthe request ids, one a line\n:6\n");
    let output = run(&["__complete", "approve", "demo", "--a"]);
    assert!(
        output.stdout.starts_with("--always\t") && output.stdout.contains("--as\t"),
        "{}",
        output.stdout
    );
    // The pending ids come from the cluster: none to ask, nothing, and no error.
    let (_listener, kubeconfig) = silent_server();
    let path = kubeconfig.path().to_str().expect("utf-8 path");
    for verb in ["approve", "deny"] {
        let output = run(&[
            "__complete",
            "--kubeconfig",
            path,
            "--request-timeout",
            "1s",
            verb,
            "demo",
            "",
        ]);
        assert_eq!(output.status.code(), Some(0), "{}", output.stderr);
        assert_eq!(output.stdout, ":4\n", "{verb}");
    }
}

#[test]
fn permission_verb_usage_errors() {
    for (args, says) in [
        (
            &["permissions", "demo", "-o", "wide"][..],
            "name (the request ids)",
        ),
        (&["approve", "demo", "p1", "p2"], "unexpected argument"),
        (&["deny"], "<SESSION>"),
        (
            &["approve", "demo", "--timeout", "soon"],
            "invalid duration",
        ),
        (
            &["deny", "demo", "-o", "jsonpath={.x"],
            "bad jsonpath template",
        ),
    ] {
        let output = run(args);
        let stderr = &output.stderr;
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[test]
fn approve_reads_the_session_first_and_says_so_when_the_server_never_answers() {
    let (_listener, kubeconfig) = silent_server();
    let path = kubeconfig.path().to_str().expect("utf-8 path");
    let output = run(&[
        "--kubeconfig",
        path,
        "approve",
        "demo",
        "p3",
        "--request-timeout",
        "1s",
    ]);
    let stderr = &output.stderr;
    assert_eq!(output.status.code(), Some(6), "{stderr}");
    assert!(stderr.contains("reading tasksession \"demo\""), "{stderr}");
}
