//! The pure rules of DESIGN §3: status evaluation, the resume-request handshake, the resume
//! request, ACP restore selection, restore error classification, the initial prompt dispatch and
//! the cause of a stalled launch, and the steady state of a session as a [`Transition`].
//!
//! Nothing here touches the cluster or an agent; callers gather facts, these functions decide,
//! and the tables in each file's tests map line by line to DESIGN §3.

mod approval;
mod classify;
mod end;
mod executor;
mod handshake;
mod journal;
mod launch;
mod launch_begin;
mod launch_end;
mod launch_stop;
mod objects;
mod observe;
mod prompt;
mod reach;
mod reader;
mod request;
mod rest;
mod restore;
mod route;
mod session_config;
mod stall;
mod status;
mod transition;

pub use approval::{AnswerStep, answer_step, gone_note, handled_value, permission_notes};
pub use classify::{RestoreErrorClass, classify_restore_error};
pub use end::{
    EndFacts, EndStep, deletes_workspace, end_step, end_word, ending_begun, ending_since,
    session_finished,
};
pub use executor::{
    AgentView, JournalNews, LaunchRecord, PermissionResolution, RESOLUTIONS_KEPT, ended,
    journal_update, launched, leftovers, merge_patch, unknown_to_schema,
};
pub use handshake::{
    HANDLED_TOKENS_KEPT, MAX_TOKEN_BYTES, RequestAnswer, answer_request, handled_key,
    is_new_resume_request, remember_handled,
};
pub mod defaults;
pub use journal::view_after;
pub use launch::{LaunchFacts, LaunchStep, launch_step, previous_pod_alive};
pub use launch_begin::{
    Begin, ClaimSeen, INITIAL_LAUNCH, UNKNOWN_PROFILE, WorkspaceFacts, WorkspaceStep,
    describe_launch, launch_begun, profile_wait, workspace_step, workspace_wait,
};
pub use launch_end::{
    AfterRestore, LaunchEnd, RestoreFacts, finish_request, launch_ended, restore_end, what_is_kept,
};
pub use launch_stop::{LaunchStop, Refusal, launch_stopped, refusal};
pub use objects::{SessionObjects, is_controlled_by};
pub use observe::observe;
pub use prompt::{InitialPrompt, dispatch_initial_prompt};
pub use reach::{
    LossCause, NodeHealth, Reach, ReachFacts, RunningRequest, judge, node_health, not_ready_since,
    running_request,
};
pub use reader::{ReaderFacts, ReaderPod, ReaderStep, ReaderWorkspace, reader_open, reader_step};
pub use request::{ResumeAction, ResumeRequest, ResumeRequestFacts, build_resume_request};
pub use rest::{RECHECK, Unrest, at_deadline, at_rest, bounded, loaded_at_rest, unrest};
pub use restore::{
    AgentRestoreCapabilities, FreshReason, NativeSessionResume, NextStep, RestoreMethod,
    RestoreOutcome, RestorePlan, next_step_after_failure, select_restore_method,
};
pub use route::{ending, launching, request_meets_running_pod};
pub use session_config::{
    Configured, ReportedConfig, SetBack, apply_config_update, configured, not_offered,
    reported_config, set_back, wanted_config,
};
pub use stall::{LaunchStall, checkout_stall, launch_stall, plain_stall, previous_pod_stall};
pub use status::{
    PodLiveness, ResumeEvaluation, SessionFacts, current_pod, evaluate_resume_eligibility,
    pod_liveness,
};
pub use transition::{Metric, NextAction, Note, Requeue, ResumeOutcome, Transition};
