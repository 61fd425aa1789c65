//! Which command `agentctl serve` starts (pure, so the choice is table-tested).

use std::collections::BTreeMap;

use super::AgentctlError;
use crate::agents::AgentProfile;

/// The agent process to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchPlan {
    pub argv: Vec<String>,
    /// Extra environment from the profile.
    pub env: BTreeMap<String, String>,
    /// The argv is the profile's CLI resume command for the resume token.
    pub via_cli_resume: bool,
}

/// Picks the agent command:
/// 1. an explicit command after `--` wins (the most specific thing the user said; the profile
///    then only contributes its environment and capabilities);
/// 2. a resume token for a profile that restores by command-line flags (it has `cliResume`
///    and `nativeSessionResume: false`) → the profile's CLI resume command;
/// 3. the profile's ACP launch command.
pub fn plan_launch(
    profile: Option<&AgentProfile>,
    explicit: &[String],
    resume_token: Option<&str>,
) -> Result<LaunchPlan, AgentctlError> {
    let env = profile.map(|p| p.env.clone()).unwrap_or_default();
    if !explicit.is_empty() {
        if resume_token.is_some() && profile.is_some_and(|p| p.cli_resume.is_some()) {
            tracing::info!(
                "explicit agent command given: the profile's CLI resume flags are not applied"
            );
        }
        return Ok(LaunchPlan {
            argv: explicit.to_vec(),
            env,
            via_cli_resume: false,
        });
    }
    let profile = profile.ok_or(AgentctlError::NoCommand)?;
    let cli_resume = resume_token
        .filter(|_| !profile.native_session_resume.restores_natively())
        .and_then(|token| profile.cli_resume_command(token));
    let (argv, via_cli_resume) = match cli_resume {
        Some(argv) => (argv, true),
        None => (profile.launch.clone(), false),
    };
    if argv.is_empty() {
        return Err(AgentctlError::NoCommand);
    }
    Ok(LaunchPlan {
        argv,
        env,
        via_cli_resume,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn argv(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    fn profile(native: bool, cli_resume: Option<&[&str]>) -> AgentProfile {
        AgentProfile {
            name: "p".into(),
            launch: argv(&["agent", "--acp"]),
            native_session_resume: native.into(),
            history_context_injection: !native,
            cli_resume: cli_resume.map(argv),
            env: BTreeMap::from([("MODE".to_string(), "acp".to_string())]),
        }
    }

    /// (native, cliResume, explicit, token, expected argv, via cli resume)
    type LaunchRow = (
        bool,
        Option<&'static [&'static str]>,
        &'static [&'static str],
        Option<&'static str>,
        &'static [&'static str],
        bool,
    );

    #[test]
    fn launch_table() {
        let cli: &[&str] = &["agent", "continue", "{token}"];
        #[rustfmt::skip]
        let rows: [LaunchRow; 7] = [
            (true, Some(cli), &[], None, &["agent", "--acp"], false),
            (true, Some(cli), &[], Some("T"), &["agent", "--acp"], false), // restores over ACP
            (false, Some(cli), &[], Some("T"), &["agent", "continue", "T"], true),
            (false, Some(cli), &[], None, &["agent", "--acp"], false),
            (false, None, &[], Some("T"), &["agent", "--acp"], false),     // nothing to resume by
            (false, Some(cli), &["x", "y"], Some("T"), &["x", "y"], false), // explicit wins
            (true, None, &["x"], None, &["x"], false),
        ];
        for (native, cli_resume, explicit, token, expected, via) in rows {
            let p = profile(native, cli_resume);
            let plan = plan_launch(Some(&p), &argv(explicit), token);
            let plan = match plan {
                Ok(plan) => plan,
                Err(e) => panic!("{e}"),
            };
            assert_eq!(plan.argv, argv(expected));
            assert_eq!(plan.via_cli_resume, via);
            assert_eq!(plan.env.get("MODE").map(String::as_str), Some("acp"));
        }
    }

    #[test]
    fn auto_native_resume_restores_over_acp_not_by_cli_flags() {
        let mut p = profile(true, Some(&["agent", "continue", "{token}"]));
        p.native_session_resume = crate::resume::NativeSessionResume::Auto;
        let plan =
            plan_launch(Some(&p), &[], Some("T")).map(|plan| (plan.argv, plan.via_cli_resume));
        assert_eq!(plan.ok(), Some((argv(&["agent", "--acp"]), false)));
    }

    #[test]
    fn explicit_command_without_profile_and_nothing_at_all() {
        let plan = plan_launch(None, &argv(&["a", "b"]), Some("T"));
        assert_eq!(
            plan.map(|p| (p.argv, p.env.len())).ok(),
            Some((argv(&["a", "b"]), 0))
        );
        assert!(matches!(
            plan_launch(None, &[], None),
            Err(AgentctlError::NoCommand)
        ));
    }
}
