//! The project carries its own design: every "DESIGN §N" in the repository names a section of
//! docs/design.md, and every relative link of the README and the docs pages points at a file
//! inside the repository.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Text files of the repository that cite the design (sources, tests, scripts, docs).
fn cited_in(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" || name == "node_modules" {
            continue;
        }
        if path.is_dir() {
            cited_in(&path, out);
        } else if ["rs", "md", "sh", "yaml", "toml", "go"]
            .iter()
            .any(|ext| name.ends_with(&format!(".{ext}")))
        {
            out.push(path);
        }
    }
}

/// The section numbers of docs/design.md's `## N. Title` headings.
fn design_sections() -> Vec<u32> {
    let page = std::fs::read_to_string(root().join("docs/design.md")).expect("docs/design.md");
    page.lines()
        .filter_map(|l| l.strip_prefix("## "))
        .filter_map(|l| l.split_once(". "))
        .filter_map(|(n, _)| n.parse().ok())
        .collect()
}

#[test]
fn every_design_citation_names_a_section_of_docs_design() {
    let sections = design_sections();
    assert_eq!(sections, (1..=7).collect::<Vec<_>>(), "numbered sections");
    let mut files = Vec::new();
    for dir in ["src", "tests", "e2e", "docs", "charts", "fuzz"] {
        cited_in(&root().join(dir), &mut files);
    }
    files.extend([root().join("README.md"), root().join("Makefile")]);
    let mut citations = 0;
    let mut dangling = Vec::new();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for (at, _) in text.match_indices("DESIGN §") {
            let number: String = text[at + "DESIGN §".len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if number.is_empty() {
                continue; // the pattern itself, as prose ("DESIGN §N")
            }
            citations += 1;
            if !number.parse().is_ok_and(|n: u32| sections.contains(&n)) {
                dangling.push(format!("{}: DESIGN §{number}", file.display()));
            }
        }
        for outside in ["shared/DESIGN", "DESIGN.md", "CONTROL-PLANE.md"] {
            if text.contains(outside) && !file.ends_with("design_refs.rs") {
                dangling.push(format!(
                    "{}: {outside} (outside the repository)",
                    file.display()
                ));
            }
        }
    }
    assert!(
        citations > 50,
        "found {citations} citations: is the scan right?"
    );
    assert!(dangling.is_empty(), "{dangling:#?}");
}

/// `](target)` links of a Markdown text: relative ones, without their `#anchor`.
fn relative_links(text: &str) -> Vec<String> {
    text.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &text[at + 2..];
            let end = rest.find(')')?;
            let target = rest[..end].split('#').next()?.trim();
            let absolute = target.contains("://") || target.starts_with("mailto:");
            (!target.is_empty() && !absolute).then(|| target.to_string())
        })
        .collect()
}

#[test]
fn the_readme_and_the_docs_link_only_inside_the_repository() {
    let root = root().canonicalize().expect("repository root");
    let mut pages = vec![root.join("README.md")];
    for dir in ["docs", "docs/performance"] {
        for entry in std::fs::read_dir(root.join(dir)).expect("docs").flatten() {
            if entry.file_name().to_string_lossy().ends_with(".md") {
                pages.push(entry.path());
            }
        }
    }
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("page");
        let base = page.parent().expect("a page's directory");
        for link in relative_links(&text) {
            match base.join(&link).canonicalize() {
                Ok(target) if target.starts_with(&root) => {}
                Ok(target) => broken.push(format!(
                    "{}: {link} leaves the repository ({})",
                    page.display(),
                    target.display()
                )),
                Err(e) => broken.push(format!("{}: {link}: {e}", page.display())),
            }
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

/// The test names of docs/security.md's "Each guarantee and its test": `snake_case` words in
/// backquotes with at least two underscores.
fn guarantee_tests() -> Vec<String> {
    let page = std::fs::read_to_string(root().join("docs/security.md")).expect("docs/security.md");
    let section = page
        .split("## Each guarantee and its test")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("docs/security.md has a section \"Each guarantee and its test\"");
    section
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|word| {
            word.matches('_').count() >= 2
                && word
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn every_test_that_docs_security_names_exists() {
    let tests = guarantee_tests();
    assert!(tests.len() >= 15, "{tests:?}");
    let mut files = Vec::new();
    for dir in ["src", "tests"] {
        cited_in(&root().join(dir), &mut files);
    }
    let sources: Vec<String> = files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "rs"))
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .collect();
    let missing: Vec<&String> = tests
        .iter()
        .filter(|name| {
            !sources
                .iter()
                .any(|text| text.contains(&format!("fn {name}(")))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/security.md names tests that do not exist: {missing:?}"
    );
}
