//! [`PgStore`]: the session records on PostgreSQL (a [`SessionStore`]),
//! its connection pools and the schema migrated on connect.

use futures_util::future::BoxFuture;
use serde_json::Value;
use warden_core::store::SCHEMA_VERSION;
use warden_core::{Durability, SessionKey, SessionRecord, SessionStore, StoreError};

use crate::{PgError, backend, error_chain, migrate, tls};

/// The session store on PostgreSQL. Cheap to clone (a pool).
#[derive(Clone)]
pub struct PgStore {
    pool: deadpool_postgres::Pool,
    /// Two connections of their own for what keeps a node's leases and
    /// membership alive (renewals, heartbeats): never queued behind the
    /// data traffic of a busy node, whose leases would otherwise lapse
    /// under load.
    control: deadpool_postgres::Pool,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects to `url` (`postgres://USER[:PASSWORD]@HOST:PORT/DB`, or the
    /// key=value form) with a pool of 16 connections, and creates or
    /// migrates the schema. `sslmode=require` (or `verify-ca`,
    /// `verify-full`) connects over TLS and verifies the server against
    /// `sslrootcert` (a PEM file), else the public web roots; without it the
    /// connection is plaintext (see [`tls`](crate#tls)).
    pub async fn connect(url: &str) -> Result<Self, PgError> {
        let tls::TlsOptions { rest, root_cert } = tls::split(url);
        let config: tokio_postgres::Config = rest.parse().map_err(|e: tokio_postgres::Error| {
            // The URL may hold a password: the parser's message does not.
            PgError::Url(e.to_string())
        })?;
        Self::open(config, root_cert.as_deref()).await
    }

    /// [`connect`](Self::connect) with a parsed configuration (TLS, when it
    /// requires it, verified against the public web roots).
    pub async fn connect_config(config: tokio_postgres::Config) -> Result<Self, PgError> {
        Self::open(config, None).await
    }

    async fn open(
        mut config: tokio_postgres::Config,
        root_cert: Option<&std::path::Path>,
    ) -> Result<Self, PgError> {
        let connector = tls::connector(&mut config, root_cert)?;
        let pool = |size: usize| {
            let manager = deadpool_postgres::Manager::from_config(
                config.clone(),
                connector.clone(),
                deadpool_postgres::ManagerConfig {
                    recycling_method: deadpool_postgres::RecyclingMethod::Fast,
                },
            );
            deadpool_postgres::Pool::builder(manager)
                .max_size(size)
                .runtime(deadpool_postgres::Runtime::Tokio1)
                .build()
                .map_err(|e| PgError::Connect(e.to_string()))
        };
        let store = Self {
            pool: pool(16)?,
            control: pool(2)?,
        };
        let mut client = store
            .pool
            .get()
            .await
            .map_err(|e| PgError::Connect(error_chain(&e)))?;
        migrate::run(&mut client).await?;
        Ok(store)
    }

    /// One round trip to the database (`SELECT 1`): whether it answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        client.simple_query("SELECT 1").await.map_err(backend)?;
        Ok(())
    }

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(backend)
    }

    /// [`client`](Self::client) with the pool's error as it is, for a
    /// caller that tells an unreachable database from other failures
    /// ([`unreachable`](crate::unreachable)).
    pub(crate) async fn pooled(
        &self,
    ) -> Result<deadpool_postgres::Object, deadpool_postgres::PoolError> {
        self.pool.get().await
    }

    /// A connection of the control pool (lease renewals, heartbeats).
    pub(crate) async fn control_client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.control.get().await.map_err(backend)
    }

    /// The record of `key`, decoded: `None` when there is none yet.
    pub(crate) fn decode(
        key: &str,
        version: i16,
        record: Option<Value>,
    ) -> Result<Option<SessionRecord>, StoreError> {
        let Some(record) = record.filter(|r| !r.is_null()) else {
            return Ok(None);
        };
        let version = u16::try_from(version).unwrap_or(u16::MAX);
        if version > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                key: key.to_owned(),
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        serde_json::from_value(record)
            .map(Some)
            .map_err(|e| StoreError::Corrupt {
                key: key.to_owned(),
                message: e.to_string(),
            })
    }

    pub(crate) fn encode(record: &SessionRecord) -> Result<Value, StoreError> {
        serde_json::to_value(record).map_err(|e| StoreError::Backend {
            message: format!("cannot encode session record {:?}: {e}", record.key),
        })
    }
}

impl SessionStore for PgStore {
    fn load(&self, key: &SessionKey) -> BoxFuture<'_, Result<Option<SessionRecord>, StoreError>> {
        let key = key.as_str().to_owned();
        Box::pin(async move {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "SELECT schema_version, record FROM warden_sessions WHERE key = $1",
                    &[&key],
                )
                .await
                .map_err(backend)?;
            match row {
                None => Ok(None),
                Some(row) => Self::decode(&key, row.get(0), row.get(1)),
            }
        })
    }

    /// Writes without a lease: for one process alone on the database.
    /// Nodes of a cluster write through [`NodeStore`](crate::low_level::NodeStore) instead. Every
    /// commit is durable (PostgreSQL's `synchronous_commit`), whatever
    /// `durability` asks.
    fn save<'a>(
        &'a self,
        record: &'a SessionRecord,
        _durability: Durability,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let value = Self::encode(record)?;
            let client = self.client().await?;
            client
                .execute(
                    "INSERT INTO warden_sessions (key, schema_version, record) VALUES ($1, $2, $3) \
                     ON CONFLICT (key) DO UPDATE SET record = EXCLUDED.record, \
                     schema_version = EXCLUDED.schema_version, updated_at = now()",
                    &[&record.key, &(SCHEMA_VERSION as i16), &value],
                )
                .await
                .map_err(backend)?;
            Ok(())
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Result<SessionRecord, StoreError>>, StoreError>> {
        Box::pin(async move {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT key, schema_version, record FROM warden_sessions \
                     WHERE record IS NOT NULL AND record <> 'null'::jsonb ORDER BY key",
                    &[],
                )
                .await
                .map_err(backend)?;
            Ok(rows
                .into_iter()
                .filter_map(|row| {
                    let key: String = row.get(0);
                    Self::decode(&key, row.get(1), row.get(2)).transpose()
                })
                .collect())
        })
    }
}
