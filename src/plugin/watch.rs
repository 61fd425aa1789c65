//! Waiting by watching: one TaskSession, its ExecutorRunning and its agentctl pods, each
//! followed by a `kube::runtime` watcher into a reflector store. Every change yields a fresh
//! [`Snapshot`] built from the stores, so a wait reacts as soon as the API server reports
//! something, and asks it nothing while nothing happens. [`wait_for`] waits on it, saying on
//! stderr where the session stands.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{BoxStream, SelectAll, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use tokio::time::Instant;

use super::cluster::{Cluster, Deadline};
use super::error::PluginError;
use super::output::OutputFormat;
use super::status::Snapshot;
use crate::api::names;
use crate::api::{ExecutorRunning, MANAGED_LABEL, SESSION_LABEL, TaskSession};

/// Which of the three watches an event came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Session,
    Executor,
    Pods,
}

impl Source {
    fn index(self) -> usize {
        self as usize
    }

    fn what(self) -> &'static str {
        match self {
            Self::Session => "the tasksession",
            Self::Executor => "its executorrunning",
            Self::Pods => "its agentctl pods",
        }
    }
}

/// What one watcher event means for the wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// The initial list (or a relist) is complete: the store holds the whole state.
    Synced,
    /// An object changed after the initial list.
    Changed,
    /// Part of a (re)list: wait for its end.
    Listing,
}

type Tick = Result<(Source, Step), watcher::Error>;

/// The three watches of one session, and the stores they fill.
pub struct SessionWatch {
    cluster: Cluster,
    name: String,
    session: Store<TaskSession>,
    executor: Store<ExecutorRunning>,
    pods: Store<Pod>,
    events: SelectAll<BoxStream<'static, Tick>>,
    synced: [bool; 3],
}

impl SessionWatch {
    /// Starts watching the session of `snapshot` (its name fixes the executor's name and the
    /// pods' label selector). Nothing is requested until [`Self::changed`] is awaited.
    pub fn start(cluster: &Cluster, snapshot: &Snapshot) -> Self {
        let name = snapshot.name();
        let client = cluster.stream_client.clone();
        let ns = cluster.namespace.as_str();
        let (session, session_writer) = reflector::store();
        let (executor, executor_writer) = reflector::store();
        let (pods, pods_writer) = reflector::store();
        let by_name =
            |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
        let selector = format!(
            "{MANAGED_LABEL}=true,{SESSION_LABEL}={}",
            names::session_label_value(&name)
        );
        let mut events = SelectAll::new();
        events.push(ticks(
            Source::Session,
            reflector::reflector(
                session_writer,
                watcher(
                    Api::<TaskSession>::namespaced(client.clone(), ns),
                    by_name(&name),
                ),
            ),
        ));
        events.push(ticks(
            Source::Executor,
            reflector::reflector(
                executor_writer,
                watcher(
                    Api::<ExecutorRunning>::namespaced(client.clone(), ns),
                    by_name(&names::executor_name(&snapshot.session)),
                ),
            ),
        ));
        events.push(ticks(
            Source::Pods,
            reflector::reflector(
                pods_writer,
                watcher(
                    Api::<Pod>::namespaced(client, ns),
                    watcher::Config::default().labels(&selector),
                ),
            ),
        ));
        Self {
            cluster: cluster.clone(),
            name,
            session,
            executor,
            pods,
            events,
            synced: [false; 3],
        }
    }

    /// Waits for the next change and returns the state after it. The first call returns once
    /// all three watches have listed. A session deleted meanwhile is [`PluginError::NotFound`];
    /// a watch the API server refuses is an error; an expired watch is resumed silently.
    pub async fn changed(&mut self) -> Result<Snapshot, PluginError> {
        loop {
            let Some(tick) = self.events.next().await else {
                return Err(PluginError::Exec {
                    action: format!("watching tasksession {:?}", self.name),
                    reason: "the watch ended".into(),
                });
            };
            let (source, step) = match tick {
                Ok(tick) => tick,
                Err(error) => match self.fatal(error) {
                    Some(error) => return Err(error),
                    None => continue,
                },
            };
            if step == Step::Listing {
                continue;
            }
            if step == Step::Synced {
                self.synced[source.index()] = true;
            }
            if self.synced.iter().all(|s| *s) {
                return self.snapshot();
            }
        }
    }

    /// The state now, once all three watches have listed (`None` before): what a caller that
    /// stopped waiting for [`SessionWatch::changed`] (cancelled it) reads, since a change the
    /// cancelled call had taken in is in the stores but was not returned.
    pub fn current(&self) -> Option<Result<Snapshot, PluginError>> {
        self.synced.iter().all(|s| *s).then(|| self.snapshot())
    }

    fn snapshot(&self) -> Result<Snapshot, PluginError> {
        let Some(session) = self.session.state().into_iter().next() else {
            return Err(PluginError::NotFound {
                name: self.name.clone(),
                namespace: self.cluster.namespace.clone(),
            });
        };
        let session = Arc::unwrap_or_clone(session);
        let executor = self
            .executor
            .state()
            .into_iter()
            .next()
            .map(Arc::unwrap_or_clone);
        let mut pods: Vec<Pod> = self
            .pods
            .state()
            .into_iter()
            .map(Arc::unwrap_or_clone)
            .collect();
        // The store is a map: keep the order of a list (by name) for stable output.
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(Snapshot::new(
            self.cluster.namespace.clone(),
            session,
            executor,
            pods,
        ))
    }

    /// `Some` for an error that ends the wait; `None` for one the watcher recovers from by
    /// itself (an expired resource version, a watch connection that broke: it relists).
    fn fatal(&self, error: watcher::Error) -> Option<PluginError> {
        let source = match error {
            watcher::Error::WatchError(status) if status.code == 410 => return None,
            watcher::Error::WatchFailed(error) => {
                tracing::debug!(%error, "watch connection broke; resuming");
                return None;
            }
            watcher::Error::InitialListFailed(error) | watcher::Error::WatchStartFailed(error) => {
                error
            }
            watcher::Error::WatchError(status) => kube::Error::Api(status),
            watcher::Error::NoResourceVersion => {
                return Some(PluginError::Exec {
                    action: format!("watching tasksession {:?}", self.name),
                    reason: "the API server sent no resourceVersion".into(),
                });
            }
        };
        Some(self.cluster.kube_error(
            format!("watching tasksession {:?} and its pods", self.name),
            source,
        ))
    }
}

fn ticks<K>(
    source: Source,
    stream: impl futures::Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
) -> BoxStream<'static, Tick> {
    stream
        .map(move |event| {
            event.map(|event| {
                let step = step(&event);
                tracing::trace!(what = source.what(), ?step, "watch event");
                (source, step)
            })
        })
        .boxed()
}

fn step<K>(event: &watcher::Event<K>) -> Step {
    match event {
        watcher::Event::InitDone => Step::Synced,
        watcher::Event::Init | watcher::Event::InitApply(_) => Step::Listing,
        watcher::Event::Apply(_) | watcher::Event::Delete(_) => Step::Changed,
    }
}

/// How often a wait says that it still waits, when nothing changed.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(30);

/// Where a wait stands, said on stderr like `kubectl rollout status` does: what it waits for
/// and for how long, then a line with the elapsed time at each change of the session, and every
/// [`PROGRESS_EVERY`] without one. Only for a person: when stderr is a terminal and the command
/// prints text (nothing extra for scripts, pipes, or `-o json|yaml|jsonpath`).
pub struct Progress {
    shown: bool,
    started: Instant,
    said: Option<String>,
    said_at: Instant,
}

impl Progress {
    pub fn new(shown: bool) -> Self {
        let now = Instant::now();
        Self {
            shown,
            started: now,
            said: None,
            said_at: now,
        }
    }

    /// Shown when stderr is a terminal and `output` is text.
    pub fn for_output(output: &OutputFormat) -> Self {
        Self::new(std::io::stderr().is_terminal() && matches!(output, OutputFormat::Text))
    }

    /// Says what is awaited, once.
    pub fn begin(&mut self, what: &str, total: Duration) {
        if self.shown && self.said.is_none() {
            say!(
                "waiting up to {} for {what}",
                super::error::format_duration(total)
            );
            self.said = Some(String::new());
        }
    }

    /// Says where the session stands, if that changed or was said [`PROGRESS_EVERY`] ago. The
    /// pace is kept when nothing is shown too, so that [`Self::next_due`] moves on.
    pub fn at(&mut self, snapshot: &Snapshot) {
        let now = snapshot.last_seen();
        if self.said.as_deref() != Some(now.as_str()) || self.said_at.elapsed() >= PROGRESS_EVERY {
            if self.shown {
                say!("  [{:>4}s] {now}", self.started.elapsed().as_secs());
            }
            (self.said, self.said_at) = (Some(now), Instant::now());
        }
    }

    /// When the next line is due without a change.
    pub fn next_due(&self) -> Instant {
        self.said_at + PROGRESS_EVERY
    }
}

/// Watches the session (and its executor and pods) until `done` returns `Some`, or fails
/// with a timeout that says what was awaited and where the session stood, telling `progress`
/// where it stands while it waits.
pub async fn wait_for<T>(
    cluster: &Cluster,
    name: &str,
    what: &str,
    deadline: Deadline,
    mut progress: Progress,
    mut done: impl FnMut(&Snapshot) -> Result<Option<T>, PluginError>,
) -> Result<T, PluginError> {
    let mut snapshot = cluster.snapshot(name).await?;
    let mut watch = SessionWatch::start(cluster, &snapshot);
    loop {
        if let Some(value) = done(&snapshot)? {
            return Ok(value);
        }
        progress.begin(what, deadline.total);
        progress.at(&snapshot);
        tokio::select! {
            next = watch.changed() => snapshot = next?,
            () = tokio::time::sleep_until(progress.next_due()) => {
                if let Some(current) = watch.current() {
                    snapshot = current?;
                }
            }
            () = tokio::time::sleep_until(deadline.at) => {
                return Err(PluginError::Timeout {
                    what: what.to_string(),
                    waited: deadline.total,
                    last_seen: snapshot.last_seen(),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shown or not, the pace moves on: a wait that shows nothing must not wake in a loop once
    /// [`PROGRESS_EVERY`] has passed.
    #[tokio::test(start_paused = true)]
    async fn progress_keeps_its_pace_when_nothing_is_shown() {
        let session = TaskSession::new("s", Default::default());
        let snapshot = Snapshot::new("ns", session, None, Vec::new());
        for shown in [false, true] {
            let mut progress = Progress::new(shown);
            progress.at(&snapshot);
            assert_eq!(progress.next_due(), Instant::now() + PROGRESS_EVERY);
            tokio::time::advance(PROGRESS_EVERY).await;
            progress.at(&snapshot);
            assert!(progress.next_due() > Instant::now(), "shown: {shown}");
        }
    }

    #[test]
    fn only_complete_lists_and_later_changes_count() {
        let pod = Pod::default;
        for (event, want) in [
            (watcher::Event::Init, Step::Listing),
            (watcher::Event::InitApply(pod()), Step::Listing),
            (watcher::Event::InitDone, Step::Synced),
            (watcher::Event::Apply(pod()), Step::Changed),
            (watcher::Event::Delete(pod()), Step::Changed),
        ] {
            assert_eq!(step(&event), want, "{event:?}");
        }
    }
}
