//! Bounds on the text an agent chooses (session ids, error messages, its name and version, its
//! configuration), applied with [`cap`] where that text enters the operator, so that nothing an
//! agent sends can swell a status, wedge its writes or lose an Event. The CRD status schema
//! carries the same bounds (`maxLength`, `maxItems`), so a writer that skips them fails loudly.

use std::borrow::Cow;

/// The longest ACP session id (resume token) the operator keeps. A longer one is not cut (a cut
/// id names no session): the answer that carries it is refused as malformed.
pub const SESSION_ID_MAX: usize = 128;
/// An error or warning text of the agent's (a JSON-RPC error message, a journal error).
pub const AGENT_TEXT_MAX: usize = 512;
/// An agent's name, title, version, or a configuration value or name.
pub const AGENT_NAME_MAX: usize = 128;
/// A `kandev.dev/prompted-at` value recorded as handled (a longer one is not recorded).
pub const NUDGE_MAX: usize = 128;
/// A branch name reported back (`spec.repository.branch` allows 255).
pub const BRANCH_MAX: usize = 255;
/// Configuration options, modes or models kept of an agent's session.
pub const CONFIG_ITEMS_MAX: usize = 64;
/// A message in status (`errorMessage`, a condition's message): the operator's words around
/// capped agent text.
pub const MESSAGE_MAX: usize = 2048;
/// An Event's note: the API server refuses a note over 1 KiB, and the Event with it.
pub const EVENT_NOTE_MAX: usize = 1000;

/// Why `id`, an ACP session id an agent chose, is not one the operator keeps: empty, longer than
/// [`SESSION_ID_MAX`], or holding control characters (it goes into messages, Events and logs).
pub fn session_id_problem(id: &str) -> Option<String> {
    if id.trim().is_empty() {
        Some("empty sessionId".to_string())
    } else if id.len() > SESSION_ID_MAX {
        Some(format!(
            "sessionId of {} bytes, longer than the {SESSION_ID_MAX} kept",
            id.len()
        ))
    } else if id.chars().any(char::is_control) {
        Some("sessionId with control characters".to_string())
    } else {
        None
    }
}

/// `text` cut to at most `max` bytes on a character boundary. A cut text ends in a marker that
/// counts inside `max` (`… [+123 bytes]`: how much was cut); below the marker's own length the
/// cut is unmarked.
pub fn cap(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let marker = |cut: usize| format!("… [+{cut} bytes]");
    // The marker is longest when the cut is: size the kept part for that one.
    let room = max.saturating_sub(marker(text.len()).len());
    let keep = floor_char_boundary(text, room);
    if room == 0 {
        return Cow::Owned(text[..floor_char_boundary(text, max)].to_string());
    }
    Cow::Owned(format!("{}{}", &text[..keep], marker(text.len() - keep)))
}

/// The largest index `<= at` that is a character boundary of `text`.
fn floor_char_boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// Drops the oldest of `items` (the front) until at most `max` are left.
pub fn keep_newest<T>(items: &mut Vec<T>, max: usize) {
    let excess = items.len().saturating_sub(max);
    items.drain(..excess);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn cuts_are_marked_inside_the_limit() {
        #[rustfmt::skip]
        let rows: &[(&str, usize, &str)] = &[
            ("short", 10, "short"),
            ("exactly10!", 10, "exactly10!"),
            ("0123456789abcdefghijklmnopqrstuvwxyz", 24, "012345678… [+27 bytes]"),
            // Multi-byte characters are never split.
            ("ééééééééééééééééééééé", 22, "ééé… [+36 bytes]"),
            // Below the marker's length, an unmarked cut.
            ("0123456789abcdefghijklmnopqrstuvwxyz", 5, "01234"),
        ];
        for (text, max, expected) in rows {
            assert_eq!(cap(text, *max), *expected, "{text:?} at {max}");
        }
    }

    #[test]
    fn session_ids_are_kept_whole_or_refused() {
        let long = "x".repeat(SESSION_ID_MAX + 1);
        #[rustfmt::skip]
        let rows: &[(&str, bool)] = &[
            ("b6f1c7de-6d2c-4d8f-9a55-0e3f2b7c9a10", true),
            ("ses_01JX8", true),
            (&long[..SESSION_ID_MAX], true),
            (&long, false),
            ("", false),
            ("  ", false),
            ("a\nb", false),
        ];
        for (id, kept) in rows {
            assert_eq!(session_id_problem(id).is_none(), *kept, "{id:?}");
        }
    }

    proptest! {
        #[test]
        fn never_over_the_limit_and_always_utf8(text in ".{0,300}", max in 0usize..200) {
            let capped = cap(&text, max);
            prop_assert!(capped.len() <= max || capped == text);
            prop_assert!(capped.len() <= text.len().max(max));
            if text.len() <= max {
                prop_assert_eq!(capped.as_ref(), text.as_str());
            } else {
                prop_assert!(capped.len() <= max);
            }
        }
    }

    #[test]
    fn keep_newest_drops_the_oldest() {
        let mut items = vec![1, 2, 3, 4];
        keep_newest(&mut items, 2);
        assert_eq!(items, [3, 4]);
        keep_newest(&mut items, 5);
        assert_eq!(items, [3, 4]);
        keep_newest(&mut items, 0);
        assert!(items.is_empty());
    }
}
