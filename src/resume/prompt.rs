//! Initial prompt dispatch (DESIGN §3, three-way): what a freshly booted agent gets first.

/// What to do right after `session/new` on a fresh start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InitialPrompt {
    /// Send the task description as the first prompt.
    Send(String),
    /// Boot idle, and wrap the user's next prompt once in the resume context
    /// (`needsResumeContext`), because the agent starts with no memory of the task.
    BootIdleNeedsResumeContext,
    /// Boot idle; nothing to send, nothing to inject.
    BootIdle,
}

/// DESIGN §3: `taskDescription` non-empty → send it; else history injection enabled and history
/// exists → mark `needsResumeContext` and boot idle; else boot idle.
///
/// "Non-empty" is judged after trimming, so a description of only whitespace (easy to produce
/// with YAML block scalars) is not sent; a real description is sent exactly as written.
pub fn dispatch_initial_prompt(
    task_description: &str,
    history_injection_enabled: bool,
    history_exists: bool,
) -> InitialPrompt {
    if !task_description.trim().is_empty() {
        InitialPrompt::Send(task_description.to_owned())
    } else if history_injection_enabled && history_exists {
        InitialPrompt::BootIdleNeedsResumeContext
    } else {
        InitialPrompt::BootIdle
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use InitialPrompt::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn three_way_dispatch() {
        let send = |text: &str| Send(text.to_owned());
        #[rustfmt::skip]
        let rows = [
            // §3 dispatch 1: taskDescription non-empty → send it, whatever the history.
            ("fix the bug", false, false, send("fix the bug")),
            ("fix the bug", true, true, send("fix the bug")),
            ("  indented\n", true, false, send("  indented\n")),
            // §3 dispatch 2: empty description + injection enabled + history → needsResumeContext.
            ("", true, true, BootIdleNeedsResumeContext),
            (" \n\t", true, true, BootIdleNeedsResumeContext),
            // §3 dispatch 3: otherwise boot idle.
            ("", true, false, BootIdle),
            ("", false, true, BootIdle),
            ("", false, false, BootIdle),
            ("\n", false, true, BootIdle),
        ];
        for (description, injection, history, expected) in rows {
            let got = dispatch_initial_prompt(description, injection, history);
            assert_eq!(
                got, expected,
                "{description:?} injection={injection} history={history}"
            );
        }
    }
}
