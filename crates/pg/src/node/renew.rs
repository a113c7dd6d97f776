//! Keeping a node's leases alive: renewals every third of the TTL, and
//! the self-fencing that gives a lease up when they do not get through.

use std::time::Duration;

use tokio_util::task::AbortOnDropHandle;
use warden_core::StoreError;

use super::NodeStore;
use crate::Lease;

/// How often a node retries renewing its leases while the database fails,
/// and how often it checks that each is still valid by its own clock.
const OUTAGE_RETRY: Duration = Duration::from_millis(100);

impl NodeStore {
    /// Self-fencing: every lease whose last successful renewal was sent a
    /// TTL ago or more (the database cannot be reached, or answers too
    /// late) is given up here and reported on [`lost`](Self::lost), so
    /// its session stops on this node before the lease can be taken — the
    /// database lets another node take it only [`TAKEOVER_GRACE`] after it
    /// expires, and it expires no sooner than a TTL after that renewal was
    /// sent. The node cannot tell a partition from an outage, so in an
    /// outage longer than the TTL its sessions stop too (their messages
    /// stay pending; whichever node reaches the database first re-delivers
    /// them). Returns how many were given up.
    ///
    /// [`TAKEOVER_GRACE`]: crate::TAKEOVER_GRACE
    pub fn fence_expired(&self) -> usize {
        let now = tokio::time::Instant::now();
        // (Never both locks at once: `remove` takes them leases first.)
        let held = self.held();
        let due: Vec<Lease> = {
            let renewed = self.renewed.lock();
            held.into_iter()
                .filter(|l| match renewed.get(&l.key) {
                    Some((epoch, sent)) if *epoch == l.epoch => now >= *sent + self.ttl,
                    // Taken a moment ago, its time not written yet.
                    _ => false,
                })
                .collect()
        };
        let mut fenced = 0;
        for lease in due {
            if let Some(l) = self.remove(&lease) {
                fenced += 1;
                tracing::debug!(
                    event = "pg.lease_fenced",
                    session = %l.key,
                    epoch = l.epoch,
                    "cannot renew a session's lease in time; stopping it here before another node may take it"
                );
                self.fenced.lock().insert((l.key.clone(), l.epoch));
                self.remember_home(&l.key);
                let _ = self.lost.send(l);
            }
        }
        // Expected in an outage (the node cannot tell it from a partition):
        // said once per pass, not per session, and not as an error.
        if fenced > 0 {
            tracing::info!(
                event = "pg.leases_fenced",
                sessions = fenced,
                "cannot reach the database to renew leases in time: gave {fenced} up and stopped their sessions here; their turns are re-delivered once the database answers"
            );
        }
        fenced
    }

    /// Renews every held lease once; the ones lost are forgotten and
    /// reported. Returns how many were lost.
    pub async fn renew_all(&self) -> Result<usize, StoreError> {
        let held = self.held();
        let sent = tokio::time::Instant::now();
        // Every lease in one statement. One that hangs (a partition drops
        // its packets) is given up after a TTL: the leases are past saving
        // by then.
        let renewed =
            tokio::time::timeout(self.ttl, self.pg.renew_many(&self.node, &held, self.ttl))
                .await
                .map_err(|_| StoreError::Backend {
                    message: format!(
                        "renewing {} leases got no answer within {:.1}s",
                        held.len(),
                        self.ttl.as_secs_f64()
                    ),
                })
                .and_then(|r| r);
        if !held.is_empty() {
            self.reached(&renewed);
        }
        let renewed = renewed?;
        let mut lost = 0;
        for lease in held {
            if !renewed.contains(&lease.key) {
                self.forget(&lease);
                lost += 1;
                continue;
            }
            if self.holds(&lease) {
                self.renewed
                    .lock()
                    .insert(lease.key.clone(), (lease.epoch, sent));
            } else {
                // Fenced here while the renewal was on its way: give it
                // back, so another node need not wait for it to expire.
                let _ = self.pg.release(&lease).await;
            }
        }
        Ok(lost)
    }

    /// Renews the leases every third of the TTL until the returned handle
    /// is dropped or aborted. A renewal that fails on the database's side
    /// (unreachable) is retried at the next tick; the leases then expire on
    /// their own if it stays down, and the fence keeps writes safe.
    pub fn spawn_renewer(&self) -> AbortOnDropHandle<()> {
        let store = self.clone();
        let every = self.ttl / 3;
        let handle = tokio::spawn(async move {
            // One line when renewals start failing and one when they work
            // again: an outage is one warning, not one per tick. While they
            // fail, they are retried every 100 ms, so the leases are renewed
            // within the takeover grace once the database answers again.
            let mut failing_since: Option<tokio::time::Instant> = None;
            // Each lease's validity by this node's clock, checked apart
            // from the renewals (which may hang).
            let fencing = {
                let store = store.clone();
                AbortOnDropHandle::new(tokio::spawn(async move {
                    let mut tick = tokio::time::interval(OUTAGE_RETRY);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        tick.tick().await;
                        store.fence_expired();
                    }
                }))
            };
            let _fencing = fencing;
            loop {
                let wait = match failing_since {
                    Some(_) => OUTAGE_RETRY.min(every),
                    None => every,
                };
                tokio::time::sleep(wait).await;
                match (store.renew_all().await, failing_since) {
                    (Ok(_), Some(since)) => {
                        failing_since = None;
                        // The node's heartbeat says the outage ended.
                        tracing::debug!(
                            event = "pg.renew_recovered",
                            down_ms =
                                u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX),
                            "leases renew again"
                        );
                    }
                    (Ok(_), None) => {}
                    (Err(e), None) => {
                        failing_since = Some(tokio::time::Instant::now());
                        // The node's heartbeat warns of the outage once.
                        tracing::info!(event = "pg.renew_failed", error = %e, "cannot renew leases; retrying every 100 ms");
                    }
                    (Err(e), Some(_)) => {
                        tracing::debug!(event = "pg.renew_failed", error = %e, "still cannot renew leases");
                    }
                }
            }
        });
        AbortOnDropHandle::new(handle)
    }
}
