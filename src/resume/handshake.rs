//! The resume-request handshake of DESIGN §3: which annotation token is a new request, and the
//! bounded memory of handled tokens that makes re-applying an old one a no-op (a GitOps rollback
//! to an earlier manifest never triggers a resume).

/// How many handled tokens a session remembers (DESIGN §2: "a bounded list of recently handled
/// tokens"). A rollback further back than this resumes again.
pub const HANDLED_TOKENS_KEPT: usize = 16;

/// Whether the annotation's `token` asks for a resume: no request is being handled (`active`),
/// and the token is neither the last handled one nor one of the recently handled ones.
pub fn is_new_resume_request(
    token: &str,
    active: Option<&str>,
    last_handled: Option<&str>,
    recently_handled: &[String],
) -> bool {
    active.is_none() && last_handled != Some(token) && !recently_handled.iter().any(|t| t == token)
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
        let cases: [Case; 7] = [
            ("a", None, None, &[], true),
            ("b", None, Some("a"), &["a"], true),
            // The same token again: handled once (DESIGN §3).
            ("a", None, Some("a"), &["a"], false),
            // GitOps rollback: apply A, apply B, re-apply A.
            ("a", None, Some("b"), &["a", "b"], false),
            // Status written before the list existed: the last handled token still counts.
            ("a", None, Some("a"), &[], false),
            // A request is latched: later tokens wait until it ends.
            ("c", Some("b"), Some("a"), &["a"], false),
            ("b", Some("b"), Some("a"), &["a"], false),
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
