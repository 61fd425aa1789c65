//! The resume-request handshake of DESIGN §3: which annotation token is a new request, and the
//! bounded memory of handled tokens that makes re-applying an old one a no-op (a GitOps rollback
//! to an earlier manifest never triggers a resume).

/// How many handled tokens a session remembers (DESIGN §2: "a bounded list of recently handled
/// tokens"). A rollback further back than this resumes again.
pub const HANDLED_TOKENS_KEPT: usize = 16;

/// The longest annotation token the operator acts on. A longer one is refused without being
/// copied into status or Events (only [`handled_key`] of it is).
pub const MAX_TOKEN_BYTES: usize = 256;

/// Whether the annotation's `token` asks for a resume: it is not the request being handled
/// (`active`), nor the last handled one, nor one of the recently handled ones. A new token while
/// another is latched supersedes it (DESIGN §3).
pub fn is_new_resume_request(
    token: &str,
    active: Option<&str>,
    last_handled: Option<&str>,
    recently_handled: &[String],
) -> bool {
    let key = handled_key(token);
    active != Some(key.as_str())
        && last_handled != Some(key.as_str())
        && !recently_handled.contains(&key)
}

/// What status remembers of a token: the token itself, or for one longer than
/// [`MAX_TOKEN_BYTES`] a short fingerprint (its first 32 bytes on a character boundary, and its
/// length), so that a huge value is never copied and is refused once.
pub fn handled_key(token: &str) -> String {
    if token.len() <= MAX_TOKEN_BYTES {
        return token.to_string();
    }
    let mut end = 32;
    while !token.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…({} bytes)", &token[..end], token.len())
}

/// Records `token` as handled: once, newest last, at most [`HANDLED_TOKENS_KEPT`] (the oldest go).
pub fn remember_handled(recently_handled: &mut Vec<String>, token: &str) {
    recently_handled.retain(|t| t != token);
    recently_handled.push(token.to_string());
    let excess = recently_handled.len().saturating_sub(HANDLED_TOKENS_KEPT);
    recently_handled.drain(..excess);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(list: &[&str]) -> Vec<String> {
        list.iter().map(|t| t.to_string()).collect()
    }

    #[test]
    fn which_token_is_a_new_request() {
        /// (token, active, last handled, recently handled, new?)
        type Case<'a> = (
            &'a str,
            Option<&'a str>,
            Option<&'a str>,
            &'a [&'a str],
            bool,
        );
        let cases: [Case; 8] = [
            ("a", None, None, &[], true),
            ("b", None, Some("a"), &["a"], true),
            // The same token again: handled once (DESIGN §3).
            ("a", None, Some("a"), &["a"], false),
            // GitOps rollback: apply A, apply B, re-apply A.
            ("a", None, Some("b"), &["a", "b"], false),
            // Status written before the list existed: the last handled token still counts.
            ("a", None, Some("a"), &[], false),
            // A request is latched: a new token supersedes it, the same one is no news.
            ("c", Some("b"), Some("a"), &["a"], true),
            ("b", Some("b"), Some("a"), &["a"], false),
            // …and the superseded one, once remembered, is a no-op when re-applied.
            ("b", Some("c"), Some("b"), &["a", "b"], false),
        ];
        for (token, active, last, recent, want) in cases {
            assert_eq!(
                is_new_resume_request(token, active, last, &tokens(recent)),
                want,
                "token {token:?}, active {active:?}, last {last:?}, recent {recent:?}"
            );
        }
    }

    #[test]
    fn an_oversized_token_is_remembered_by_a_short_key() {
        let exact = "x".repeat(MAX_TOKEN_BYTES);
        assert_eq!(handled_key(&exact), exact);
        let huge = format!("{}{}", "é".repeat(20), "y".repeat(1 << 20));
        let key = handled_key(&huge);
        assert!(key.len() < 64, "{key}");
        assert!(key.starts_with(&"é".repeat(16)), "{key}");
        assert!(key.ends_with(&format!("({} bytes)", huge.len())), "{key}");
        // Refused once: the remembered key makes the same value no news.
        assert!(is_new_resume_request(&huge, None, None, &[]));
        assert!(!is_new_resume_request(&huge, None, Some(&key), &[]));
        assert!(!is_new_resume_request(&huge, None, None, &tokens(&[&key])));
    }

    #[test]
    fn handled_tokens_are_kept_once_newest_last_and_bounded() {
        let mut recent = Vec::new();
        remember_handled(&mut recent, "a");
        remember_handled(&mut recent, "b");
        remember_handled(&mut recent, "a");
        assert_eq!(recent, tokens(&["b", "a"]));
        for i in 0..HANDLED_TOKENS_KEPT + 3 {
            remember_handled(&mut recent, &format!("t{i}"));
        }
        assert_eq!(recent.len(), HANDLED_TOKENS_KEPT);
        assert_eq!(recent.first().map(String::as_str), Some("t3"));
        let last = format!("t{}", HANDLED_TOKENS_KEPT + 2);
        assert_eq!(recent.last(), Some(&last));
        // The oldest fell out of memory: re-applying it is a request again.
        assert!(is_new_resume_request("a", None, Some(&last), &recent));
        assert!(!is_new_resume_request("t3", None, Some(&last), &recent));
    }
}
