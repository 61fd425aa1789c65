//! End-to-end: every command in docs/ runs. Each fenced `sh` block of the pages, in reading
//! order, is run with `bash -euo pipefail` from the repository root against the e2e cluster: the
//! Helm chart is installed as the install page says, its operator pods are played by the e2e
//! harness (local processes with the chart ServiceAccount's token, so the chart's RBAC is what
//! they get), and the resume page loses and resumes a real claude-agent-acp session. A block
//! marked `sh fails` must fail. Run by `bash e2e/test.sh`; `#[ignore]`d for plain `cargo test`.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod e2e_support;

use std::path::Path;
use std::time::{Duration, Instant};

use e2e_support::support::chart;
use e2e_support::support::process::{Output, run_async};
use e2e_support::{client, repo_path, with_cleanup};

/// Reading order: later pages rely on what earlier ones set up (docs/README.md says so).
const PAGES: [&str; 14] = [
    "design.md",
    "install.md",
    "spec.md",
    "resume.md",
    "status.md",
    "agent-profiles.md",
    "security.md",
    "troubleshooting.md",
    "observability.md",
    "gitops.md",
    "ending.md",
    "approvals.md",
    "performance.md",
    "uninstall.md",
];
/// Upper bound for one block (a resume with a real agent takes seconds; helm --wait up to 3m).
const BLOCK_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, PartialEq)]
struct Block {
    page: String,
    line: usize,
    code: String,
    must_fail: bool,
}

/// The runnable blocks of a page; panics on a fence whose kind the runner does not know, so a
/// new kind of block is a decision, not something silently skipped.
fn blocks(page: &str, text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        let Some(info) = line.strip_prefix("```") else {
            continue;
        };
        let info = info.trim();
        let body: Vec<&str> = lines
            .by_ref()
            .map(|(_, l)| l)
            .take_while(|l| !l.starts_with("```"))
            .collect();
        let must_fail = match info {
            "sh" => false,
            "sh fails" => true,
            "text" | "yaml" | "json" => continue,
            other => panic!("{page}:{}: unknown block kind {other:?}", n + 1),
        };
        out.push(Block {
            page: page.to_string(),
            line: n + 1,
            code: body.join("\n"),
            must_fail,
        });
    }
    out
}

#[test]
fn blocks_are_found_with_their_kind() {
    let page = "intro\n```sh\necho a\necho b\n```\n```text\n$ x\n```\n```sh fails\nfalse\n```\n";
    let found = blocks("p.md", page);
    assert_eq!(
        found,
        vec![
            Block {
                page: "p.md".into(),
                line: 2,
                code: "echo a\necho b".into(),
                must_fail: false
            },
            Block {
                page: "p.md".into(),
                line: 9,
                code: "false".into(),
                must_fail: true
            },
        ]
    );
}

#[test]
fn every_page_is_run() {
    let mut pages: Vec<String> = std::fs::read_dir(repo_path("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md") && n != "README.md")
        .collect();
    pages.sort();
    let mut listed: Vec<String> = PAGES.iter().map(|p| p.to_string()).collect();
    listed.sort();
    assert_eq!(pages, listed, "docs pages and the runner's PAGES differ");
    for page in PAGES {
        let text = std::fs::read_to_string(repo_path(&format!("docs/{page}"))).expect("page");
        blocks(page, &text); // panics on an unknown block kind
    }
}

async fn run_block(block: &Block) -> (Option<i32>, String) {
    let finished = run_async(
        tokio::process::Command::new("bash")
            .args(["-euo", "pipefail", "-c", &block.code])
            .current_dir(repo_path("")),
        BLOCK_TIMEOUT,
    )
    .await;
    let output = |out: &Output| format!("--- stdout\n{}--- stderr\n{}", out.stdout, out.stderr);
    match finished {
        Ok(out) => (out.status.code(), output(&out)),
        Err(out) => (
            None,
            format!("timed out after {BLOCK_TIMEOUT:?}\n{}", output(&out)),
        ),
    }
}

/// Leftovers of an interrupted run: sessions (their finalizer needs the operator), the release,
/// the namespaces and the CRDs' absence are restored to "nothing installed".
fn clean_slate() {
    chart::lift_finalizers(Some("team-a"));
    // helm's own default for --timeout.
    chart::uninstall(chart::NAMESPACE, "5m");
    chart::delete_namespaces(&["team-a", chart::NAMESPACE]);
    // The chart's CRDs are templates: CRDs that other tests applied (or another release kept)
    // would make the docs' `helm install` refuse to adopt them.
    chart::delete_crds();
}

#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn every_command_in_the_docs_runs() {
    client().await; // fails loudly without a cluster
    assert!(
        which("helm") && which("kubectl-kandev") && which("kubectl"),
        "helm, kubectl and kubectl-kandev must be on PATH (bash e2e/test.sh puts them there)"
    );
    clean_slate();
    let body = async {
        for page in PAGES {
            let text = std::fs::read_to_string(repo_path(&format!("docs/{page}"))).expect("page");
            for block in blocks(page, &text) {
                let started = Instant::now();
                let (code, output) = run_block(&block).await;
                eprintln!(
                    "docs/{}:{} exit {code:?} in {:.1}s",
                    block.page,
                    block.line,
                    started.elapsed().as_secs_f64()
                );
                let ok = if block.must_fail {
                    matches!(code, Some(c) if c != 0)
                } else {
                    code == Some(0)
                };
                assert!(
                    ok,
                    "docs/{}:{}: expected {}, got exit {code:?}\n--- block\n{}\n{output}",
                    block.page,
                    block.line,
                    if block.must_fail {
                        "a failure"
                    } else {
                        "success"
                    },
                    block.code
                );
            }
        }
    };
    with_cleanup(body, async { clean_slate() }).await;
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| Path::new(&dir).join(program).is_file())
    })
}
