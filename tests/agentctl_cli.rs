//! `agentctl` command-line behaviour around the bridge: clear failures, CLI-flag resume
//! launches, graceful stop, and the one-shot `restore` report.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod agentctl_support;

use std::path::Path;

use agentctl_support::support::process;
use agentctl_support::*;
use pretty_assertions::assert_eq;
use serde_json::Value;

fn run(args: &[&str]) -> (i32, String, String) {
    let output = process::run(agentctl().args(args));
    (
        output.status.code().unwrap_or(-1),
        output.stdout,
        output.stderr,
    )
}

#[test]
fn connect_and_events_fail_clearly_without_a_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("none.sock");
    for command in ["connect", "events"] {
        let (code, stdout, stderr) = run(&[command, "--socket", &path_str(&socket)]);
        assert_eq!(code, 1, "{command}: {stderr}");
        assert_eq!(stdout, "", "stdout is protocol only");
        assert!(
            stderr.contains("no agentctl is serving"),
            "{command}: {stderr}"
        );
    }
    let (code, _, stderr) = run(&["connect"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("KANDEV_AGENTCTL_SOCKET"), "{stderr}");
}

#[test]
fn serve_rejects_a_socket_path_too_long_for_unix_sockets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let long = dir.path().join("x".repeat(110));
    let (code, _, stderr) = run(&[
        "serve",
        "--workspace",
        &path_str(dir.path()),
        "--socket",
        &path_str(&long),
        "--",
        TEST_AGENT.as_str(),
    ]);
    assert_eq!(code, 1);
    assert!(stderr.contains("shorter than 108 bytes"), "{stderr}");
}

#[test]
fn serve_fails_clearly_when_the_agent_cannot_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (code, _, stderr) = run(&[
        "serve",
        "--workspace",
        &path_str(dir.path()),
        "--socket",
        &path_str(&dir.path().join("s.sock")),
        "--",
        "/nonexistent/agent-binary",
    ]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("cannot start the agent `/nonexistent/agent-binary`"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&["serve", "--workspace", "/tmp", "--profile", "nope"]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("unknown agent profile \"nope\""),
        "{stderr}"
    );
    assert!(stderr.contains("claude-code"), "{stderr}");
}

#[test]
fn a_cli_resume_profile_is_launched_with_its_resume_command() {
    // A profile that restores by command-line flags: no nativeSessionResume, a cliResume.
    // The test agent stands in; its `--new-session-id` shows which argv was used.
    let dir = tempfile::tempdir().expect("tempdir");
    let profiles = dir.path().join("profiles.yaml");
    let agent = serde_json::to_string(TEST_AGENT.as_str()).expect("json string");
    std::fs::write(
        &profiles,
        format!(
            "profiles:\n  flags-agent:\n    launch: [{agent}, --new-session-id, plain]\n    \
             nativeSessionResume: false\n    historyContextInjection: true\n    \
             cliResume: [{agent}, --new-session-id, 'resumed-{{token}}']\n"
        ),
    )
    .expect("profiles");
    let profiles = path_str(&profiles);
    let serve = Serve::start_in(
        dir,
        &[
            "--profile",
            "flags-agent",
            "--profiles-file",
            &profiles,
            "--resume-token",
            "abc",
        ],
        &[],
        &[],
    );
    let mut client = serve.connect();
    let created = client.new_session(1, &serve.workspace);
    assert_eq!(created["result"]["sessionId"], "resumed-abc");
}

#[test]
fn sigterm_stops_the_agent_and_exits_zero() {
    let mut serve = Serve::start(&[], &[]);
    let mut client = serve.connect();
    client.initialize(1);
    let agent = serve.agent_pids();
    assert_eq!(agent.len(), 1);
    assert!(serve.sigterm().expect("kill").success());
    let status = wait_exit(&mut serve.child, WAIT, "serve after SIGTERM");
    assert_eq!(status.code(), Some(0));
    assert!(
        !std::path::Path::new(&format!("/proc/{}", agent[0])).exists()
            || std::fs::read_to_string(format!("/proc/{}/stat", agent[0]))
                .is_ok_and(|stat| stat.contains(" Z ")),
        "the agent is gone"
    );
    assert!(wait_exit(&mut client.child, WAIT, "connect").success());
}

/// `agentctl restore --cwd <cwd> --timeout 20 --token <token> -- <command>`: its exit code and
/// its report.
fn restore(cwd: &Path, token: &str, command: &[&str]) -> (i32, Value) {
    let cwd = path_str(cwd);
    let base = [
        "restore",
        "--cwd",
        &cwd,
        "--timeout",
        "20",
        "--token",
        token,
        "--",
    ];
    let args: Vec<&str> = base.iter().chain(command).copied().collect();
    let (code, stdout, stderr) = run(&args);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "exactly one JSON object on stdout: {stdout:?} (stderr: {stderr})"
    );
    let report = serde_json::from_str(lines[0]).expect("report is JSON");
    (code, report)
}

#[test]
fn restore_prints_one_report_and_exits_by_outcome() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cwd = dir.path();

    let (code, report) = restore(
        cwd,
        "saved-1",
        &[TEST_AGENT.as_str(), "--known-session", "saved-1"],
    );
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["outcome"], "restored");
    assert_eq!(report["method"], "session/resume");
    assert_eq!(report["sessionId"], "saved-1");
    assert!(report["capabilities"].is_object(), "{report}");

    let (code, report) = restore(cwd, "-", &[TEST_AGENT.as_str()]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["outcome"], "fresh");
    assert_eq!(report["method"], "session/new");

    let (code, report) = restore(
        cwd,
        "saved-1",
        &[TEST_AGENT.as_str(), "--on-resume", "error:-32000"],
    );
    assert_eq!(code, 1, "{report}");
    assert_eq!(report["outcome"], "failed");
    assert_eq!(report["sessionId"], "saved-1", "the token is kept");

    let (code, report) = restore(cwd, "saved-1", &["/nonexistent/agent"]);
    assert_eq!(code, 1);
    assert_eq!(report["outcome"], "failed");
    assert!(
        report["reason"]
            .as_str()
            .is_some_and(|r| r.contains("/nonexistent/agent")),
        "{report}"
    );
}

/// `agentctl history` prints the recorded file byte for byte: by session name and workspace, by
/// KANDEV_SESSION_NAME in the working directory (as in a pod), or by --file; exit 3 and nothing
/// on stdout when there is no history yet, 1 for a bad or missing session name.
#[test]
fn history_prints_the_recorded_file_or_says_there_is_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let workspace = dir.path().join("ws");
    // Unparseable lines too: history prints what is recorded, it does not judge it.
    let recorded = concat!(
        r#"{"type":"user_message","text":"fix the bug","timestamp":"2026-01-01T00:00:00Z"}"#,
        "\n",
        "torn line {\n",
        r#"{"type":"agent_message","text":"done ✓"}"#,
        "\n",
    );
    let file = path_str(&write_history(&workspace, "ts-1", recorded));
    let ws = path_str(&workspace);

    let (code, stdout, stderr) = run(&["history", "--workspace", &ws, "--session-name", "ts-1"]);
    assert_eq!((code, stdout.as_str()), (0, recorded), "{stderr}");
    let (code, stdout, _) = run(&["history", "--workspace", &ws, "--session", "ts-1"]);
    assert_eq!(
        (code, stdout.as_str()),
        (0, recorded),
        "the --session alias"
    );
    let (code, stdout, _) = run(&["history", "--file", &file]);
    assert_eq!((code, stdout.as_str()), (0, recorded));

    // In a pod: the session from the environment, the workspace is the working directory.
    let output = process::run(
        agentctl()
            .arg("history")
            .current_dir(&workspace)
            .env("KANDEV_SESSION_NAME", "ts-1"),
    );
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(output.stdout, recorded);

    let (code, stdout, stderr) = run(&["history", "--workspace", &ws, "--session-name", "other"]);
    assert_eq!((code, stdout.as_str()), (3, ""), "{stderr}");
    assert!(
        stderr.contains("no recorded history for session \"other\"")
            && stderr.contains(".kandev/sessions/other.jsonl"),
        "{stderr}"
    );
    let (code, stdout, stderr) = run(&["history", "--file", "/nonexistent/h.jsonl"]);
    assert_eq!((code, stdout.as_str()), (3, ""), "{stderr}");

    let (code, _, stderr) = run(&["history", "--workspace", &ws, "--session-name", "../x"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("invalid --session-name"), "{stderr}");
    let output = process::run(agentctl().args(["history", "--workspace", &ws]));
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stderr.contains("no session name"), "{output:?}");
    // --file wins over a session, also one from the environment (as in a pod).
    let output = process::run(
        agentctl()
            .args(["history", "--file", &file, "--session-name", "other"])
            .env("KANDEV_SESSION_NAME", "other")
            .env("KANDEV_WORKSPACE", "/nonexistent"),
    );
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(output.stdout, recorded);
}

/// `agentctl checkout` (the pod's init container): clones an empty workspace and exits 0, finds
/// that clone again and exits 0, and refuses a workspace that holds something else with exit 1
/// and `WorkspaceMismatch: …` in the termination log; with `--started-before`, an empty
/// workspace is refused (`WorkspaceEmpty: …`) and nothing is cloned.
#[test]
fn checkout_prepares_the_workspace_or_says_why_not() {
    let root = tempfile::tempdir().expect("tempdir");
    let git = |dir: &Path, args: &[&str]| {
        let out = process::run(
            std::process::Command::new("git")
                .args(args)
                .current_dir(dir),
        );
        assert!(out.status.success(), "git {args:?}: {}", out.stderr);
        out.stdout
    };
    let seed = root.path().join("seed");
    std::fs::create_dir_all(&seed).expect("mkdir");
    git(&seed, &["init", "-q", "-b", "main"]);
    std::fs::write(seed.join("README"), "hello").expect("write");
    git(&seed, &["add", "README"]);
    git(
        &seed,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@e",
            "commit",
            "-q",
            "-m",
            "first",
        ],
    );
    let url = path_str(&seed);
    let ws = root.path().join("ws");
    std::fs::create_dir_all(&ws).expect("mkdir");
    let log = root.path().join("termination-log");
    let checkout_as = |ws: &Path, extra: &[&str]| {
        let ws = path_str(ws);
        let log = path_str(&log);
        let mut args = vec![
            "checkout",
            "--workspace",
            &ws,
            "--repository",
            &url,
            "--branch",
            "kandev/t-1",
            "--termination-log",
            &log,
        ];
        args.extend(extra);
        run(&args)
    };
    let checkout = |ws: &Path| checkout_as(ws, &[]);
    let (code, _, stderr) = checkout(&ws);
    assert_eq!(code, 0, "{stderr}");
    assert!(ws.join("README").is_file(), "cloned");
    assert!(stderr.contains("workspace ready"), "{stderr}");
    assert_eq!(git(&ws, &["branch", "--show-current"]).trim(), "kandev/t-1");
    let (code, _, stderr) = checkout_as(&ws, &["--started-before"]);
    assert_eq!(code, 0, "the clone of an earlier start is kept: {stderr}");
    assert!(!log.exists(), "nothing to say");

    let emptied = root.path().join("emptied");
    std::fs::create_dir_all(emptied.join(".kandev")).expect("mkdir");
    let (code, _, stderr) = checkout_as(&emptied, &["--started-before"]);
    assert_eq!(code, 1, "{stderr}");
    let why = std::fs::read_to_string(&log).expect("termination log");
    assert!(why.starts_with("WorkspaceEmpty: "), "{why}");
    assert!(!emptied.join("README").exists(), "nothing cloned");
    std::fs::remove_file(&log).expect("remove the log");

    let other = root.path().join("other");
    std::fs::create_dir_all(&other).expect("mkdir");
    std::fs::write(other.join("notes.txt"), "mine").expect("write");
    let (code, _, stderr) = checkout(&other);
    assert_eq!(code, 1, "{stderr}");
    let why = std::fs::read_to_string(&log).expect("termination log");
    assert!(why.starts_with("WorkspaceMismatch: "), "{why}");
    assert_eq!(
        std::fs::read_to_string(other.join("notes.txt"))
            .ok()
            .as_deref(),
        Some("mine")
    );
}

/// Git configuration an agent can write (its HOME's `.gitconfig`, the clone's `.git/config`)
/// that would make git run a program, trace its environment or rewrite the repository's URL,
/// each writing what it sees into `leak`.
fn hostile_git_config(leak: &Path, hooks: &Path, url: &str) -> String {
    let leak = path_str(leak);
    format!(
        r#"[core]
	fsmonitor = "env >> {leak}/fsmonitor; true"
	hooksPath = {hooks}
	sshCommand = "sh -c 'env >> {leak}/ssh'"
	pager = "env >> {leak}/pager; cat"
	askPass = "{leak}/../askpass"
[trace2]
	eventTarget = {leak}/trace2-event
	normalTarget = {leak}/trace2-normal
	envVars = KANDEV_GIT_PASSWORD,KANDEV_GIT_USERNAME
[credential]
	helper = "!env >> {leak}/credential-helper; true"
[url "file:///nonexistent/"]
	insteadOf = {url}
[filter "leak"]
	smudge = "env >> {leak}/smudge; cat"
	clean = "env >> {leak}/clean; cat"
[alias]
	co = "!env >> {leak}/alias"
"#,
        hooks = path_str(hooks),
    )
}

/// Issue 40, part 1: the agent owns its HOME and its clone, and the checkout holds the
/// repository's credentials. Whatever git configuration the agent writes into either, on the
/// next start the checkout acts on none of it: nothing runs, nothing is traced, the URL is not
/// rewritten, and no byte of the password lands anywhere under the workspace.
#[test]
fn checkout_never_acts_on_git_configuration_the_agent_wrote() {
    const PASSWORD: &str = "hostile-config-password-7731";
    let root = tempfile::tempdir().expect("tempdir");
    let git = |dir: &Path, args: &[&str]| {
        let out = process::run(
            std::process::Command::new("git")
                .args(["-c", "user.name=t", "-c", "user.email=t@e"])
                .args(args)
                .current_dir(dir)
                .env("GIT_CONFIG_GLOBAL", "/dev/null"),
        );
        assert!(out.status.success(), "git {args:?}: {}", out.stderr);
        out.stdout
    };
    let seed = root.path().join("seed");
    std::fs::create_dir_all(&seed).expect("mkdir");
    git(&seed, &["init", "-q", "-b", "main"]);
    std::fs::write(seed.join("README"), "hello").expect("write");
    std::fs::write(seed.join(".gitattributes"), "* filter=leak\n").expect("write");
    git(&seed, &["add", "."]);
    git(&seed, &["commit", "-q", "-m", "first"]);
    let url = path_str(&seed);

    // The agent's side: its HOME and a hooks directory on the workspace volume, and where its
    // programs would write what they saw.
    let ws = root.path().join("ws");
    let home = ws.join(".kandev/home");
    let leak = ws.join(".kandev/leak");
    let hooks = ws.join(".kandev/hooks");
    for dir in [&home, &leak, &hooks] {
        std::fs::create_dir_all(dir).expect("mkdir");
    }
    for hook in [
        "reference-transaction",
        "post-checkout",
        "post-merge",
        "post-index-change",
        "pre-auto-gc",
        "fsmonitor-watchman",
    ] {
        let file = hooks.join(hook);
        std::fs::write(
            &file,
            format!("#!/bin/sh\nenv >> {}/hook-{hook}\n", path_str(&leak)),
        )
        .expect("hook");
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
    }
    let hostile = hostile_git_config(&leak, &hooks, &url);
    std::fs::write(home.join(".gitconfig"), &hostile).expect("gitconfig");
    std::fs::create_dir_all(home.join(".config/git")).expect("mkdir");
    std::fs::write(home.join(".config/git/config"), &hostile).expect("xdg config");

    let log = root.path().join("termination-log");
    let checkout = || {
        let output = process::run(
            agentctl()
                .args([
                    "checkout",
                    "--workspace",
                    &path_str(&ws),
                    "--repository",
                    &url,
                    "--termination-log",
                    &path_str(&log),
                ])
                // As the operator sets up the checkout container.
                .env("HOME", &home)
                .env("GIT_CONFIG_COUNT", "1")
                .env("GIT_CONFIG_KEY_0", "safe.directory")
                .env("GIT_CONFIG_VALUE_0", &ws)
                .env("KANDEV_GIT_USERNAME", "e2e")
                .env("KANDEV_GIT_PASSWORD", PASSWORD),
        );
        let said = format!("{}{}", output.stdout, output.stderr);
        assert!(
            !said.contains(PASSWORD),
            "agentctl printed the password: {said}"
        );
        // Nothing the agent configured ran, and the password is nowhere on the volume.
        let ran: Vec<String> = std::fs::read_dir(&leak)
            .expect("leak dir")
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let holding = files_holding(root.path(), PASSWORD.as_bytes());
        assert!(
            holding.is_empty(),
            "the password is in {holding:?}; ran: {ran:?}"
        );
        assert!(
            ran.is_empty(),
            "git acted on the agent's configuration: {ran:?}"
        );
        assert_eq!(output.status.code(), Some(0), "{said}");
        said
    };

    // A first start with a hostile HOME already there (the agent wiped an earlier clone).
    checkout();
    assert!(ws.join("README").is_file(), "cloned from the real URL");
    // The agent now writes into the clone's own configuration too.
    let config = ws.join(".git/config");
    let mut text = std::fs::read_to_string(&config).expect("config");
    text.push_str(&hostile);
    text.push_str("[include]\n\tpath = ../.kandev/home/.gitconfig\n");
    std::fs::write(&config, text).expect("write config");
    std::fs::write(ws.join(".git/info/attributes"), "* filter=leak\n").expect("attributes");
    // Lost and started again: the clone is kept, and its branch still reported.
    let said = checkout();
    assert!(said.contains("left as it is"), "{said}");
    assert!(said.contains("branch=Some(\"main\")"), "{said}");
}

/// Every file below `dir` whose bytes contain `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(path),
                Ok(t) if t.is_file() => {
                    let bytes = std::fs::read(&path).unwrap_or_default();
                    if bytes.windows(needle.len()).any(|w| w == needle) {
                        found.push(path);
                    }
                }
                _ => {}
            }
        }
    }
    found
}
