//! Load spreads: each node, every [`Balance::interval`], compares the
//! sessions it holds with the live members' and, when it holds more than
//! the mean and the spread to the least loaded exceeds the
//! [threshold](Balance::threshold), hands
//! sessions to the nodes below the mean — at most [`Balance::limit`] a
//! round — in the spirit of Akka Cluster Sharding's least-shard allocation
//! with its rebalance threshold: idle ones (no turn running, no message
//! waiting) at once, then busy ones at their next turn boundary (marked,
//! their new turns wait while the turn in flight and the messages already
//! acknowledged finish here, at most [`TURN_BOUNDARY_WAIT`]; then they are
//! idle and move as such).
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

use derive_setters::Setters;
use tokio_util::task::AbortOnDropHandle;
use warden_core::{SessionKey, Supervisor};

use crate::{Lease, NodeState, NodeStore, TURN_BOUNDARY_WAIT};

/// How a node spreads the load with the others (`warden serve
/// --rebalance-interval`, `--rebalance-limit`, `--rebalance-threshold`).
#[derive(Debug, Clone, Copy, PartialEq, Setters)]
#[setters(prefix = "with_", strip_option)]
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
    /// above the mean give sessions away (down to the mean); once
    /// settled, every member is within about this fraction of the mean.
    /// Default 0.1 (10 %).
    #[setters(skip)]
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

/// How many sessions node `me` hands to each other live member this
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

/// Which of `held` to hand over first, each with whether it is busy:
/// those not running here, then the idle running ones, then the busy ones
/// (a turn running or a message waiting), the turn that has run longest
/// first (the likeliest to end soon). `running` lists the sessions running
/// here, each with how long its turn has run if it is busy (`None`: idle).
/// A busy one is handed over at its next turn boundary
/// ([`NodeStore::mark_moving`]).
pub fn handover_order(
    held: Vec<Lease>,
    running: &[(SessionKey, Option<Duration>)],
) -> Vec<(Lease, bool)> {
    let of = |l: &Lease| running.iter().find(|(k, _)| k.as_str() == l.key);
    let (mut asleep, mut idle, mut busy) = (Vec::new(), Vec::new(), Vec::new());
    for lease in held {
        match of(&lease) {
            None => asleep.push(lease),
            Some((_, None)) => idle.push(lease),
            Some((_, Some(ran))) => busy.push((*ran, lease)),
        }
    }
    busy.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.key.cmp(&b.1.key)));
    asleep.append(&mut idle);
    let mut order: Vec<(Lease, bool)> = asleep.into_iter().map(|l| (l, false)).collect();
    order.extend(busy.into_iter().map(|(_, l)| (l, true)));
    order
}

/// The node's balancing: adopts the leases handed to it every scan
/// interval, and every [`Balance::interval`] (± a quarter, at random) hands
/// its share of sessions to the members below the mean (busy ones at their
/// next turn boundary).
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
    let running: Vec<(SessionKey, Option<Duration>)> = statuses
        .into_iter()
        .map(|s| {
            let busy = s.turn.is_some() || s.queued > 0 || !s.record.pending.is_empty();
            (s.key, busy.then(|| s.turn_running_for.unwrap_or_default()))
        })
        .collect();
    let mut candidates = handover_order(store.held(), &running).into_iter();
    let mut handed = 0;
    let mut busy = Vec::new();
    for (to, n) in plan {
        let batch: Vec<(Lease, bool)> = candidates.by_ref().take(n).collect();
        if batch.is_empty() {
            break;
        }
        let (idle, later): (Vec<_>, Vec<_>) = batch.into_iter().partition(|(_, b)| !b);
        busy.extend(later.into_iter().map(|(l, _)| (to.clone(), l)));
        let idle: Vec<Lease> = idle.into_iter().map(|(l, _)| l).collect();
        if !idle.is_empty() {
            handed += give(store, supervisor, &to, &idle, "idle").await.len();
        }
    }
    if !busy.is_empty() {
        handed += at_turn_boundaries(store, supervisor, busy).await;
    }
    handed
}

/// Hands `leases` (idle now) to `to` and stops their copies here: the
/// leases handed.
async fn give(
    store: &NodeStore,
    supervisor: &Supervisor,
    to: &str,
    leases: &[Lease],
    how: &str,
) -> Vec<Lease> {
    let given = match store.hand_over(to, leases).await {
        Ok(given) => given,
        Err(e) => {
            tracing::debug!(target: "warden_pg::cluster", event = "cluster.handover_failed", to = %to, error = %e, "cannot hand sessions over");
            return Vec::new();
        }
    };
    for lease in &given {
        let _ = supervisor.evict(SessionKey::new(&lease.key)).await;
    }
    if !given.is_empty() {
        tracing::info!(target: "warden_pg::cluster", event = "cluster.rebalanced", to = %to, sessions = given.len(), kind = how, "handed {} {how} sessions to {to} (this node held more than its share)", given.len());
    }
    given
}

/// How often a node looks whether the busy sessions it hands over have
/// reached their turn boundary.
const BOUNDARY_POLL: Duration = Duration::from_millis(20);

/// Hands each of `busy` (the taker, the lease of a session with a turn
/// running or a message waiting) over at its next turn boundary: marks it
/// ([`NodeStore::mark_moving`]: its new turns wait), and once its turn in
/// flight and the messages already acknowledged are done here, hands it
/// over as an idle one (the statement still refuses it while a message
/// waits or a turn's end is not stored). A session not at a boundary
/// within [`TURN_BOUNDARY_WAIT`] stays here for this round; its turns go
/// on here. How many were handed over.
async fn at_turn_boundaries(
    store: &NodeStore,
    supervisor: &Supervisor,
    mut busy: Vec<(String, Lease)>,
) -> usize {
    /// Unmarks what is left however the round ends (the task aborted at
    /// shutdown included), so no turn waits for a move that is not coming.
    struct Marks<'a>(&'a NodeStore, Vec<String>);
    impl Drop for Marks<'_> {
        fn drop(&mut self) {
            self.0.unmark_moving(self.1.iter().map(String::as_str));
        }
    }
    for (to, lease) in &busy {
        store.mark_moving(&lease.key, to);
    }
    let _marks = Marks(store, busy.iter().map(|(_, l)| l.key.clone()).collect());
    let until = tokio::time::Instant::now() + TURN_BOUNDARY_WAIT;
    let mut handed = 0;
    loop {
        // Still this node's at the epoch chosen (not lost meanwhile).
        busy.retain(|(_, l)| {
            store
                .lease_of(&SessionKey::new(&l.key))
                .is_some_and(|h| h.epoch == l.epoch)
        });
        let mut ready: std::collections::BTreeMap<String, Vec<Lease>> = Default::default();
        for (to, lease) in &busy {
            if at_boundary(supervisor, &lease.key).await {
                ready.entry(to.clone()).or_default().push(lease.clone());
            }
        }
        for (to, leases) in ready {
            let given = give(store, supervisor, &to, &leases, "busy").await;
            store.unmark_moving(given.iter().map(|l| l.key.as_str()));
            busy.retain(|(_, l)| !given.iter().any(|g| g.key == l.key));
            handed += given.len();
        }
        if busy.is_empty() || tokio::time::Instant::now() >= until {
            break;
        }
        tokio::time::sleep(BOUNDARY_POLL).await;
    }
    if !busy.is_empty() {
        tracing::debug!(target: "warden_pg::cluster", event = "cluster.handover_deferred", sessions = busy.len(), "busy sessions reached no turn boundary in time; they stay for now");
    }
    handed
}

/// Whether session `key` is at a turn boundary here: not running, or
/// running with no turn, nothing queued and no message waiting.
async fn at_boundary(supervisor: &Supervisor, key: &str) -> bool {
    match supervisor.running(SessionKey::new(key)).await {
        Ok(None) => true,
        Ok(Some(session)) => session
            .status()
            .await
            .is_ok_and(|s| s.turn.is_none() && s.queued == 0 && s.record.pending.is_empty()),
        Err(_) => false,
    }
}

#[cfg(test)]
#[path = "balance_tests.rs"]
mod tests;
