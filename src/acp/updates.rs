//! `session/update` notifications as the client hands them out.

use agent_client_protocol::v1::schema::SessionNotification;
use serde_json::Value;

/// One `session/update` notification from the agent.
///
/// Kept as raw JSON plus the two fields everyone needs, rather than as the schema's
/// [`SessionNotification`]: agents add update kinds faster than the schema crate we pin (the
/// `SessionUpdate` enum is closed at any given version), and a restore or a history recorder
/// must not drop or choke on an update just because its kind is newer than our types.
/// [`Self::notification`] gives the typed view when it parses.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionUpdateEvent {
    /// `params.sessionId`.
    pub session_id: String,
    /// `params.update.sessionUpdate`, e.g. `user_message_chunk`, `agent_message_chunk`,
    /// `tool_call`; empty when the agent omitted it.
    pub kind: String,
    /// The notification's whole `params` object.
    pub params: Value,
}

impl SessionUpdateEvent {
    /// Builds the event from a notification's params; `None` when they lack a session id or an
    /// update object (such a notification cannot be attributed to a session).
    pub(crate) fn from_params(params: &Value) -> Option<Self> {
        let session_id = params.get("sessionId")?.as_str()?.to_owned();
        let update = params.get("update").filter(|u| u.is_object())?;
        let kind = update
            .get("sessionUpdate")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        Some(Self {
            session_id,
            kind,
            params: params.clone(),
        })
    }

    /// The typed notification, when this update kind is known to the pinned schema.
    pub fn notification(&self) -> Result<SessionNotification, serde_json::Error> {
        serde_json::from_value(self.params.clone())
    }

    /// The text of a message chunk (`update.content` of type `text`), if this is one.
    pub fn text(&self) -> Option<&str> {
        let content = self.params.get("update")?.get("content")?;
        if content.get("type")?.as_str()? != "text" {
            return None;
        }
        content.get("text")?.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_client_protocol::v1::schema::SessionUpdate;
    use serde_json::json;

    #[test]
    fn typed_view_and_text() {
        let params = json!({"sessionId": "s", "update": {"sessionUpdate": "user_message_chunk",
            "content": {"type": "text", "text": "What's the capital of France?"}}});
        let event = SessionUpdateEvent::from_params(&params).expect("event");
        assert_eq!(event.kind, "user_message_chunk");
        assert_eq!(event.text(), Some("What's the capital of France?"));
        let typed = event.notification().expect("typed");
        assert!(matches!(typed.update, SessionUpdate::UserMessageChunk(_)));
    }

    #[test]
    fn unknown_kinds_are_kept_even_if_untyped() {
        let params =
            json!({"sessionId": "s", "update": {"sessionUpdate": "brand_new_kind", "x": 1}});
        let event = SessionUpdateEvent::from_params(&params).expect("event");
        assert_eq!(event.kind, "brand_new_kind");
        assert!(event.notification().is_err());
        assert_eq!(event.text(), None);
    }

    #[test]
    fn unattributable_updates_are_rejected() {
        assert!(SessionUpdateEvent::from_params(&json!({"update": {}})).is_none());
        assert!(SessionUpdateEvent::from_params(&json!({"sessionId": "s"})).is_none());
        assert!(SessionUpdateEvent::from_params(&json!({"sessionId": 3, "update": {}})).is_none());
    }
}
