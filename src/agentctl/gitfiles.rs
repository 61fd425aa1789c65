//! Reading a clone the agent has written to, without running git in it.
//!
//! On every start after the first, the workspace is a clone whose `.git` the agent may have
//! written: its configuration can name programs (`core.fsmonitor`, hooks, filters, an editor,
//! a credential helper), rewrite URLs, include other files, or trace the environment. The
//! checkout needs only two facts of that clone: the URL of `origin` (is this our clone?) and
//! where HEAD points (the worktree it reports). Both are read here from the files themselves,
//! bounded in size, following no include and running nothing, so no configuration the agent
//! wrote is ever acted on while the repository's credentials are in the checkout's hands.

use std::io::Read;
use std::path::Path;

/// The most of one file of `.git` that is read (a clone's `config`, `HEAD`, a loose ref; a
/// larger `packed-refs` is read only up to this much).
const FILE_LIMIT: u64 = 1 << 20;
/// How many symbolic refs are followed from HEAD.
const SYMREF_HOPS: usize = 5;

/// The URL of `origin` in `<workspace>/.git/config`; `None` when `.git` is not a directory,
/// the file cannot be read, or names no origin URL.
pub fn origin_url(workspace: &Path) -> Option<String> {
    let git_dir = workspace.join(".git");
    if !git_dir.is_dir() {
        return None;
    }
    read_small(&git_dir.join("config"))
        .and_then(|text| config_value(&text, "remote", Some("origin"), "url"))
}

/// The branch HEAD names (`None`: detached or unreadable) and the commit it resolves to
/// (`None`: an unborn branch or unreadable).
pub fn head(workspace: &Path) -> (Option<String>, Option<String>) {
    let git_dir = workspace.join(".git");
    if !git_dir.is_dir() {
        return (None, None);
    }
    let Some(text) = read_small(&git_dir.join("HEAD")) else {
        return (None, None);
    };
    match parse_ref_file(&text) {
        Some(RefFile::Commit(id)) => (None, Some(id)),
        Some(RefFile::Symbolic(name)) => {
            let branch = name.strip_prefix("refs/heads/").map(str::to_string);
            (branch, resolve(&git_dir, &name))
        }
        None => (None, None),
    }
}

/// What a ref file holds.
#[derive(Clone, Debug, PartialEq, Eq)]
enum RefFile {
    Commit(String),
    Symbolic(String),
}

fn parse_ref_file(text: &str) -> Option<RefFile> {
    let text = text.trim();
    if let Some(name) = text.strip_prefix("ref:") {
        let name = name.trim();
        return safe_ref_name(name).then(|| RefFile::Symbolic(name.to_string()));
    }
    is_object_id(text).then(|| RefFile::Commit(text.to_ascii_lowercase()))
}

/// A SHA-1 or SHA-256 object id.
fn is_object_id(text: &str) -> bool {
    matches!(text.len(), 40 | 64) && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A ref name that stays inside `.git/refs` as a path.
fn safe_ref_name(name: &str) -> bool {
    name.starts_with("refs/")
        && !name
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == "..")
        && !name
            .bytes()
            .any(|b| b.is_ascii_control() || b == b'\\' || b == b':')
}

/// The commit `name` resolves to: a loose ref, else `packed-refs`.
fn resolve(git_dir: &Path, name: &str) -> Option<String> {
    let mut name = name.to_string();
    for _ in 0..SYMREF_HOPS {
        if !safe_ref_name(&name) {
            return None;
        }
        match read_small(&git_dir.join(&name))
            .as_deref()
            .and_then(parse_ref_file)
        {
            Some(RefFile::Commit(id)) => return Some(id),
            Some(RefFile::Symbolic(next)) => name = next,
            None => {
                return read_small(&git_dir.join("packed-refs"))
                    .and_then(|packed| packed_ref(&packed, &name));
            }
        }
    }
    None
}

/// The id of `name` in the text of a `packed-refs` file.
fn packed_ref(packed: &str, name: &str) -> Option<String> {
    packed
        .lines()
        .filter(|line| !line.starts_with('#') && !line.starts_with('^'))
        .filter_map(|line| line.split_once(' '))
        .find(|(_, refname)| refname.trim() == name)
        .map(|(id, _)| id.trim())
        .filter(|id| is_object_id(id))
        .map(str::to_ascii_lowercase)
}

/// A regular file's text, at most [`FILE_LIMIT`] bytes of it; `None` for anything else (a
/// directory, a FIFO that would block, a device).
fn read_small(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(FILE_LIMIT)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The last value of `section[.subsection].key` in the text of a git configuration file, as
/// git reads one file (section and key names case-insensitive, the subsection exact; quotes,
/// escapes, comments and continued lines), following no `include`.
fn config_value(text: &str, section: &str, subsection: Option<&str>, key: &str) -> Option<String> {
    let mut in_section = false;
    let mut found = None;
    let mut lines = text.lines();
    while let Some(raw) = lines.next() {
        let line = raw.trim_start();
        if line.starts_with('[') {
            let Some(end) = line.find(']') else {
                in_section = false;
                continue;
            };
            in_section = section_matches(&line[1..end], section, subsection);
            // `[section] key = value` on one line.
            let rest = line[end + 1..].trim_start();
            if rest.is_empty() || rest.starts_with('#') || rest.starts_with(';') {
                continue;
            }
            if let Some(value) = in_section.then(|| entry(rest, key, &mut lines)).flatten() {
                found = Some(value);
            }
            continue;
        }
        if in_section && let Some(value) = entry(line, key, &mut lines) {
            found = Some(value);
        }
    }
    found
}

/// Whether a header's inside (`remote "origin"`, or the old `remote.origin`) names the section.
fn section_matches(header: &str, section: &str, subsection: Option<&str>) -> bool {
    let header = header.trim();
    if let Some(quote) = header.find('"') {
        let name = header[..quote].trim();
        let sub = header[quote + 1..]
            .strip_suffix('"')
            .map(|s| s.replace("\\\"", "\"").replace("\\\\", "\\"));
        return name.eq_ignore_ascii_case(section) && sub.as_deref() == subsection;
    }
    match (header.split_once('.'), subsection) {
        (Some((name, sub)), Some(want)) => {
            name.eq_ignore_ascii_case(section) && sub.eq_ignore_ascii_case(want)
        }
        (None, None) => header.eq_ignore_ascii_case(section),
        _ => false,
    }
}

/// The value of `line` when it sets `key` (a key without `=` is boolean true); continued lines
/// are taken from `rest`.
fn entry<'a>(line: &str, key: &str, rest: &mut impl Iterator<Item = &'a str>) -> Option<String> {
    let (name, value) = match line.split_once('=') {
        Some((name, value)) => (name.trim(), Some(value)),
        None => (line.split(['#', ';']).next().unwrap_or("").trim(), None),
    };
    let matches = name.eq_ignore_ascii_case(key);
    let Some(value) = value else {
        return matches.then(|| "true".to_string());
    };
    let mut raw = value.to_string();
    // A value continues on the next line after a backslash outside quotes at its end.
    while ends_continued(&raw) {
        raw.pop();
        match rest.next() {
            Some(next) => raw.push_str(next),
            None => break,
        }
    }
    matches.then(|| unquote(&raw))
}

fn ends_continued(raw: &str) -> bool {
    let trailing = raw.bytes().rev().take_while(|b| *b == b'\\').count();
    trailing % 2 == 1
}

/// A value as git reads it: leading and trailing blanks dropped outside quotes, quotes removed,
/// `\"`, `\\`, `\n`, `\t`, `\b` unescaped, a comment cut off.
fn unquote(raw: &str) -> String {
    let mut out = String::new();
    let mut quoted = false;
    // Blanks are kept only once something follows them.
    let mut pending_blank = String::new();
    let mut chars = raw.trim_start().chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '#' | ';' if !quoted => break,
            '\\' => {
                out.push_str(&std::mem::take(&mut pending_blank));
                match chars.next() {
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some('b') => out.push('\u{8}'),
                    Some(other) => out.push(other),
                    None => {}
                }
            }
            c if c.is_whitespace() && !quoted => pending_blank.push(c),
            c => {
                out.push_str(&std::mem::take(&mut pending_blank));
                out.push(c);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_values_are_read_as_git_reads_them() {
        let origin = |text: &str| config_value(text, "remote", Some("origin"), "url");
        #[rustfmt::skip]
        let rows: Vec<(&str, &str, Option<&str>)> = vec![
            ("plain", "[remote \"origin\"]\n\turl = https://h/a.git\n", Some("https://h/a.git")),
            ("section case", "[REMOTE \"origin\"]\nURL=https://h/a.git", Some("https://h/a.git")),
            ("subsection is exact", "[remote \"Origin\"]\nurl = https://h/a.git", None),
            ("old form", "[remote.origin]\nurl = https://h/a.git", Some("https://h/a.git")),
            ("other remote", "[remote \"fork\"]\nurl = https://h/f.git", None),
            ("last wins", "[remote \"origin\"]\nurl = a\n[core]\nbare = false\n[remote \"origin\"]\nurl = b", Some("b")),
            ("quoted, comment", "[remote \"origin\"]\nurl = \"https://h/a b.git\" # c", Some("https://h/a b.git")),
            ("comment unquoted", "[remote \"origin\"]\nurl = https://h/a.git ; c", Some("https://h/a.git")),
            ("escapes", "[remote \"origin\"]\nurl = \"x\\\"y\\\\z\"", Some("x\"y\\z")),
            ("continued", "[remote \"origin\"]\nurl = https://h/\\\na.git", Some("https://h/a.git")),
            ("same line", "[remote \"origin\"] url = https://h/a.git", Some("https://h/a.git")),
            ("commented out", "[remote \"origin\"]\n# url = https://h/a.git", None),
            ("include is not followed", "[include]\npath = /etc/other\n[remote \"origin\"]\nfetch = x", None),
            ("no section", "url = https://h/a.git", None),
            ("broken header", "[remote \"origin\"\nurl = https://h/a.git", None),
        ];
        for (what, text, want) in rows {
            assert_eq!(origin(text).as_deref(), want, "{what}");
        }
    }

    #[test]
    fn ref_files_name_a_commit_or_a_ref_inside_refs() {
        let id = "0123456789abcdef0123456789abcdef01234567";
        let rows: Vec<(&str, Option<RefFile>)> = vec![
            (
                "ref: refs/heads/main\n",
                Some(RefFile::Symbolic("refs/heads/main".into())),
            ),
            (
                "ref:refs/heads/a/b",
                Some(RefFile::Symbolic("refs/heads/a/b".into())),
            ),
            (id, Some(RefFile::Commit(id.into()))),
            (
                "0123456789ABCDEF0123456789ABCDEF01234567",
                Some(RefFile::Commit(id.into())),
            ),
            ("ref: ../../etc/passwd", None),
            ("ref: refs/heads/../../config", None),
            ("ref: /etc/passwd", None),
            ("ref: refs//x", None),
            ("not a ref", None),
            ("0123", None),
        ];
        for (text, want) in rows {
            assert_eq!(parse_ref_file(text), want, "{text:?}");
        }
    }

    #[test]
    fn head_resolves_loose_packed_detached_and_unborn() {
        let id = "0123456789abcdef0123456789abcdef01234567";
        let other = "fedcba9876543210fedcba9876543210fedcba98";
        let ws = tempfile::tempdir().expect("tempdir");
        let git = ws.path().join(".git");
        std::fs::create_dir_all(git.join("refs/heads/team")).expect("mkdir");
        let write = |name: &str, text: &str| std::fs::write(git.join(name), text).expect("write");
        write("HEAD", "ref: refs/heads/team/task\n");
        write("refs/heads/team/task", &format!("{id}\n"));
        assert_eq!(head(ws.path()), (Some("team/task".into()), Some(id.into())));
        write("HEAD", "ref: refs/heads/main\n");
        write(
            "packed-refs",
            &format!("# pack-refs with: peeled\n{other} refs/heads/main\n^{id}\n"),
        );
        assert_eq!(head(ws.path()), (Some("main".into()), Some(other.into())));
        write("HEAD", "ref: refs/heads/unborn\n");
        assert_eq!(head(ws.path()), (Some("unborn".into()), None));
        write("HEAD", id);
        assert_eq!(head(ws.path()), (None, Some(id.into())));
        write("HEAD", "ref: refs/heads/loop\n");
        write("refs/heads/loop", "ref: refs/heads/loop\n");
        assert_eq!(head(ws.path()), (Some("loop".into()), None), "a loop ends");
        // A directory where a file should be is no answer, not an error.
        std::fs::remove_file(git.join("HEAD")).expect("rm");
        std::fs::create_dir(git.join("HEAD")).expect("mkdir");
        assert_eq!(head(ws.path()), (None, None));
    }

    #[test]
    fn the_origin_is_read_only_from_a_git_directory() {
        let ws = tempfile::tempdir().expect("tempdir");
        assert_eq!(origin_url(ws.path()), None);
        // A `.git` file (a linked worktree's) is not our clone.
        std::fs::write(ws.path().join(".git"), "gitdir: /elsewhere\n").expect("write");
        assert_eq!(origin_url(ws.path()), None);
        std::fs::remove_file(ws.path().join(".git")).expect("rm");
        std::fs::create_dir(ws.path().join(".git")).expect("mkdir");
        std::fs::write(
            ws.path().join(".git/config"),
            "[core]\n\tfsmonitor = \"env > /tmp/leak\"\n[remote \"origin\"]\n\turl = https://h/a.git\n",
        )
        .expect("write");
        assert_eq!(origin_url(ws.path()).as_deref(), Some("https://h/a.git"));
    }
}
