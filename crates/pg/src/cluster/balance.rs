//! Load spreads: each node, every [`Balance::interval`], compares the
//! sessions it holds with the live members' and, when it holds more than
//! the mean and the spread to the least loaded exceeds the
//! [threshold](Balance::threshold), hands
//! idle sessions (no turn running, no message waiting) to the nodes below
//! the mean — at most [`Balance::limit`] a round — in the spirit of Akka
//! Cluster Sharding's least-shard allocation with its rebalance threshold.
//!
//! Who acts: only a node that holds too many, and only on its own
//! sessions. It alone knows which of them are idle (its supervisor says
//! which run a turn), and the move is one fenced statement that also
//! refuses a session with a message waiting or a turn whose end is not
//! stored, so a running turn is never moved. It names the taker, so no
//! two nodes race for a session; the taker adopts the leases handed to it
//! on its next look ([`NodeStore::adopt_handed`]). The decision is
//! [`plan`], a pure function of the members' counts: every giver that
//! reads the same counts splits the takers' deficits in proportion to its
//! share of the excess, so two givers never fill one taker twice.

use std::time::Duration;

use tokio_util::task::AbortOnDropHandle;
use warden_core::{SessionKey, Supervisor};

use super::Node;
use crate::{Lease, NodeState, NodeStore};

/// How a node spreads the load with the others (`warden serve
/// --rebalance-interval`, `--rebalance-limit`, `--rebalance-threshold`).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Balance {
    /// How often the node compares its sessions with the others' (each
    /// round a little later or sooner, at random, so the nodes do not act
    /// together); zero: it never gives sessions away (it still adopts the
    /// ones handed to it). Default 10 s.
    pub interval: Duration,
    /// Most sessions the node hands over in one round. Default 50.
    pub limit: usize,
    /// How far apart the most and the least loaded live members may be, as
    /// a fraction of the mean (and at least one session), before the nodes
    /// above the mean give idle sessions away (down to the mean); once
    /// settled, every member is within about this fraction of the mean.
    /// Default 0.1 (10 %).
    pub threshold: f64,
}

impl Default for Balance {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(10),
            limit: 50,
            threshold: 0.1,
        }
    }
}

impl Balance {
    /// Rounds every `interval` (zero: never give).
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// At most `limit` sessions handed over per round.
    pub fn with_limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Give once the most and the least loaded are more than `threshold` ×
    /// the mean apart.
    pub fn with_threshold(mut self, threshold: f64) -> Self {
        self.threshold = threshold.max(0.0);
        self
    }
}

/// The sessions held across the live members, as `warden cluster status`
/// shows them.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Spread {
    /// Live members.
    pub nodes: usize,
    /// Sessions they hold.
    pub sessions: u64,
    /// Sessions per live member.
    pub mean: f64,
    /// The most held by one member less the fewest.
    pub spread: u64,
    /// The largest distance of one member's count from the mean, as a
    /// fraction of the mean (0 with no sessions).
    pub deviation: f64,
}

impl Spread {
    /// The spread of `counts` (each live member's sessions).
    pub fn of(counts: &[u64]) -> Self {
        let sessions: u64 = counts.iter().sum();
        let mean = match counts.len() {
            0 => 0.0,
            n => sessions as f64 / n as f64,
        };
        let (min, max) = (counts.iter().min(), counts.iter().max());
        let far = counts
            .iter()
            .map(|&c| (c as f64 - mean).abs())
            .fold(0.0, f64::max);
        Self {
            nodes: counts.len(),
            sessions,
            mean,
            spread: max.zip(min).map_or(0, |(a, b)| a - b),
            deviation: if mean > 0.0 { far / mean } else { 0.0 },
        }
    }
}

/// How many idle sessions node `me` hands to each other live member this
/// round, given every live member's count (`members`, `me` among them):
/// nothing unless `me` holds more than the mean and more than the least
/// loaded member by more than the threshold (a fraction of the mean, at
/// least one session), as Akka's rebalance threshold; then down to the
/// mean rounded up, at
/// most [`Balance::limit`], to the members below the mean in proportion
/// to how far below they are, scaled by `me`'s share of the excess of all
/// the members that give this round (so givers reading the same counts
/// fill each deficit once between them). Sorted by member id; no zeros.
pub fn plan(me: &str, members: &[(String, u64)], balance: &Balance) -> Vec<(String, usize)> {
    let Some(&(_, mine)) = members.iter().find(|(id, _)| id == me) else {
        return Vec::new();
    };
    if members.len() < 2 || balance.limit == 0 {
        return Vec::new();
    }
    let total: u64 = members.iter().map(|(_, c)| c).sum();
    let mean = total as f64 / members.len() as f64;
    let least = members.iter().map(|(_, c)| *c).min().unwrap_or(0);
    // Above the mean, and the spread to the least loaded too wide.
    let slack = (balance.threshold * mean).max(1.0);
    let floor = mean.ceil() as u64;
    let gives = |c: u64| c > floor && (c - least) as f64 > slack;
    if !gives(mine) {
        return Vec::new();
    }
    let excess: u64 = members
        .iter()
        .filter(|(_, c)| gives(*c))
        .map(|(_, c)| c.saturating_sub(floor))
        .sum();
    let my_excess = mine.saturating_sub(floor);
    if excess == 0 || my_excess == 0 {
        return Vec::new();
    }
    let share = my_excess as f64 / excess as f64;
    let mut takers: Vec<(&str, f64)> = members
        .iter()
        .filter(|(id, c)| id != me && (*c as f64) < mean)
        .map(|(id, c)| (id.as_str(), (mean - *c as f64) * share))
        .collect();
    takers.sort_by(|a, b| a.0.cmp(b.0));
    let wanted: f64 = takers.iter().map(|(_, w)| w).sum();
    let budget = (my_excess as usize)
        .min(balance.limit)
        .min((wanted + 1e-9).floor() as usize);
    if budget == 0 {
        return Vec::new();
    }
    // Largest remainder: each taker its whole part of the budget, then one
    // more each to the largest fractions.
    let scale = budget as f64 / wanted;
    let mut parts: Vec<(String, usize, f64)> = takers
        .iter()
        .map(|(id, w)| {
            let exact = w * scale;
            (
                id.to_string(),
                exact.floor() as usize,
                exact - exact.floor(),
            )
        })
        .collect();
    let given: usize = parts.iter().map(|(_, n, _)| n).sum();
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by(|&a, &b| parts[b].2.total_cmp(&parts[a].2).then(a.cmp(&b)));
    for &i in order.iter().take(budget.saturating_sub(given)) {
        parts[i].1 += 1;
    }
    parts
        .into_iter()
        .filter(|(_, n, _)| *n > 0)
        .map(|(id, n, _)| (id, n))
        .collect()
}

/// Which of `held` to hand over first: those not running here (`running`
/// lists the sessions running, with whether a turn runs or a message is
/// queued), then the idle running ones; never a busy one.
pub fn idle_first(held: Vec<Lease>, running: &[(SessionKey, bool)]) -> Vec<Lease> {
    let busy = |l: &Lease| running.iter().any(|(k, b)| *b && k.as_str() == l.key);
    let runs = |l: &Lease| running.iter().any(|(k, _)| k.as_str() == l.key);
    let (mut idle, mut asleep): (Vec<Lease>, Vec<Lease>) =
        held.into_iter().filter(|l| !busy(l)).partition(runs);
    asleep.append(&mut idle);
    asleep
}

impl Node {
    /// How this node spreads the load with the others. Default
    /// [`Balance::default`].
    pub fn with_balance(mut self, balance: Balance) -> Self {
        self.balance = balance;
        self
    }
}

/// The node's balancing: adopts the leases handed to it every scan
/// interval, and every [`Balance::interval`] (± a quarter, at random) hands
/// its share of idle sessions to the members below the mean.
pub(super) fn spawn(
    store: NodeStore,
    supervisor: Supervisor,
    balance: Balance,
) -> AbortOnDropHandle<()> {
    AbortOnDropHandle::new(tokio::spawn(async move {
        let mut next_round = tokio::time::Instant::now() + jittered(balance.interval);
        loop {
            tokio::time::sleep(store.scan_interval()).await;
            match store.adopt_handed().await {
                Ok(adopted) if !adopted.is_empty() => {
                    tracing::info!(target: "warden_pg::cluster", event = "cluster.adopted", sessions = adopted.len(), "adopted {} idle sessions handed to this node", adopted.len());
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(target: "warden_pg::cluster", event = "cluster.adopt_failed", error = %e, "cannot look for sessions handed to this node")
                }
            }
            if balance.interval.is_zero() || tokio::time::Instant::now() < next_round {
                continue;
            }
            next_round = tokio::time::Instant::now() + jittered(balance.interval);
            round(&store, &supervisor, &balance).await;
        }
    }))
}

/// `interval` ± up to a quarter, at random.
fn jittered(interval: Duration) -> Duration {
    interval.mul_f64(0.75 + rand::random::<f64>() * 0.5)
}

/// One round: the members' counts, the plan, the handovers. How many
/// sessions were handed over.
async fn round(store: &NodeStore, supervisor: &Supervisor, balance: &Balance) -> usize {
    // Not while sessions are going home after an outage of this node's.
    if !store.patience().outage.is_zero() {
        return 0;
    }
    let Ok(nodes) = store.pg().nodes().await else {
        return 0;
    };
    let members: Vec<(String, u64)> = nodes
        .into_iter()
        .filter(|n| n.state == NodeState::Alive)
        .map(|n| (n.node_id, n.sessions))
        .collect();
    let plan = plan(store.node(), &members, balance);
    if plan.is_empty() {
        return 0;
    }
    let Ok(statuses) = supervisor.statuses().await else {
        return 0;
    };
    let running: Vec<(SessionKey, bool)> = statuses
        .into_iter()
        .map(|s| {
            let busy = s.turn.is_some() || s.queued > 0 || !s.record.pending.is_empty();
            (s.key, busy)
        })
        .collect();
    let mut candidates = idle_first(store.held(), &running).into_iter();
    let mut handed = 0;
    for (to, n) in plan {
        let batch: Vec<Lease> = candidates.by_ref().take(n).collect();
        if batch.is_empty() {
            break;
        }
        let given = match store.hand_over(&to, &batch).await {
            Ok(given) => given,
            Err(e) => {
                tracing::debug!(target: "warden_pg::cluster", event = "cluster.handover_failed", to = %to, error = %e, "cannot hand sessions over");
                continue;
            }
        };
        for lease in &given {
            let _ = supervisor.evict(SessionKey::new(&lease.key)).await;
        }
        handed += given.len();
        if !given.is_empty() {
            tracing::info!(target: "warden_pg::cluster", event = "cluster.rebalanced", to = %to, sessions = given.len(), "handed {} idle sessions to {to} (this node held more than its share)", given.len());
        }
    }
    handed
}

#[cfg(test)]
#[path = "balance_tests.rs"]
mod tests;
