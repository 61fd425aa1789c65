//! Who may read `/metrics` (`--metrics-auth`). With `kubernetes`, a scrape needs a bearer token
//! that the API server authenticates (a TokenReview) and authorizes for `get` on the
//! non-resource URL `/metrics` (a SubjectAccessReview), as kube-rbac-proxy and controller-runtime's
//! secure metrics do: the RBAC that lets Prometheus scrape the API server's own `/metrics`
//! lets it scrape ours. `/healthz` and `/readyz` stay open (the kubelet's probes carry no token).
//!
//! The decisions are pure ([`bearer_token`], [`token_review`], [`access_review`], [`verdict`],
//! [`VerdictCache`]); [`Reviewer::check`] makes the two calls. A verdict is kept for
//! [`CACHE_TTL`] (at most [`CACHE_ENTRIES`] tokens; a review that could not be made is never
//! kept), and at most [`CONCURRENT_REVIEWS`] reviews run at once: a scraper costs the API server
//! two small requests per [`CACHE_TTL`], not per scrape, a flood of scrapes with new tokens waits
//! for its turn, and a revoked binding takes effect within [`CACHE_TTL`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::HeaderMap;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use kube::Client;
use kube::api::{Api, PostParams};

/// The path and verb a scraper must be allowed (RBAC `nonResourceURLs: ["/metrics"]`, `get`).
pub const METRICS_PATH: &str = "/metrics";
pub const METRICS_VERB: &str = "get";

/// How long the two reviews may take together before the scrape is answered 503.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// Who may read `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MetricsAuth {
    /// Anyone who reaches the port.
    #[default]
    Open,
    /// A bearer token the API server authenticates and authorizes for `get /metrics`.
    Kubernetes,
}

/// The outcome of the access check of one scrape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// 401: no usable bearer token, or the API server did not authenticate it.
    Unauthenticated(String),
    /// 403: authenticated as `user`, who may not get `/metrics`.
    Forbidden {
        user: String,
        reason: String,
    },
    /// 503: the reviews could not be made (API server unreachable, reviews not permitted).
    Unavailable(String),
}

/// Why a scrape carries no bearer token the operator can review.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("no Authorization header; send a bearer token")]
    Missing,
    #[error("more than one Authorization header")]
    Several,
    #[error("the Authorization header is not visible ASCII")]
    NotAscii,
    #[error("the Authorization header is not \"Bearer <token>\"")]
    NotBearer,
}

/// The token of an `Authorization: Bearer <token>` header (the scheme is case-insensitive).
pub fn bearer_token(headers: &HeaderMap) -> Result<&str, TokenError> {
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let value = match (values.next(), values.next()) {
        (None, _) => return Err(TokenError::Missing),
        (Some(_), Some(_)) => return Err(TokenError::Several),
        (Some(value), None) => value,
    };
    let value = value.to_str().map_err(|_| TokenError::NotAscii)?;
    match value.split_once(' ') {
        Some((scheme, token))
            if scheme.eq_ignore_ascii_case("bearer")
                && !token.trim().is_empty()
                && !token.trim().contains(' ') =>
        {
            Ok(token.trim())
        }
        _ => Err(TokenError::NotBearer),
    }
}

/// The TokenReview of `token`, for the API server's default audiences.
pub fn token_review(token: &str) -> TokenReview {
    TokenReview {
        spec: TokenReviewSpec {
            token: token.to_owned(),
            audiences: None,
        },
        ..Default::default()
    }
}

/// Whether the authenticated user of `status` may get `/metrics`: its user, groups, uid and
/// extra go into the review unchanged (impersonation-proof: it is the API server's answer).
pub fn access_review(status: &TokenReviewStatus) -> Option<SubjectAccessReview> {
    let user = status.user.as_ref()?;
    Some(SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            groups: user.groups.clone(),
            uid: user.uid.clone(),
            extra: user.extra.clone(),
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(METRICS_PATH.to_owned()),
                verb: Some(METRICS_VERB.to_owned()),
            }),
            resource_attributes: None,
        },
        ..Default::default()
    })
}

/// The verdict of the two reviews: `authorized` is `None` when the token was not authenticated
/// (the SubjectAccessReview is then never made).
pub fn verdict(
    authenticated: &TokenReviewStatus,
    authorized: Option<&SubjectAccessReviewStatus>,
) -> Verdict {
    let user = authenticated
        .user
        .as_ref()
        .and_then(|u| u.username.clone())
        .unwrap_or_default();
    if authenticated.authenticated != Some(true) || user.is_empty() {
        let why = authenticated
            .error
            .clone()
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| "the API server did not authenticate the token".to_owned());
        return Verdict::Unauthenticated(why);
    }
    match authorized {
        Some(status) if status.allowed && status.denied != Some(true) => Verdict::Allowed,
        Some(status) => Verdict::Forbidden {
            user,
            reason: status
                .reason
                .clone()
                .or_else(|| status.evaluation_error.clone())
                .unwrap_or_default(),
        },
        None => Verdict::Forbidden {
            user,
            reason: String::new(),
        },
    }
}

/// How long a verdict about a token is kept.
pub const CACHE_TTL: Duration = Duration::from_secs(10);
/// Tokens whose verdicts are kept at once.
pub const CACHE_ENTRIES: usize = 64;
/// Reviews made at once; more scrapes wait (their wait counts against [`REVIEW_TIMEOUT`]).
pub const CONCURRENT_REVIEWS: usize = 4;

/// Verdicts by token for a while: [`VerdictCache::get`] answers a token seen within the TTL,
/// [`VerdictCache::put`] keeps a verdict, dropping what expired and, when full, the oldest.
#[derive(Debug)]
pub struct VerdictCache {
    ttl: Duration,
    capacity: usize,
    entries: HashMap<String, (Instant, Verdict)>,
}

impl VerdictCache {
    pub fn new(ttl: Duration, capacity: usize) -> Self {
        Self {
            ttl,
            capacity,
            entries: HashMap::new(),
        }
    }

    /// The verdict kept for `token`, if it was reviewed less than the TTL before `now`.
    pub fn get(&self, token: &str, now: Instant) -> Option<Verdict> {
        self.entries
            .get(token)
            .filter(|(at, _)| now.saturating_duration_since(*at) < self.ttl)
            .map(|(_, verdict)| verdict.clone())
    }

    /// Keeps `verdict` for `token` from `now`; an unavailable review is not a verdict to keep.
    pub fn put(&mut self, token: &str, verdict: &Verdict, now: Instant) {
        if matches!(verdict, Verdict::Unavailable(_)) || self.capacity == 0 {
            return;
        }
        let ttl = self.ttl;
        self.entries
            .retain(|_, (at, _)| now.saturating_duration_since(*at) < ttl);
        if self.entries.len() >= self.capacity && !self.entries.contains_key(token) {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(token, _)| token.clone());
            if let Some(oldest) = oldest {
                self.entries.remove(&oldest);
            }
        }
        self.entries
            .insert(token.to_owned(), (now, verdict.clone()));
    }
}

/// Makes the reviews of scrapes: through `client`, cached, a few at a time.
pub struct Reviewer {
    client: Client,
    cache: Mutex<VerdictCache>,
    turns: tokio::sync::Semaphore,
}

impl Reviewer {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            cache: Mutex::new(VerdictCache::new(CACHE_TTL, CACHE_ENTRIES)),
            turns: tokio::sync::Semaphore::new(CONCURRENT_REVIEWS),
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, VerdictCache> {
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Asks the API server about the bearer token of a scrape (or answers from the cache).
    pub async fn check(&self, headers: &HeaderMap) -> Verdict {
        let token = match bearer_token(headers) {
            Ok(token) => token,
            Err(why) => return Verdict::Unauthenticated(why.to_string()),
        };
        if let Some(verdict) = self.cache().get(token, Instant::now()) {
            return verdict;
        }
        let reviewed = async {
            let _turn = self.turns.acquire().await;
            // Another scrape with this token may have been reviewed while this one waited.
            if let Some(verdict) = self.cache().get(token, Instant::now()) {
                return verdict;
            }
            review(&self.client, token).await
        };
        let verdict = match tokio::time::timeout(REVIEW_TIMEOUT, reviewed).await {
            Ok(verdict) => verdict,
            Err(_) => Verdict::Unavailable(format!(
                "the API server did not answer the token and access reviews within {}s",
                REVIEW_TIMEOUT.as_secs()
            )),
        };
        self.cache().put(token, &verdict, Instant::now());
        verdict
    }
}

async fn review(client: &Client, token: &str) -> Verdict {
    let tokens: Api<TokenReview> = Api::all(client.clone());
    let authenticated = match tokens
        .create(&PostParams::default(), &token_review(token))
        .await
    {
        Ok(review) => review.status.unwrap_or_default(),
        Err(error) => return Verdict::Unavailable(format!("TokenReview failed: {error}")),
    };
    let request = match access_review(&authenticated) {
        Some(request) if authenticated.authenticated == Some(true) => request,
        _ => return verdict(&authenticated, None),
    };
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    match reviews.create(&PostParams::default(), &request).await {
        Ok(review) => verdict(&authenticated, Some(&review.status.unwrap_or_default())),
        Err(error) => Verdict::Unavailable(format!("SubjectAccessReview failed: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use k8s_openapi::api::authentication::v1::UserInfo;
    use pretty_assertions::assert_eq;

    #[test]
    fn bearer_tokens() {
        let headers = |values: &[&str]| {
            let mut map = HeaderMap::new();
            for v in values {
                map.append(
                    http::header::AUTHORIZATION,
                    HeaderValue::from_str(v).expect("header"),
                );
            }
            map
        };
        #[rustfmt::skip]
        let rows: [(&[&str], Result<&str, &str>); 9] = [
            (&["Bearer abc.def"], Ok("abc.def")),
            (&["bearer abc"], Ok("abc")),
            (&["BEARER  abc "], Ok("abc")),
            (&[], Err("no Authorization header; send a bearer token")),
            (&["Bearer "], Err("the Authorization header is not \"Bearer <token>\"")),
            (&["Bearer"], Err("the Authorization header is not \"Bearer <token>\"")),
            (&["Basic dXNlcjpwYXNz"], Err("the Authorization header is not \"Bearer <token>\"")),
            (&["Bearer a b"], Err("the Authorization header is not \"Bearer <token>\"")),
            (&["Bearer a", "Bearer b"], Err("more than one Authorization header")),
        ];
        for (values, expected) in rows {
            let headers = headers(values);
            assert_eq!(
                bearer_token(&headers).map_err(|e| e.to_string()),
                expected.map_err(str::to_string),
                "{values:?}"
            );
        }
    }

    fn authenticated(user: &str) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(true),
            user: Some(UserInfo {
                username: Some(user.to_owned()),
                groups: Some(vec!["system:serviceaccounts".to_owned()]),
                uid: Some("u-1".to_owned()),
                extra: None,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_access_review_asks_about_get_metrics_for_the_reviewed_user() {
        let review = access_review(&authenticated("system:serviceaccount:mon:prometheus"))
            .expect("a user to review");
        assert_eq!(
            serde_json::to_value(review).expect("json"),
            serde_json::json!({
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "metadata": {},
                "spec": {
                    "user": "system:serviceaccount:mon:prometheus",
                    "groups": ["system:serviceaccounts"],
                    "uid": "u-1",
                    "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
                },
            })
        );
        assert_eq!(
            serde_json::to_value(token_review("t")).expect("json")["spec"],
            serde_json::json!({"token": "t"})
        );
    }

    #[test]
    fn verdicts() {
        let sar =
            |allowed: bool, denied: Option<bool>, reason: Option<&str>| SubjectAccessReviewStatus {
                allowed,
                denied,
                reason: reason.map(str::to_owned),
                evaluation_error: None,
            };
        let user = "system:serviceaccount:mon:prometheus";
        let not_authenticated = TokenReviewStatus {
            authenticated: Some(false),
            error: Some("token has expired".to_owned()),
            ..Default::default()
        };
        #[rustfmt::skip]
        let rows: Vec<(&str, TokenReviewStatus, Option<SubjectAccessReviewStatus>, Verdict)> = vec![
            ("allowed", authenticated(user), Some(sar(true, None, Some("RBAC: allowed"))), Verdict::Allowed),
            ("not allowed", authenticated(user), Some(sar(false, None, None)),
                Verdict::Forbidden { user: user.into(), reason: String::new() }),
            ("denied wins over allowed", authenticated(user), Some(sar(true, Some(true), Some("webhook"))),
                Verdict::Forbidden { user: user.into(), reason: "webhook".into() }),
            ("not authenticated", not_authenticated, None,
                Verdict::Unauthenticated("token has expired".into())),
            ("authenticated without a user name", TokenReviewStatus { authenticated: Some(true), ..Default::default() }, None,
                Verdict::Unauthenticated("the API server did not authenticate the token".into())),
            ("an empty review", TokenReviewStatus::default(), None,
                Verdict::Unauthenticated("the API server did not authenticate the token".into())),
        ];
        for (name, authenticated, authorized, expected) in rows {
            assert_eq!(
                verdict(&authenticated, authorized.as_ref()),
                expected,
                "{name}"
            );
        }
    }

    #[test]
    fn verdicts_are_kept_for_a_while_and_never_when_unavailable() {
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let mut cache = VerdictCache::new(Duration::from_secs(10), 2);
        let forbidden = Verdict::Forbidden {
            user: "u".into(),
            reason: String::new(),
        };
        cache.put("a", &Verdict::Allowed, at(0));
        cache.put("b", &forbidden, at(1));
        cache.put("c", &Verdict::Unavailable("down".into()), at(1));
        assert_eq!(
            cache.get("a", at(9)),
            Some(Verdict::Allowed),
            "within the TTL"
        );
        assert_eq!(cache.get("b", at(5)), Some(forbidden.clone()));
        assert_eq!(
            cache.get("c", at(1)),
            None,
            "an unavailable review is not kept"
        );
        assert_eq!(cache.get("a", at(10)), None, "expired");
        // Full: the oldest goes.
        cache.put("d", &Verdict::Allowed, at(2));
        assert_eq!(cache.get("a", at(3)), None);
        assert_eq!(cache.get("b", at(3)), Some(forbidden));
        assert_eq!(cache.get("d", at(3)), Some(Verdict::Allowed));
        // What expired makes room first.
        cache.put("e", &Verdict::Allowed, at(11));
        assert_eq!(
            cache.get("d", at(11)),
            Some(Verdict::Allowed),
            "kept: b expired"
        );
        assert_eq!(cache.get("e", at(11)), Some(Verdict::Allowed));
    }
}
