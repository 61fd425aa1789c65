//! What a kubelet checks before it starts a container, played for the pods the harness starts:
//! an image it cannot pull, and a Secret or key that the container's environment references but
//! that does not exist. Such a pod stays Pending with its container waiting for the kubelet's
//! reason and message, as on a real node, so the operator's launch deadline sees what it would
//! see there.

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Client;
use kube::api::Api;
use serde_json::json;

/// Registries under the reserved top-level domain `.invalid` (RFC 2606) never resolve: their
/// images cannot be pulled.
const UNPULLABLE_TLD: &str = ".invalid";

/// A container the kubelet does not start, and why.
#[derive(Debug, PartialEq, Eq)]
pub struct Waiting {
    pub container: String,
    /// An init container (reported in `initContainerStatuses`).
    pub init: bool,
    pub image: String,
    pub reason: &'static str,
    pub message: String,
}

/// The first container whose image cannot be pulled (`ImagePullBackOff`, the kubelet's words).
pub fn unpullable_image(pod: &Pod) -> Option<Waiting> {
    let spec = pod.spec.as_ref()?;
    spec.containers.iter().find_map(|c| {
        let image = c.image.clone().unwrap_or_default();
        let registry = image.split('/').next().unwrap_or_default();
        let host = registry.split(':').next().unwrap_or_default();
        (image.contains('/') && host.ends_with(UNPULLABLE_TLD)).then(|| Waiting {
            container: c.name.clone(),
            init: false,
            message: format!("Back-off pulling image {image:?}"),
            image,
            reason: "ImagePullBackOff",
        })
    })
}

/// The first `secretKeyRef` of a container's environment (not marked optional) whose Secret or
/// key is missing (`CreateContainerConfigError`, the kubelet's words), init containers first.
pub async fn missing_secret(client: &Client, pod: &Pod) -> Result<Option<Waiting>, kube::Error> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(None);
    };
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let init = spec.init_containers.iter().flatten().map(|c| (c, true));
    for (container, init) in init.chain(spec.containers.iter().map(|c| (c, false))) {
        let refs = container
            .env
            .iter()
            .flatten()
            .filter_map(|e| e.value_from.as_ref()?.secret_key_ref.as_ref())
            .filter(|r| r.optional != Some(true));
        for r in refs {
            let message = match secrets.get_opt(&r.name).await? {
                None => format!("secret {:?} not found", r.name),
                Some(secret) if !has_key(&secret, &r.key) => format!(
                    "couldn't find key {} in Secret {namespace}/{}",
                    r.key, r.name
                ),
                Some(_) => continue,
            };
            return Ok(Some(Waiting {
                container: container.name.clone(),
                init,
                image: container.image.clone().unwrap_or_default(),
                reason: "CreateContainerConfigError",
                message,
            }));
        }
    }
    Ok(None)
}

/// The values of `container`'s `secretKeyRef` variables, resolved like a kubelet does (a
/// missing Secret or key was reported by [`missing_secret`] before the start; an optional one is
/// left out).
pub async fn secret_env(
    client: &Client,
    pod: &Pod,
    container: &str,
) -> Result<Vec<(String, String)>, kube::Error> {
    let Some(container) = pod.spec.as_ref().and_then(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(&s.containers)
            .find(|c| c.name == container)
    }) else {
        return Ok(Vec::new());
    };
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let mut env = Vec::new();
    for var in container.env.iter().flatten() {
        let Some(r) = var
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
        else {
            continue;
        };
        let Some(secret) = secrets.get_opt(&r.name).await? else {
            continue;
        };
        let value = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&r.key))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .or_else(|| {
                secret
                    .string_data
                    .as_ref()
                    .and_then(|d| d.get(&r.key).cloned())
            });
        if let Some(value) = value {
            env.push((var.name.clone(), value));
        }
    }
    Ok(env)
}

fn has_key(secret: &Secret, key: &str) -> bool {
    secret.data.as_ref().is_some_and(|d| d.contains_key(key))
        || secret
            .string_data
            .as_ref()
            .is_some_and(|d| d.contains_key(key))
}

/// The status patch of a pod whose container waits for `waiting`: still Pending, not ready.
pub fn waiting_status(waiting: &Waiting) -> serde_json::Value {
    let statuses = if waiting.init {
        "initContainerStatuses"
    } else {
        "containerStatuses"
    };
    json!({"status": {
        "phase": "Pending",
        statuses: [{
            "name": waiting.container,
            "image": waiting.image,
            "imageID": "",
            "ready": false,
            "started": false,
            "restartCount": 0,
            "state": {"waiting": {"reason": waiting.reason, "message": waiting.message}},
        }],
    }})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(image: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "agentctl", "image": image}]},
        }))
        .expect("pod")
    }

    #[test]
    fn only_images_of_an_invalid_registry_cannot_be_pulled() {
        let cases = [
            ("registry.invalid/kandev/agentctl:1", true),
            ("registry.invalid:5000/agentctl", true),
            ("kandev/agentctl:latest", false),
            ("ghcr.io/kandev/agentctl:1", false),
            ("agentctl.invalid", false),
        ];
        for (image, unpullable) in cases {
            let waiting = unpullable_image(&pod(image));
            assert_eq!(waiting.is_some(), unpullable, "{image}");
            if let Some(w) = waiting {
                assert_eq!(w.reason, "ImagePullBackOff");
                assert!(w.message.contains(image), "{w:?}");
            }
        }
    }
}
