//! The agentctl pods by the session they belong to, kept beside the pod cache: a reconcile finds
//! its session's pods, and the pods that only carry its label, without going through every pod
//! of the cluster. With 10,000 sessions that walk was most of a reconcile's CPU, and the
//! reconciles starved the task that reads the watches.
//!
//! The index follows the same watch events as the cache, one step ahead of it (it is updated
//! before the event reaches the cache); lookups go through the cache, so a pod is seen once both
//! have it. A relist builds a new index and swaps it in at its end, as the cache does.

use std::collections::{HashMap, HashSet};
use std::sync::RwLock;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::api::SESSION_LABEL;

/// What a pod is found by.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    /// The UID of its controller (a TaskSession's, for the pods this operator creates).
    Controller(String),
    /// Its namespace and `kandev.dev/session` label value.
    Session(String, String),
}

fn keys(pod: &Pod) -> Vec<Key> {
    let controllers = pod
        .owner_references()
        .iter()
        .filter(|o| o.controller == Some(true))
        .map(|o| Key::Controller(o.uid.clone()));
    let label = pod
        .labels()
        .get(SESSION_LABEL)
        .map(|value| Key::Session(pod.namespace().unwrap_or_default(), value.clone()));
    controllers.chain(label).collect()
}

#[derive(Debug, Default)]
struct Maps {
    by_key: HashMap<Key, HashSet<ObjectRef<Pod>>>,
    keys_of: HashMap<ObjectRef<Pod>, Vec<Key>>,
}

impl Maps {
    fn insert(&mut self, pod: &Pod) {
        let key_list = keys(pod);
        let pod_ref = ObjectRef::from_obj(pod);
        self.remove(&pod_ref);
        for key in &key_list {
            self.by_key
                .entry(key.clone())
                .or_default()
                .insert(pod_ref.clone());
        }
        self.keys_of.insert(pod_ref, key_list);
    }

    fn remove(&mut self, pod_ref: &ObjectRef<Pod>) {
        for key in self.keys_of.remove(pod_ref).unwrap_or_default() {
            if let Some(refs) = self.by_key.get_mut(&key) {
                refs.remove(pod_ref);
                if refs.is_empty() {
                    self.by_key.remove(&key);
                }
            }
        }
    }
}

#[derive(Debug, Default)]
struct State {
    live: Maps,
    /// The index a relist is building, swapped in at its end.
    relist: Option<Maps>,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct PodIndex {
    state: RwLock<State>,
}

impl PodIndex {
    /// Takes one watch event of the pod cache's watch, before the cache does.
    pub fn apply(&self, event: &watcher::Event<Pod>) {
        let mut state = self
            .state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match event {
            watcher::Event::Apply(pod) => state.live.insert(pod),
            watcher::Event::Delete(pod) => state.live.remove(&ObjectRef::from_obj(pod)),
            watcher::Event::Init => state.relist = Some(Maps::default()),
            watcher::Event::InitApply(pod) => state.relist.get_or_insert_default().insert(pod),
            watcher::Event::InitDone => {
                if let Some(maps) = state.relist.take() {
                    state.live = maps;
                }
            }
        }
    }

    /// The pods whose controller has `uid`.
    pub fn controlled_by(&self, uid: &str) -> Vec<ObjectRef<Pod>> {
        self.find(&Key::Controller(uid.to_string()))
    }

    /// The pods of `namespace` labelled as the session's (`kandev.dev/session` = `label`).
    pub fn labelled(&self, namespace: &str, label: &str) -> Vec<ObjectRef<Pod>> {
        self.find(&Key::Session(namespace.to_string(), label.to_string()))
    }

    fn find(&self, key: &Key) -> Vec<ObjectRef<Pod>> {
        let state = self
            .state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state
            .live
            .by_key
            .get(key)
            .map(|refs| refs.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, controller: Option<&str>, label: Option<&str>) -> Pod {
        let owners: Vec<_> = controller
            .map(|uid| {
                json!({"apiVersion": "kandev.dev/v1alpha1", "kind": "TaskSession",
                       "name": "s", "uid": uid, "controller": true})
            })
            .into_iter()
            .collect();
        let labels = label
            .map(|l| json!({SESSION_LABEL: l}))
            .unwrap_or(json!({}));
        serde_json::from_value(json!({"metadata": {
            "name": name, "namespace": "ns", "ownerReferences": owners, "labels": labels}}))
        .expect("a pod")
    }

    fn names(refs: Vec<ObjectRef<Pod>>) -> Vec<String> {
        let mut names: Vec<String> = refs.into_iter().map(|r| r.name).collect();
        names.sort();
        names
    }

    #[test]
    fn finds_pods_by_controller_and_by_label_and_follows_changes() {
        let index = PodIndex::default();
        index.apply(&watcher::Event::Apply(pod("a", Some("u1"), Some("s1"))));
        index.apply(&watcher::Event::Apply(pod("b", Some("u1"), Some("s1"))));
        index.apply(&watcher::Event::Apply(pod("decoy", None, Some("s1"))));
        index.apply(&watcher::Event::Apply(pod("other", Some("u2"), Some("s2"))));
        assert_eq!(names(index.controlled_by("u1")), ["a", "b"]);
        assert_eq!(names(index.labelled("ns", "s1")), ["a", "b", "decoy"]);
        assert!(
            index.labelled("elsewhere", "s1").is_empty(),
            "per namespace"
        );
        // A pod whose owner and label changed is found by the new ones only.
        index.apply(&watcher::Event::Apply(pod("b", Some("u2"), None)));
        assert_eq!(names(index.controlled_by("u1")), ["a"]);
        assert_eq!(names(index.controlled_by("u2")), ["b", "other"]);
        assert_eq!(names(index.labelled("ns", "s1")), ["a", "decoy"]);
        index.apply(&watcher::Event::Delete(pod("a", Some("u1"), Some("s1"))));
        assert!(index.controlled_by("u1").is_empty());
        assert_eq!(names(index.labelled("ns", "s1")), ["decoy"]);
    }

    #[test]
    fn a_relist_replaces_the_index_at_its_end() {
        let index = PodIndex::default();
        index.apply(&watcher::Event::Apply(pod("gone", Some("u1"), Some("s1"))));
        index.apply(&watcher::Event::Init);
        index.apply(&watcher::Event::InitApply(pod(
            "new",
            Some("u1"),
            Some("s1"),
        )));
        assert_eq!(
            names(index.controlled_by("u1")),
            ["gone"],
            "the previous index serves until the relist ends, as the cache does"
        );
        index.apply(&watcher::Event::InitDone);
        assert_eq!(names(index.controlled_by("u1")), ["new"]);
        assert_eq!(names(index.labelled("ns", "s1")), ["new"]);
    }
}
