//! The orphan scan's query: sessions with waiting messages whose owner's
//! lease ran out, and what a node needs besides to choose among them.

use std::time::Duration;

use warden_core::{SessionKey, StoreError};

use crate::{PgStore, TAKEOVER_GRACE, backend, secs};

/// A row of `warden_sessions` that is an orphan: messages waiting for an
/// answer and no lease, or one expired for longer than the takeover grace
/// (`$1`, in seconds).
const ORPHAN: &str =
    "waiting AND (lease_until IS NULL OR lease_until < now() - make_interval(secs => $1))";

/// What [`PgStore::orphans_with_workspaces`] found.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Orphans {
    /// The orphans, each with the workspace directory its record names.
    pub sessions: Vec<(SessionKey, Option<std::path::PathBuf>)>,
    /// How long until the next lease of a session with waiting messages,
    /// held by another node, can be taken (its expiry plus
    /// [`TAKEOVER_GRACE`]), if such a lease is held. A live owner renews it
    /// before then; a dead one's sessions are orphans from then on.
    pub next_in: Option<Duration>,
    /// Sessions with waiting messages whose lease the asking node holds
    /// (live, or expired within the grace, when only it may renew it):
    /// each must run on that node; one that does not is started there
    /// ([`Node::take_over`](crate::cluster::Node::take_over)).
    pub held_waiting: Vec<SessionKey>,
    /// Those of [`sessions`](Self::sessions) whose lease the asking node
    /// held last and did not give back (it gave them up in a database
    /// outage, or it restarted under the same id): it takes them back before any other orphan
    /// ([`Node::take_over`](crate::cluster::Node::take_over)).
    pub own: Vec<SessionKey>,
}

impl PgStore {
    /// [`orphans`](Self::orphans), each with the workspace directory its
    /// record names (if any), how soon the next lease of a session with
    /// waiting messages held by a node other than `node` can be taken, and
    /// the waiting sessions `node` holds itself, in one query: what a node
    /// needs to choose the orphans it can run, to check that it runs what
    /// it holds, and to know when to look again.
    pub async fn orphans_with_workspaces(&self, node: &str) -> Result<Orphans, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT CASE WHEN owner = $2 AND lease_until IS NOT NULL \
                   THEN 'own' ELSE 'orphan' END, key, \
                   record ->> 'workspace', NULL::float8 \
                 FROM warden_sessions WHERE {ORPHAN} \
                 UNION ALL \
                 SELECT 'held', key, NULL, NULL FROM warden_sessions \
                 WHERE waiting AND owner = $2 \
                   AND lease_until >= now() - make_interval(secs => $1) \
                 UNION ALL \
                 SELECT 'next', NULL, NULL, \
                   (EXTRACT(EPOCH FROM min(lease_until) - now()) + $1)::float8 \
                 FROM warden_sessions \
                 WHERE waiting AND lease_until >= now() - make_interval(secs => $1) \
                   AND owner IS DISTINCT FROM $2"
                ),
                &[&secs(TAKEOVER_GRACE), &node],
            )
            .await
            .map_err(backend)?;
        let mut found = Orphans::default();
        for r in rows {
            let key: Option<String> = r.get(1);
            match (r.get::<_, &str>(0), key) {
                (kind @ ("orphan" | "own"), Some(key)) => {
                    if kind == "own" {
                        found.own.push(SessionKey::new(&key));
                    }
                    let workspace: Option<String> = r.get(2);
                    found.sessions.push((
                        SessionKey::new(key),
                        workspace.map(std::path::PathBuf::from),
                    ));
                }
                ("held", Some(key)) => found.held_waiting.push(SessionKey::new(key)),
                _ => {
                    found.next_in = r
                        .get::<_, Option<f64>>(3)
                        .map(|s| Duration::from_secs_f64(s.max(0.0)));
                }
            }
        }
        Ok(found)
    }

    /// Sessions with messages waiting for an answer whose lease is free or
    /// expired: what a node takes over when their owner has died.
    pub async fn orphans(&self) -> Result<Vec<SessionKey>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!("SELECT key FROM warden_sessions WHERE {ORPHAN} ORDER BY key"),
                &[&secs(TAKEOVER_GRACE)],
            )
            .await
            .map_err(backend)?;
        Ok(rows
            .into_iter()
            .map(|r| SessionKey::new(r.get::<_, String>(0)))
            .collect())
    }
}
