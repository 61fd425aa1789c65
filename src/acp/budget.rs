//! One memory budget for every ACP connection of the process (the operator's restores).
//!
//! Each connection is bounded on its own (`rpc.rs`: a line of at most [`AcpLimits::line`], or
//! [`AcpLimits::replay_line`] while a `session/load` replays), but many restores at once could
//! together need far more than the container has. So a connection reserves its worst case from
//! one process-wide budget before it reads from the agent, and before a `session/load` it grows
//! that reservation by the larger replay line: a line's buffer, a copy of its text and what it
//! is parsed into, three times the line limit. The codec refuses a line that would cost more to
//! parse (`jsonrpc::cost`), so the reservation holds whatever the agent writes. When the budget
//! is spent, the next restore waits for one to finish: it
//! finishes later rather than failing, and the process stays within its memory. The wait is
//! outside every ACP deadline (those measure the agent, not us).
//!
//! A connection that grows gives back what it holds and then waits for the whole ([`Held`]):
//! were it to wait while holding, restores that each hold a connection's share of a spent budget
//! could wait for one another forever.
//!
//! The budget's size comes from `--acp-memory-budget-mib`, or half of the container's memory
//! limit (cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`), or [`UNLIMITED_DEFAULT`] where
//! there is no limit.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::client::AcpLimits;
use crate::jsonrpc::cost;

/// The budget where the container has no memory limit.
pub const UNLIMITED_DEFAULT: u64 = 1024 * MIB;
const MIB: u64 = 1024 * 1024;
/// The budget counts in KiB, so that a `u32` of permits covers terabytes.
const UNIT: u64 = 1024;

/// Why a reservation can never be granted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BudgetError {
    #[error(
        "one ACP connection needs {need} bytes, more than the whole memory budget of {total} bytes (--acp-memory-budget-mib): raise it or lower --acp-replay-line-limit-mib"
    )]
    TooLarge { need: u64, total: u64 },
}

/// The process-wide budget; clones share it.
#[derive(Clone, Debug)]
pub struct MemoryBudget {
    permits: Arc<Semaphore>,
    total: u64,
    reserved: Arc<AtomicU64>,
    waits: Arc<AtomicU64>,
}

/// Bytes held from the budget until dropped.
#[derive(Debug)]
pub struct Reservation {
    _permit: Option<OwnedSemaphorePermit>,
    bytes: u64,
    reserved: Arc<AtomicU64>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.reserved.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl MemoryBudget {
    pub fn new(total: u64) -> Self {
        let units = usize::try_from(total / UNIT)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        Self {
            permits: Arc::new(Semaphore::new(units)),
            total,
            reserved: Arc::new(AtomicU64::new(0)),
            waits: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// Bytes reserved now.
    pub fn reserved(&self) -> u64 {
        self.reserved.load(Ordering::Relaxed)
    }

    /// Reservations so far that had to wait for room.
    pub fn waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }

    /// Fails at once when `bytes` could never fit.
    pub fn check(&self, bytes: u64) -> Result<(), BudgetError> {
        if bytes > self.total {
            return Err(BudgetError::TooLarge {
                need: bytes,
                total: self.total,
            });
        }
        Ok(())
    }

    /// Waits until `bytes` are free, and holds them until the reservation is dropped. More than
    /// the whole budget (which the start refuses, [`Self::check`]) waits for the whole budget.
    pub async fn reserve(&self, bytes: u64) -> Reservation {
        let bytes = bytes.min(self.total);
        let units = u32::try_from(bytes.div_ceil(UNIT))
            .unwrap_or(u32::MAX)
            .min(u32::try_from(self.total / UNIT).unwrap_or(u32::MAX));
        let permit = match self.permits.clone().try_acquire_many_owned(units) {
            Ok(permit) => Some(permit),
            Err(_) => {
                self.waits.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    bytes,
                    reserved = self.reserved(),
                    total = self.total,
                    "waiting for the ACP memory budget"
                );
                // The semaphore is never closed: this only ends with the permits.
                self.permits.clone().acquire_many_owned(units).await.ok()
            }
        };
        self.reserved.fetch_add(bytes, Ordering::Relaxed);
        Reservation {
            _permit: permit,
            bytes,
            reserved: self.reserved.clone(),
        }
    }
}

/// A connection's reservation, which can grow (see the module docs).
#[derive(Debug)]
pub struct Held {
    budget: MemoryBudget,
    reservation: std::sync::Mutex<Option<Reservation>>,
}

impl Held {
    /// Waits for `bytes` of `budget`.
    pub async fn new(budget: MemoryBudget, bytes: u64) -> Self {
        let reservation = budget.reserve(bytes).await;
        Self {
            budget,
            reservation: std::sync::Mutex::new(Some(reservation)),
        }
    }

    /// Bytes held now.
    pub fn bytes(&self) -> u64 {
        self.slot().as_ref().map_or(0, |r| r.bytes)
    }

    /// Grows to `bytes` in all: gives back what it holds, then waits for the whole, holding
    /// nothing meanwhile. Holding more already, it keeps what it has.
    pub async fn grow_to(&self, bytes: u64) {
        if self.bytes() >= bytes {
            return;
        }
        drop(self.slot().take());
        let grown = self.budget.reserve(bytes).await;
        *self.slot() = Some(grown);
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Reservation>> {
        self.reservation
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What a connection may hold outside a replay: one line and what it is parsed into, which the
/// codec bounds at [`cost::COST_MULTIPLE`] times the line.
pub fn connection_need(limits: &AcpLimits) -> u64 {
    (cost::COST_MULTIPLE * limits.line) as u64
}

/// What a `session/load` may hold on top of [`connection_need`]: the longer replay line.
pub fn replay_need(limits: &AcpLimits) -> u64 {
    (cost::COST_MULTIPLE * limits.replay_line.saturating_sub(limits.line)) as u64
}

/// The budget's size: `flag_mib` when set (above 0), else half of the container's memory limit
/// (`cgroup_limit`), else [`UNLIMITED_DEFAULT`].
pub fn budget_size(flag_mib: u64, cgroup_limit: Option<u64>) -> u64 {
    if flag_mib > 0 {
        return flag_mib.saturating_mul(MIB);
    }
    cgroup_limit.map_or(UNLIMITED_DEFAULT, |limit| limit / 2)
}

/// This process's memory limit: cgroup v2 `memory.max`, else v1 `memory.limit_in_bytes`;
/// `None` when unlimited or unknown.
pub fn cgroup_memory_limit() -> Option<u64> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    parse_cgroup_limit(
        read("/sys/fs/cgroup/memory.max").as_deref(),
        read("/sys/fs/cgroup/memory/memory.limit_in_bytes").as_deref(),
    )
}

/// The limit in a cgroup file: v2 says `max` when unlimited; v1 says a number near `i64::MAX`
/// (rounded to pages) instead.
fn parse_cgroup_limit(v2: Option<&str>, v1: Option<&str>) -> Option<u64> {
    const V1_UNLIMITED: u64 = 1 << 62;
    v2.or(v1)
        .map(str::trim)
        .and_then(|text| text.parse::<u64>().ok())
        .filter(|limit| *limit < V1_UNLIMITED)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_budget_comes_from_the_flag_the_cgroup_or_the_default() {
        let rows = [
            // (flag MiB, cgroup v2, cgroup v1, budget)
            (0, Some("268435456\n"), None, 128 * MIB),
            (0, Some("max\n"), None, UNLIMITED_DEFAULT),
            (0, None, Some("536870912\n"), 256 * MIB),
            (0, None, Some("9223372036854771712\n"), UNLIMITED_DEFAULT),
            (0, None, None, UNLIMITED_DEFAULT),
            (64, Some("268435456"), None, 64 * MIB),
        ];
        for (flag, v2, v1, want) in rows {
            assert_eq!(
                budget_size(flag, parse_cgroup_limit(v2, v1)),
                want,
                "{flag} {v2:?} {v1:?}"
            );
        }
    }

    /// Five connections fill the budget; each then grows for a load that alone fits. Had they
    /// waited while holding, none would ever get room; giving back first, all of them load.
    #[tokio::test]
    async fn connections_that_grow_together_never_wait_for_each_other() {
        let budget = MemoryBudget::new(10 * MIB);
        let mut holders = Vec::new();
        for _ in 0..5 {
            holders.push(Held::new(budget.clone(), 2 * MIB).await);
        }
        assert_eq!(budget.reserved(), 10 * MIB);
        let loads = holders.into_iter().map(|held| async move {
            held.grow_to(6 * MIB).await;
            assert_eq!(held.bytes(), 6 * MIB);
            tokio::task::yield_now().await;
        });
        tokio::time::timeout(Duration::from_secs(10), futures::future::join_all(loads))
            .await
            .expect("every load got its room");
        assert_eq!(budget.reserved(), 0);
    }

    #[test]
    fn needs_are_what_the_codec_lets_a_line_cost() {
        let limits = AcpLimits {
            line: MIB as usize,
            replay_line: 8 * MIB as usize,
            replay_budget: 0,
        };
        assert_eq!(connection_need(&limits), 3 * MIB);
        assert_eq!(replay_need(&limits), 21 * MIB);
        // Exactly the bound past which the codec refuses a line.
        assert_eq!(
            connection_need(&limits),
            cost::bound(limits.line) as u64,
            "a line's reservation"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reservation_waits_for_room_and_never_takes_more_than_the_budget() {
        let budget = MemoryBudget::new(10 * MIB);
        let first = budget.reserve(6 * MIB).await;
        assert_eq!(budget.reserved(), 6 * MIB);
        let waiting = {
            let budget = budget.clone();
            tokio::spawn(async move { budget.reserve(6 * MIB).await })
        };
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!waiting.is_finished(), "waits while the budget is spent");
        assert_eq!(budget.waits(), 1);
        drop(first);
        let second = waiting.await.expect("granted once room is back");
        assert_eq!(budget.reserved(), 6 * MIB);
        drop(second);
        assert_eq!(budget.reserved(), 0);
        assert_eq!(
            budget.check(11 * MIB),
            Err(BudgetError::TooLarge {
                need: 11 * MIB,
                total: 10 * MIB
            })
        );
        let whole = budget.reserve(11 * MIB).await;
        assert_eq!(budget.reserved(), 10 * MIB, "at most the whole budget");
        drop(whole);
    }
}
