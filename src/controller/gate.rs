//! The pace of journal catch-ups: at most so many `agentctl events` execs are opened per second
//! across the whole operator, working sessions first. An operator that starts (or takes the
//! lead) beside thousands of running sessions would otherwise open one exec per session at once,
//! a storm of streaming requests through the API server to every kubelet; paced, the sessions
//! whose agent was working when the last one stopped are caught up first, and the idle ones
//! follow at the configured rate. Restores (a user's resume) never wait here.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};

/// The default pace (`--catch-up-execs-per-second`).
pub const DEFAULT_EXECS_PER_SECOND: u32 = 20;

/// Hands out exec openings one by one, `1 / rate` apart, to waiting working sessions before
/// waiting idle ones (each queue in arrival order). A rate of 0 lets everyone through at once.
pub struct ExecGate {
    interval: Option<Duration>,
    queues: Mutex<Queues>,
    arrived: Notify,
}

#[derive(Default)]
struct Queues {
    working: VecDeque<oneshot::Sender<()>>,
    idle: VecDeque<oneshot::Sender<()>>,
}

impl Queues {
    /// The next waiter still waiting, working ones first.
    fn next(&mut self) -> Option<oneshot::Sender<()>> {
        loop {
            let waiter = self.working.pop_front().or_else(|| self.idle.pop_front())?;
            if !waiter.is_closed() {
                return Some(waiter);
            }
        }
    }
}

impl ExecGate {
    /// A gate of `per_second` openings (0: unpaced). Call [`ExecGate::run`] once to open it.
    pub fn new(per_second: u32) -> Arc<Self> {
        Arc::new(Self {
            interval: (per_second > 0).then(|| Duration::from_secs(1) / per_second),
            queues: Mutex::default(),
            arrived: Notify::new(),
        })
    }

    /// Waits for this caller's turn to open an exec; `working`: its agent was working.
    pub async fn enter(&self, working: bool) {
        if self.interval.is_none() {
            return;
        }
        let (turn, wait) = oneshot::channel();
        if let Ok(mut queues) = self.queues.lock() {
            let queue = if working {
                &mut queues.working
            } else {
                &mut queues.idle
            };
            queue.push_back(turn);
        } else {
            return;
        }
        self.arrived.notify_one();
        // A gate that no longer runs (the operator is stopping) lets its waiters go.
        let _ = wait.await;
    }

    /// Gives out the turns, one per interval, for as long as the operator runs.
    pub async fn run(self: Arc<Self>) {
        let Some(interval) = self.interval else {
            return;
        };
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next = self.queues.lock().ok().and_then(|mut q| q.next());
            match next {
                Some(turn) => {
                    ticks.tick().await;
                    let _ = turn.send(());
                }
                None => self.arrived.notified().await,
            }
        }
    }

    /// Callers waiting for their turn (working, idle).
    pub fn waiting(&self) -> (usize, usize) {
        self.queues
            .lock()
            .map(|q| (q.working.len(), q.idle.len()))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::time::Instant;

    /// 40 idle callers and then 5 working ones at 20 per second: the working ones go first, no
    /// two turns closer than 50 ms, and everyone gets through in about 45 / 20 s.
    #[tokio::test(start_paused = true)]
    async fn working_sessions_go_first_and_turns_are_paced() {
        let gate = ExecGate::new(20);
        let start = Instant::now();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..45 {
            let (gate, order) = (gate.clone(), order.clone());
            let working = i >= 40;
            tasks.push(tokio::spawn(async move {
                gate.enter(working).await;
                order.lock().expect("order").push((working, Instant::now()));
            }));
            // Every caller has queued before the gate opens.
            tokio::task::yield_now().await;
        }
        assert_eq!(gate.waiting(), (5, 40));
        let runner = tokio::spawn(gate.clone().run());
        for task in tasks {
            task.await.expect("caller");
        }
        runner.abort();
        let order = order.lock().expect("order");
        assert!(
            order[..5].iter().all(|(working, _)| *working),
            "working first"
        );
        assert!(order[5..].iter().all(|(working, _)| !*working));
        for pair in order.windows(2) {
            assert!(pair[1].1 - pair[0].1 >= Duration::from_millis(50), "paced");
        }
        let took = order.last().expect("last").1 - start;
        assert!(
            took >= Duration::from_millis(44 * 50) && took < Duration::from_secs(3),
            "{took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_of_zero_lets_everyone_through_and_a_gone_caller_loses_its_turn() {
        let open = ExecGate::new(0);
        open.enter(false).await;
        assert_eq!(open.waiting(), (0, 0));

        let gate = ExecGate::new(10);
        let passed = Arc::new(AtomicUsize::new(0));
        let gone = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.enter(true).await })
        };
        tokio::task::yield_now().await;
        gone.abort();
        let _ = gone.await;
        let kept = {
            let (gate, passed) = (gate.clone(), passed.clone());
            tokio::spawn(async move {
                gate.enter(false).await;
                passed.fetch_add(1, Ordering::SeqCst);
            })
        };
        tokio::task::yield_now().await;
        let start = Instant::now();
        let runner = tokio::spawn(gate.clone().run());
        kept.await.expect("caller");
        runner.abort();
        assert_eq!(passed.load(Ordering::SeqCst), 1);
        assert!(
            Instant::now() - start < Duration::from_millis(150),
            "no turn spent on the gone caller"
        );
    }
}
