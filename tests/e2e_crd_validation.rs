//! The TaskSession CRD refuses, at admission, every input that would otherwise become an agent
//! pod (or PVC) that the API server refuses with 422 again and again (issue #13 item 4).
//!
//! One table of bad sessions, each a valid session with one field broken, and the message the
//! API server must answer with. Two tiers use it:
//! - plain `cargo test`: every expected message is a rule (or `maxLength`) of the schema that
//!   the Rust types generate, at the field the case breaks, and every rule of the spec has a case;
//! - `bash e2e/test.sh crd`: each case goes through `kubectl apply --dry-run=server -f -` against
//!   the real API server and must be refused with its message; the valid edge cases and every
//!   TaskSession example of the docs must be accepted (the examples named `*-invalid.yaml` must be
//!   refused with the messages they are about).
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod e2e_support;

use e2e_support::support::process::run_with_stdin;
use e2e_support::{client_with_crds, kubectl, repo_path, unique};
use kandev_operator::api::TaskSession;
use kandev_operator::api::pod_contract::CheckoutStart;
use kube::CustomResourceExt;
use serde_json::{Value, json};

/// Where the dry runs go (it always exists; nothing is ever created).
const NS: &str = "default";

/// What the API server must say about a refused case.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// The message of one of the CRD's `x-kubernetes-validations` rules.
    Rule(&'static str),
    /// The schema's `maxLength` of the field.
    MaxLength(usize),
}

struct Refused {
    /// What is wrong, for failure messages.
    what: &'static str,
    /// Merged into [`valid_session`] (objects are merged, anything else replaces).
    patch: Value,
    /// The field the API server names, as it prints it (`spec.credentials[0].env`); empty for
    /// a rule on the whole object.
    field: &'static str,
    expect: Expect,
}

const ENV_RESERVED: &str = "credentials[].env must not be HOME, PATH or start with KANDEV_ or GIT_CONFIG_: the operator sets those";
const ENV_NAME: &str = "credentials[].env must be a valid environment variable name";
const SECRET_NAME: &str = "credentials[].secretName must be a Secret name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit";
const SECRET_KEY: &str = "credentials[].key must be a Secret data key: letters, digits, '-', '_' and '.', not '.' or '..' and not starting with '..'";
const MOUNT_ABSOLUTE: &str = "mountPath must be an absolute path";
const MOUNT_ROOT_OR_TRAILING: &str = "mountPath must not be / and must not end with /";
const MOUNT_NORMALISED: &str = "mountPath must be normalised: no //, /./ or /../ in it";
const MOUNT_RESERVED: &str = "mountPath must not be /tmp, /run/kandev or below them: the operator mounts its own volumes there";
const CLAIM_NAME: &str = "workspace.claimName must be a PVC name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit";
const WORKSPACE_ONE_OF: &str = "workspace needs exactly one of claimName or template";
const SIZE_QUANTITY: &str = "workspace.template.size must be a Kubernetes quantity such as 10Gi";
const SIZE_POSITIVE: &str = "workspace.template.size must be greater than zero";
const ACCESS_MODES: &str = "workspace.template.accessModes must be ReadWriteOnce, ReadOnlyMany, ReadWriteMany or ReadWriteOncePod";
const ACCESS_MODE_RWOP: &str =
    "workspace.template.accessModes: ReadWriteOncePod cannot be combined with other access modes";
const STORAGE_CLASS: &str = "workspace.template.storageClassName must be a StorageClass name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit";
const RESOURCE_CLAIMS: &str =
    "resources.claims is not supported: agent pods have no resource claims";
const RESOURCE_NAMES: &str =
    "resources.requests and resources.limits may only name cpu, memory and ephemeral-storage";
const RESOURCE_QUANTITIES: &str =
    "resources.requests and resources.limits must be Kubernetes quantities such as 500m, 2 or 1Gi";
const RESOURCE_NEGATIVE: &str = "resources.requests and resources.limits must not be negative";
const RESOURCE_OVER_LIMIT: &str = "resources.requests must not exceed resources.limits";
const IMAGE_EMPTY: &str = "image must not be empty: omit it to use the operator's default image";
const IMAGE_WHITESPACE: &str = "image must not have leading or trailing whitespace";
const TASK_ID_EMPTY: &str = "taskId must not be empty";
const IDLE: &str = "idle.suspendAfter must be off or a duration of at least 10s, e.g. 30m or 1h30m";
const ASK_TIMEOUT: &str =
    "permissions.askTimeout must be off or a duration of at least 10s, e.g. 15m";
const CONFIG_OPTIONS: &str =
    "sessionConfig.options holds at most 16 options, ids and values of at most 128 characters";
const AGENT_NAME: &str = "agent must be a profile name: lowercase letters, digits and '-'";
const REPOSITORY_URL: &str = "repository.url must be https://host/path, ssh://host/path, git://host/path or git@host:path (file:// and local paths are not allowed)";
const BRANCH: &str = "repository.branch and repository.baseBranch must be Git branch names: not empty, not starting with '-', without '..', whitespace or any of ~ ^ : ? * [ \\";
const URL_PASSWORD: &str = "repository.url must not carry a password: put it in a Secret and name it in repository.credentials";
const GIT_CREDENTIALS: &str =
    "repository.credentials needs passwordKey (HTTPS), sshKeyKey (SSH) or caBundleKey";
const SSH_PAIR: &str = "repository.credentials: sshKeyKey and knownHostsKey go together (host keys are always checked)";
const GIT_SECRET_NAME: &str = "repository.credentials.secretName must be a Secret name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit";
const GIT_SECRET_KEY: &str = "repository.credentials keys must be Secret data keys: letters, digits, '-', '_' and '.', not '.' or '..' and not starting with '..'";
const USERNAME_NEEDS_PASSWORD: &str = "repository.credentials: usernameKey needs passwordKey";
const NAME_FOR_PVC: &str = "a TaskSession with workspace.template needs a name of at most 243 characters: its PVC is named <name>-workspace";

/// The smallest valid session; every case breaks one thing in it.
fn valid_session(name: &str) -> Value {
    json!({
        "apiVersion": "kandev.dev/v1alpha1",
        "kind": "TaskSession",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "taskId": "CRD-1",
            "agent": "claude-code",
            "taskDescription": "Validate me.",
            "workspace": {"template": {"size": "1Gi"}},
        }
    })
}

/// Deep merge of `patch` into `base`: objects field by field, `null` removes, the rest replaces.
fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(base), Value::Object(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    base.remove(key);
                } else {
                    merge(base.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        (base, patch) => *base = patch.clone(),
    }
}

fn credential(env: &str, secret_name: &str, key: &str) -> Value {
    json!({"spec": {"credentials": [{"env": env, "secretName": secret_name, "key": key}]}})
}

fn mount_path(path: &str) -> Value {
    json!({"spec": {"workspace": {"mountPath": path}}})
}

fn template(template: Value) -> Value {
    json!({"spec": {"workspace": {"template": template}}})
}

fn resources(resources: Value) -> Value {
    json!({"spec": {"resources": resources}})
}

fn repository(repository: Value) -> Value {
    json!({"spec": {"repository": repository}})
}

fn git_credentials(credentials: Value) -> Value {
    repository(json!({"url": "https://example.com/app.git", "credentials": credentials}))
}

fn spec(field: &str, value: Value) -> Value {
    json!({"spec": {field: value}})
}

fn long(n: usize) -> String {
    "a".repeat(n)
}

#[rustfmt::skip]
fn refused_cases() -> Vec<Refused> {
    use Expect::{MaxLength, Rule};
    let case = |what, patch, field, expect| Refused {
        what,
        patch,
        field,
        expect,
    };
    vec![
        // credentials[]
        case("env HOME", credential("HOME", "keys", "api-key"), "spec.credentials[0].env", Rule(ENV_RESERVED)),
        case("env PATH", credential("PATH", "keys", "api-key"), "spec.credentials[0].env", Rule(ENV_RESERVED)),
        case("env set by the operator", credential("KANDEV_SESSION_NAME", "keys", "api-key"), "spec.credentials[0].env", Rule(ENV_RESERVED)),
        case("env with the KANDEV_ prefix", credential("KANDEV_ANYTHING", "keys", "api-key"), "spec.credentials[0].env", Rule(ENV_RESERVED)),
        case("env with the GIT_CONFIG_ prefix", credential("GIT_CONFIG_ANYTHING", "keys", "api-key"), "spec.credentials[0].env", Rule(ENV_RESERVED)),
        case("env starting with a digit", credential("1TOKEN", "keys", "api-key"), "spec.credentials[0].env", Rule(ENV_NAME)),
        case("env too long", credential(&"A".repeat(129), "keys", "api-key"), "spec.credentials[0].env", MaxLength(128)),
        case("secretName with capitals", credential("TOKEN", "My_Secret", "api-key"), "spec.credentials[0].secretName", Rule(SECRET_NAME)),
        case("secretName starting with '-'", credential("TOKEN", "-keys", "api-key"), "spec.credentials[0].secretName", Rule(SECRET_NAME)),
        case("secretName empty", credential("TOKEN", "", "api-key"), "spec.credentials[0].secretName", Rule(SECRET_NAME)),
        case("secretName too long", credential("TOKEN", &long(254), "api-key"), "spec.credentials[0].secretName", MaxLength(253)),
        case("key with '/'", credential("TOKEN", "keys", "a/b"), "spec.credentials[0].key", Rule(SECRET_KEY)),
        case("key '.'", credential("TOKEN", "keys", "."), "spec.credentials[0].key", Rule(SECRET_KEY)),
        case("key '..'", credential("TOKEN", "keys", ".."), "spec.credentials[0].key", Rule(SECRET_KEY)),
        case("key starting with '..'", credential("TOKEN", "keys", "..data"), "spec.credentials[0].key", Rule(SECRET_KEY)),
        case("key empty", credential("TOKEN", "keys", ""), "spec.credentials[0].key", Rule(SECRET_KEY)),
        case("key too long", credential("TOKEN", "keys", &long(254)), "spec.credentials[0].key", MaxLength(253)),
        // workspace.mountPath
        case("relative mountPath", mount_path("workspace"), "spec.workspace.mountPath", Rule(MOUNT_ABSOLUTE)),
        case("mountPath /", mount_path("/"), "spec.workspace.mountPath", Rule(MOUNT_ROOT_OR_TRAILING)),
        case("mountPath with a trailing /", mount_path("/workspace/"), "spec.workspace.mountPath", Rule(MOUNT_ROOT_OR_TRAILING)),
        case("mountPath with //", mount_path("/work//space"), "spec.workspace.mountPath", Rule(MOUNT_NORMALISED)),
        case("mountPath with /./", mount_path("/work/./space"), "spec.workspace.mountPath", Rule(MOUNT_NORMALISED)),
        case("mountPath with /../", mount_path("/work/../space"), "spec.workspace.mountPath", Rule(MOUNT_NORMALISED)),
        case("mountPath ending in /..", mount_path("/work/.."), "spec.workspace.mountPath", Rule(MOUNT_NORMALISED)),
        case("mountPath ending in /.", mount_path("/work/."), "spec.workspace.mountPath", Rule(MOUNT_NORMALISED)),
        case("mountPath /tmp", mount_path("/tmp"), "spec.workspace.mountPath", Rule(MOUNT_RESERVED)),
        case("mountPath below /tmp", mount_path("/tmp/work"), "spec.workspace.mountPath", Rule(MOUNT_RESERVED)),
        case("mountPath /run/kandev", mount_path("/run/kandev"), "spec.workspace.mountPath", Rule(MOUNT_RESERVED)),
        case("mountPath below /run/kandev", mount_path("/run/kandev/work"), "spec.workspace.mountPath", Rule(MOUNT_RESERVED)),
        case("mountPath too long", mount_path(&format!("/{}", long(1024))), "spec.workspace.mountPath", MaxLength(1024)),
        // workspace claim / template
        case("claimName with capitals", json!({"spec": {"workspace": {"template": null, "claimName": "My_Claim"}}}), "spec.workspace.claimName", Rule(CLAIM_NAME)),
        case("claimName too long", json!({"spec": {"workspace": {"template": null, "claimName": long(254)}}}), "spec.workspace.claimName", MaxLength(253)),
        case("both claimName and template", json!({"spec": {"workspace": {"claimName": "existing"}}}), "spec.workspace", Rule(WORKSPACE_ONE_OF)),
        case("neither claimName nor template", json!({"spec": {"workspace": {"template": null}}}), "spec.workspace", Rule(WORKSPACE_ONE_OF)),
        case("size not a quantity", template(json!({"size": "ten gigs"})), "spec.workspace.template.size", Rule(SIZE_QUANTITY)),
        case("size with a unit typo", template(json!({"size": "10GB"})), "spec.workspace.template.size", Rule(SIZE_QUANTITY)),
        case("size zero", template(json!({"size": "0"})), "spec.workspace.template.size", Rule(SIZE_POSITIVE)),
        case("size negative", template(json!({"size": "-1Gi"})), "spec.workspace.template.size", Rule(SIZE_POSITIVE)),
        case("unknown access mode", template(json!({"size": "1Gi", "accessModes": ["ReadWriteAlways"]})), "spec.workspace.template.accessModes", Rule(ACCESS_MODES)),
        case("access mode in lowercase", template(json!({"size": "1Gi", "accessModes": ["readwriteonce"]})), "spec.workspace.template.accessModes", Rule(ACCESS_MODES)),
        case("ReadWriteOncePod with another mode", template(json!({"size": "1Gi", "accessModes": ["ReadWriteOncePod", "ReadOnlyMany"]})), "spec.workspace.template.accessModes", Rule(ACCESS_MODE_RWOP)),
        case("storageClassName with capitals", template(json!({"size": "1Gi", "storageClassName": "Fast_SSD"})), "spec.workspace.template.storageClassName", Rule(STORAGE_CLASS)),
        // resources
        case("request not a quantity", resources(json!({"requests": {"cpu": "two"}})), "spec.resources", Rule(RESOURCE_QUANTITIES)),
        case("limit not a quantity", resources(json!({"limits": {"memory": "1 Gi"}})), "spec.resources", Rule(RESOURCE_QUANTITIES)),
        case("negative request", resources(json!({"requests": {"memory": "-1Gi"}})), "spec.resources", Rule(RESOURCE_NEGATIVE)),
        case("negative integer limit", resources(json!({"limits": {"cpu": -1}})), "spec.resources", Rule(RESOURCE_NEGATIVE)),
        case("request over its limit", resources(json!({"requests": {"cpu": 2}, "limits": {"cpu": "1500m"}})), "spec.resources", Rule(RESOURCE_OVER_LIMIT)),
        case("extended resource", resources(json!({"limits": {"nvidia.com/gpu": 1}})), "spec.resources", Rule(RESOURCE_NAMES)),
        case("unknown resource", resources(json!({"requests": {"gpu": 1}})), "spec.resources", Rule(RESOURCE_NAMES)),
        case("resource claims", resources(json!({"claims": [{"name": "gpu"}]})), "spec.resources", Rule(RESOURCE_CLAIMS)),
        // image
        case("empty image", spec("image", json!("")), "spec.image", Rule(IMAGE_EMPTY)),
        case("image with a leading space", spec("image", json!(" ghcr.io/kandev/agentctl:1")), "spec.image", Rule(IMAGE_WHITESPACE)),
        case("image too long", spec("image", json!(long(1025))), "spec.image", MaxLength(1024)),
        // taskDescription, taskId, agent
        case("taskDescription over 64 KiB", spec("taskDescription", json!(long(65537))), "spec.taskDescription", MaxLength(65536)),
        case("empty taskId", spec("taskId", json!("")), "spec.taskId", Rule(TASK_ID_EMPTY)),
        case("taskId too long", spec("taskId", json!(long(254))), "spec.taskId", MaxLength(253)),
        case("agent with capitals", spec("agent", json!("Claude_Code")), "spec.agent", Rule(AGENT_NAME)),
        // repository
        case("file:// URL", repository(json!({"url": "file:///srv/git/app.git"})), "spec.repository.url", Rule(REPOSITORY_URL)),
        case("local path URL", repository(json!({"url": "/srv/git/app.git"})), "spec.repository.url", Rule(REPOSITORY_URL)),
        case("plain http URL", repository(json!({"url": "http://example.com/app.git"})), "spec.repository.url", Rule(REPOSITORY_URL)),
        case("URL without a host", repository(json!({"url": "https://"})), "spec.repository.url", Rule(REPOSITORY_URL)),
        case("URL without a path", repository(json!({"url": "https://example.com"})), "spec.repository.url", Rule(REPOSITORY_URL)),
        case("scp-style URL without a path", repository(json!({"url": "git@example.com"})), "spec.repository.url", Rule(REPOSITORY_URL)),
        case("URL with a space", repository(json!({"url": "https://example.com/my app.git"})), "spec.repository.url", Rule(REPOSITORY_URL)),
        case("URL too long", repository(json!({"url": format!("https://example.com/{}", long(2030))})), "spec.repository.url", MaxLength(2048)),
        case("branch like an option", repository(json!({"url": "https://example.com/app.git", "branch": "-rf"})), "spec.repository.branch", Rule(BRANCH)),
        case("branch with ..", repository(json!({"url": "https://example.com/app.git", "branch": "a..b"})), "spec.repository.branch", Rule(BRANCH)),
        case("empty branch", repository(json!({"url": "https://example.com/app.git", "branch": ""})), "spec.repository.branch", Rule(BRANCH)),
        case("baseBranch with a space", repository(json!({"url": "https://example.com/app.git", "baseBranch": "main branch"})), "spec.repository.baseBranch", Rule(BRANCH)),
        case("password in the URL", repository(json!({"url": "https://bob:s3cret@example.com/app.git"})), "spec.repository.url", Rule(URL_PASSWORD)),
        case("git credentials without a password or key", repository(json!({"url": "https://example.com/app.git", "credentials": {"secretName": "git"}})), "spec.repository.credentials", Rule(GIT_CREDENTIALS)),
        case("SSH key without known_hosts", repository(json!({"url": "git@example.com:app.git", "credentials": {"secretName": "git", "sshKeyKey": "id"}})), "spec.repository.credentials", Rule(SSH_PAIR)),
        case("git user name without a password", repository(json!({"url": "git@example.com:app.git", "credentials": {"secretName": "git", "usernameKey": "u", "sshKeyKey": "id", "knownHostsKey": "kh"}})), "spec.repository.credentials", Rule(USERNAME_NEEDS_PASSWORD)),
        case("git Secret name with capitals", git_credentials(json!({"secretName": "Git", "passwordKey": "token"})), "spec.repository.credentials.secretName", Rule(GIT_SECRET_NAME)),
        case("git usernameKey with a slash", git_credentials(json!({"secretName": "git", "usernameKey": "a/b", "passwordKey": "token"})), "spec.repository.credentials.usernameKey", Rule(GIT_SECRET_KEY)),
        case("git passwordKey ..", git_credentials(json!({"secretName": "git", "passwordKey": ".."})), "spec.repository.credentials.passwordKey", Rule(GIT_SECRET_KEY)),
        case("git sshKeyKey with a space", git_credentials(json!({"secretName": "git", "sshKeyKey": "id rsa", "knownHostsKey": "kh"})), "spec.repository.credentials.sshKeyKey", Rule(GIT_SECRET_KEY)),
        case("git knownHostsKey .", git_credentials(json!({"secretName": "git", "sshKeyKey": "id", "knownHostsKey": "."})), "spec.repository.credentials.knownHostsKey", Rule(GIT_SECRET_KEY)),
        case("git caBundleKey starting with ..", git_credentials(json!({"secretName": "git", "caBundleKey": "..ca"})), "spec.repository.credentials.caBundleKey", Rule(GIT_SECRET_KEY)),
        case("baseBranch with a backslash", repository(json!({"url": "https://example.com/app.git", "baseBranch": "a\\b"})), "spec.repository.baseBranch", Rule(BRANCH)),
        // idle
        case("suspendAfter under 10s", json!({"spec": {"idle": {"suspendAfter": "9s"}}}), "spec.idle.suspendAfter", Rule(IDLE)),
        case("suspendAfter 0m0s", json!({"spec": {"idle": {"suspendAfter": "0m0s"}}}), "spec.idle.suspendAfter", Rule(IDLE)),
        // permissions and sessionConfig
        case("askTimeout under 10s", json!({"spec": {"permissions": {"askTimeout": "5s"}}}), "spec.permissions.askTimeout", Rule(ASK_TIMEOUT)),
        case("17 config options", json!({"spec": {"sessionConfig": {"options": (0..17).map(|i| (format!("o{i}"), json!("v"))).collect::<serde_json::Map<_, _>>()}}}), "spec.sessionConfig.options", Rule(CONFIG_OPTIONS)),
        case("a config value too long", json!({"spec": {"sessionConfig": {"options": {"effort": long(129)}}}}), "spec.sessionConfig.options", Rule(CONFIG_OPTIONS)),
        // the whole object
        case("name too long for <name>-workspace", json!({"metadata": {"name": long(244)}}), "", Rule(NAME_FOR_PVC)),
    ]
}

/// Valid edge values: each must be accepted (the rules must not refuse what works).
#[rustfmt::skip]
fn accepted_cases() -> Vec<(&'static str, Value)> {
    vec![
        ("every field set", json!({"spec": {
            "image": "ghcr.io/kandev/agentctl@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "taskDescription": long(65536),
            "taskId": long(253),
            "workspace": {"mountPath": "/home/agent/work", "template": {
                "size": "10Gi", "storageClassName": "fast-ssd.example.com",
                "accessModes": ["ReadWriteMany", "ReadOnlyMany"]}},
            "repository": {"url": "https://github.com/kandev/kandev.git", "branch": "feature/crd-validation", "baseBranch": "main"},
            "credentials": [
                {"env": "ANTHROPIC_API_KEY", "secretName": "anthropic", "key": "api-key"},
                {"env": "_token", "secretName": "registry.creds", "key": ".dockerconfigjson"},
                {"env": "HOMEBREW_PREFIX", "secretName": "a", "key": "x_y-z.1"},
                {"env": "MY_KANDEV_TOKEN", "secretName": long(253), "key": long(253)},
            ],
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi", "ephemeral-storage": "1Gi"},
                          "limits": {"cpu": 2, "memory": "1Gi"}},
            "capabilities": {"nativeSessionResume": true, "historyContextInjection": false},
        }})),
        ("requests only", resources(json!({"requests": {"cpu": 1, "memory": "512Mi"}}))),
        ("suspendAfter off", json!({"spec": {"idle": {"suspendAfter": "off"}}})),
        ("suspendAfter 10s", json!({"spec": {"idle": {"suspendAfter": "10s"}}})),
        ("suspendAfter 1h30m", json!({"spec": {"idle": {"suspendAfter": "1h30m"}}})),
        ("a permission policy", json!({"spec": {"permissions": {"default": "deny", "askTimeout": "off",
            "rules": [{"kinds": ["read", "switch_mode", "other"], "action": "allow"}, {"kinds": ["execute"], "action": "ask"}]}}})),
        ("a session configuration", json!({"spec": {"sessionConfig": {"mode": "acceptEdits", "model": long(128),
            "options": (0..16).map(|i| (format!("o{i}"), json!(long(128)))).collect::<serde_json::Map<_, _>>()}}})),
        ("mountPath beside /tmp", mount_path("/tmpfs")),
        ("mountPath beside /run/kandev", mount_path("/run/kandevx")),
        ("mountPath /run", mount_path("/run")),
        ("mountPath with dot names", mount_path("/w/.hidden/..x/a.b")),
        ("ssh URL with a port", repository(json!({"url": "ssh://git@example.com:2222/org/app.git"}))),
        ("git:// URL", repository(json!({"url": "git://example.com/app.git"}))),
        ("HTTPS token credentials", repository(json!({"url": "https://example.com/app.git", "credentials": {"secretName": "app-git", "usernameKey": "user", "passwordKey": "token", "caBundleKey": "ca.pem"}}))),
        ("SSH credentials", repository(json!({"url": "git@example.com:org/app.git", "credentials": {"secretName": "app-git", "sshKeyKey": "id_ed25519", "knownHostsKey": "known_hosts"}}))),
        ("scp-style URL", repository(json!({"url": "git@github.com:kandev/kandev.git"}))),
        ("storageClassName \"\" (no class)", template(json!({"size": "1Gi", "storageClassName": ""}))),
        ("ReadWriteOncePod alone", template(json!({"size": "500M", "accessModes": ["ReadWriteOncePod"]}))),
        ("existing claim", json!({"spec": {"workspace": {"template": null, "claimName": "shared.workspace-1"}}})),
        ("name of 243 characters with a template", json!({"metadata": {"name": long(243)}})),
        ("name of 253 characters with a claim", json!({"metadata": {"name": long(253)}, "spec": {"workspace": {"template": null, "claimName": "existing"}}})),
    ]
}

// ---------------------------------------------------------------------------------------------
// unit tier: the table and the schema the Rust types generate agree

/// The schema node of a field as the API server names it (`spec.credentials[0].env`).
fn schema_node<'a>(root: &'a Value, field: &str) -> &'a Value {
    let mut node = root;
    for part in field.split('.').filter(|p| !p.is_empty()) {
        let (name, indexed) = match part.split_once('[') {
            Some((name, _)) => (name, true),
            None => (part, false),
        };
        node = &node["properties"][name];
        if indexed {
            node = &node["items"];
        }
        assert!(!node.is_null(), "no schema for {field} (at {part})");
    }
    node
}

fn generated_schema() -> Value {
    let crd = TaskSession::crd();
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref());
    serde_json::to_value(schema).expect("schema serializes")
}

/// Every (field, message) of the spec's rules that can refuse a create (not the `oldSelf` ones).
fn create_rules(node: &Value, path: &str, out: &mut Vec<(String, String)>) {
    for rule in node["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let text = rule["rule"].as_str().unwrap_or_default();
        if !text.contains("oldSelf") {
            let message = rule["message"].as_str().unwrap_or_default();
            out.push((path.to_string(), message.to_string()));
        }
    }
    if let Some(props) = node["properties"].as_object() {
        for (name, prop) in props {
            let here = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            if here != "status" {
                create_rules(prop, &here, out);
            }
        }
    }
    if node.get("items").is_some() {
        create_rules(&node["items"], &format!("{path}[0]"), out);
    }
}

#[test]
fn every_refusal_is_a_rule_of_the_generated_crd() {
    let schema = generated_schema();
    for case in refused_cases() {
        let node = schema_node(&schema, case.field);
        match case.expect {
            Expect::Rule(message) => {
                let messages: Vec<&str> = node["x-kubernetes-validations"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| r["message"].as_str())
                    .collect();
                assert!(
                    messages.contains(&message),
                    "{}: {} has no rule with message {message:?}; its rules: {messages:?}",
                    case.what,
                    case.field
                );
            }
            Expect::MaxLength(n) => assert_eq!(
                node["maxLength"].as_u64(),
                Some(n as u64),
                "{}: maxLength of {}",
                case.what,
                case.field
            ),
        }
    }
}

#[test]
fn every_rule_of_the_spec_has_a_refused_case() {
    let mut rules = Vec::new();
    create_rules(&generated_schema(), "", &mut rules);
    assert!(rules.len() > 20, "rules found: {rules:?}");
    let cases = refused_cases();
    let uncovered: Vec<_> = rules
        .iter()
        .filter(|(field, message)| {
            !cases.iter().any(|c| {
                c.field == field.as_str() && matches!(c.expect, Expect::Rule(m) if m == message)
            })
        })
        .collect();
    assert!(
        uncovered.is_empty(),
        "rules without a refused case: {uncovered:?}"
    );
}

#[test]
fn every_free_string_of_the_spec_has_a_max_length() {
    fn walk(node: &Value, path: &str, out: &mut Vec<String>) {
        let is_string = node["type"] == "string" && node.get("enum").is_none();
        if is_string && node.get("maxLength").is_none() {
            out.push(path.to_string());
        }
        if let Some(props) = node["properties"].as_object() {
            for (name, prop) in props {
                walk(prop, &format!("{path}.{name}"), out);
            }
        }
        if node.get("items").is_some() {
            walk(&node["items"], &format!("{path}[]"), out);
        }
    }
    let schema = generated_schema();
    let mut unbounded = Vec::new();
    walk(schema_node(&schema, "spec"), "spec", &mut unbounded);
    // Strings of a Kubernetes type we embed as is, never read by a CEL rule.
    unbounded.retain(|p| !p.starts_with("spec.resources.claims"));
    assert!(
        unbounded.is_empty(),
        "strings without maxLength: {unbounded:?}"
    );
}

/// The paths and environment variables the operator itself puts into every agent pod are the
/// ones the CRD reserves (a new mount or variable in src/controller/pods.rs needs a rule here).
#[test]
fn the_operators_own_mounts_and_variables_are_reserved() {
    use kandev_operator::agents::AgentRegistry;
    use kandev_operator::api::{CredentialRef, TaskSessionSpec, WorkspaceSpec};
    use kandev_operator::controller::pods::{PodSettings, build_agentctl_pod};

    let mut ts = TaskSession::new(
        "reserved",
        TaskSessionSpec {
            task_id: "T-1".into(),
            agent: "claude-code".into(),
            workspace: WorkspaceSpec {
                claim_name: Some("ws".into()),
                mount_path: "/workspace".into(),
                ..Default::default()
            },
            credentials: vec![CredentialRef {
                env: "ANTHROPIC_API_KEY".into(),
                secret_name: "keys".into(),
                key: "api-key".into(),
            }],
            ..Default::default()
        },
    );
    ts.metadata.namespace = Some("team-a".into());
    let registry = AgentRegistry::builtin().expect("built-in profiles");
    let profile = registry.get("claude-code").expect("claude-code");
    let pod = build_agentctl_pod(
        &ts,
        "token",
        &PodSettings::default(),
        profile,
        CheckoutStart::First,
    );
    let container = &pod.spec.as_ref().expect("pod spec").containers[0];

    let refused_mount = |path: &str| {
        refused_cases().iter().any(|c| {
            c.patch["spec"]["workspace"]["mountPath"] == path
                && matches!(c.expect, Expect::Rule(MOUNT_RESERVED))
        })
    };
    let mounts: Vec<&str> = container
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| m.name != "workspace")
        .map(|m| m.mount_path.as_str())
        .collect();
    assert!(!mounts.is_empty());
    let schema = generated_schema();
    let rules = &schema_node(&schema, "spec.workspace.mountPath")["x-kubernetes-validations"];
    for path in mounts {
        assert!(refused_mount(path), "no case refusing mountPath {path}");
        assert!(
            refused_mount(&format!("{path}/work")),
            "no case refusing a mountPath below {path}"
        );
        assert!(
            rules.to_string().contains(&format!("'{path}'")),
            "the mountPath rules do not name {path}: {rules}"
        );
    }

    let refused_env = |name: &str| {
        refused_cases().iter().any(|c| {
            c.patch["spec"]["credentials"][0]["env"] == name
                && matches!(c.expect, Expect::Rule(ENV_RESERVED))
        })
    };
    let prefix_refused = |prefix: &str| refused_env(&format!("{prefix}ANYTHING"));
    for env in container.env.iter().flatten() {
        if env.name == "ANTHROPIC_API_KEY" {
            continue;
        }
        assert!(
            refused_env(&env.name)
                || ["KANDEV_", "GIT_CONFIG_"]
                    .iter()
                    .any(|p| env.name.starts_with(p) && prefix_refused(p)),
            "the operator sets {} but a credential may too",
            env.name
        );
    }
}

#[test]
fn cases_merge_into_the_valid_session() {
    let mut session = valid_session("x");
    merge(
        &mut session,
        &json!({"spec": {"workspace": {"template": null, "claimName": "c"}}}),
    );
    assert_eq!(session["spec"]["workspace"], json!({"claimName": "c"}));
    assert_eq!(session["spec"]["agent"], "claude-code");
    let mut names: Vec<&str> = refused_cases().iter().map(|c| c.what).collect();
    names.extend(accepted_cases().iter().map(|(what, _)| *what));
    let count = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), count, "case names are unique");
}

// ---------------------------------------------------------------------------------------------
// end-to-end tier: the real API server

/// `kubectl apply --dry-run=server -f -` of `object`: Ok(stdout) or Err(stderr).
fn dry_run(object: &Value) -> Result<String, String> {
    let kubeconfig = std::env::var("KUBECONFIG").expect("KUBECONFIG");
    let text = serde_json::to_string(object).expect("json");
    let out = run_with_stdin(
        kubectl().args(["--kubeconfig", &kubeconfig]).args([
            "apply",
            "--dry-run=server",
            "-f",
            "-",
        ]),
        &text,
    );
    if out.success() {
        Ok(out.stdout)
    } else {
        Err(out.stderr)
    }
}

fn session_with(patch: &Value) -> Value {
    let mut session = valid_session(&unique("crd-validation"));
    merge(&mut session, patch);
    session
}

#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn crd_refuses_each_bad_task_session_with_its_message() {
    client_with_crds().await;
    assert!(
        dry_run(&valid_session(&unique("crd-validation"))).is_ok(),
        "the base session must be accepted"
    );
    let mut failures = Vec::new();
    for case in refused_cases() {
        let session = session_with(&case.patch);
        let wanted = match case.expect {
            Expect::Rule(message) => message.to_string(),
            Expect::MaxLength(n) => format!("Too long: may not be more than {n}"),
        };
        match dry_run(&session) {
            Ok(out) => failures.push(format!("{}: accepted ({})", case.what, out.trim())),
            Err(stderr) => {
                let field = format!("{}:", case.field);
                if !stderr.contains(&wanted) || (!case.field.is_empty() && !stderr.contains(&field))
                {
                    failures.push(format!(
                        "{}: refused, but without {field:?} and {wanted:?}:\n{stderr}",
                        case.what
                    ));
                }
            }
        }
    }
    for (what, patch) in accepted_cases() {
        if let Err(stderr) = dry_run(&session_with(&patch)) {
            failures.push(format!("{what}: refused but valid:\n{stderr}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        refused_cases().len() + accepted_cases().len(),
        failures.join("\n")
    );
}

/// A TaskSession example found in the repository's docs.
struct Example {
    source: String,
    object: Value,
}

/// Every TaskSession in docs/ (YAML files and ```yaml blocks of the pages), examples/ if there is
/// one, and the chart's NOTES.txt.
fn examples() -> Vec<Example> {
    fn documents(source: &str, text: &str, out: &mut Vec<Example>) {
        for (i, doc) in text.split("\n---").enumerate() {
            if !doc.contains("kind: TaskSession") {
                continue;
            }
            let object: Value = serde_yaml_ng::from_str(doc)
                .unwrap_or_else(|e| panic!("{source} document {i}: not YAML: {e}"));
            if object["kind"] == "TaskSession" {
                out.push(Example {
                    source: format!("{source}#{i}"),
                    object,
                });
            }
        }
    }
    fn visit(dir: &std::path::Path, rel: &str, out: &mut Vec<Example>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let name = entry.file_name().to_string_lossy().into_owned();
            let rel = format!("{rel}/{name}");
            let path = entry.path();
            if path.is_dir() {
                visit(&path, &rel, out);
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            if name.ends_with(".yaml") || name.ends_with(".yml") {
                documents(&rel, &text, out);
            } else if name.ends_with(".md") {
                let mut lines = text.lines();
                while let Some(line) = lines.next() {
                    if line.trim() == "```yaml" {
                        let block: Vec<&str> = lines
                            .by_ref()
                            .take_while(|l| !l.starts_with("```"))
                            .collect();
                        documents(&rel, &block.join("\n"), out);
                    }
                }
            }
        }
    }
    let mut out = Vec::new();
    visit(&repo_path("docs"), "docs", &mut out);
    visit(&repo_path("examples"), "examples", &mut out);
    // NOTES.txt shows one session in a heredoc, indented by two spaces.
    let notes_path = "charts/kandev-operator/templates/NOTES.txt";
    let notes = std::fs::read_to_string(repo_path(notes_path)).expect("NOTES.txt");
    let heredoc: Vec<&str> = notes
        .lines()
        .skip_while(|l| !l.contains("<<'YAML'"))
        .skip(1)
        .take_while(|l| l.trim() != "YAML")
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .collect();
    documents(notes_path, &heredoc.join("\n"), &mut out);
    out
}

/// What an example named `*-invalid.yaml` must be refused with: the rules it illustrates.
fn invalid_example_messages(source: &str) -> Option<Vec<&'static str>> {
    if source.starts_with("docs/examples/tasksession-invalid.yaml") {
        Some(vec![AGENT_NAME, WORKSPACE_ONE_OF])
    } else if source.starts_with("docs/examples/profiles-invalid-agent.yaml") {
        Some(vec![AGENT_NAME])
    } else if source.contains("-invalid") {
        panic!("{source}: say what this invalid example must be refused with")
    } else {
        None
    }
}

#[test]
fn examples_are_found() {
    let found: Vec<String> = examples().into_iter().map(|e| e.source).collect();
    for want in [
        "docs/examples/tasksession.yaml#0",
        "docs/examples/tasksession-invalid.yaml#0",
        "docs/spec.md#0",
        "charts/kandev-operator/templates/NOTES.txt#0",
    ] {
        assert!(found.iter().any(|f| f == want), "{want} not in {found:?}");
    }
    for source in &found {
        invalid_example_messages(source); // panics on an unknown invalid example
    }
}

#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn crd_accepts_every_task_session_example_of_the_docs() {
    client_with_crds().await;
    let examples = examples();
    assert!(examples.len() >= 3, "examples found: {}", examples.len());
    let mut failures = Vec::new();
    for example in examples {
        // Same spec, in a namespace that exists and under a name nothing else uses.
        let mut object = example.object;
        object["metadata"]["namespace"] = json!(NS);
        object["metadata"]["name"] = json!(unique("crd-example"));
        let result = dry_run(&object);
        match (invalid_example_messages(&example.source), result) {
            (None, Ok(_)) => {}
            (None, Err(stderr)) => failures.push(format!("{}: refused:\n{stderr}", example.source)),
            (Some(_), Ok(_)) => {
                failures.push(format!("{}: invalid example accepted", example.source))
            }
            (Some(messages), Err(stderr)) => {
                for message in messages {
                    if !stderr.contains(message) {
                        failures.push(format!(
                            "{}: refused without {message:?}:\n{stderr}",
                            example.source
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
