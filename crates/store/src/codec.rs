//! A session record's bytes: `[version: u16 big-endian][bincode(serde)
//! record]`, bounded by [`MAX_RECORD_BYTES`]; older schema versions are read
//! and upgraded (`old`).

use warden_core::store::SCHEMA_VERSION;
use warden_core::{SessionRecord, StoreError};

use super::backend;

/// The largest encoded record, in bytes (256 MiB). Decoding is bounded by
/// it, so a damaged record that claims a huge string or list is
/// [`StoreError::Corrupt`] instead of an allocation that aborts the
/// process; encoding refuses a record over it, so nothing is written that
/// could not be read back.
pub const MAX_RECORD_BYTES: usize = 256 << 20;

/// bincode's standard configuration, bounded by [`MAX_RECORD_BYTES`].
fn config() -> bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<MAX_RECORD_BYTES>,
> {
    bincode::config::standard().with_limit::<MAX_RECORD_BYTES>()
}

/// Encodes a record: version prefix, then bincode.
pub fn encode(record: &SessionRecord) -> Result<Vec<u8>, StoreError> {
    let mut out = SCHEMA_VERSION.to_be_bytes().to_vec();
    let body = bincode::serde::encode_to_vec(record, config())
        .map_err(|e| backend(format!("encoding {}: {e}", record.key)))?;
    out.extend_from_slice(&body);
    Ok(out)
}

/// Decodes a record stored under `key`, checking its schema version.
pub fn decode(key: &str, bytes: &[u8]) -> Result<SessionRecord, StoreError> {
    let corrupt = |message: String| StoreError::Corrupt {
        key: key.to_owned(),
        message,
    };
    let (version, body) = match bytes {
        [a, b, rest @ ..] => (u16::from_be_bytes([*a, *b]), rest),
        _ => return Err(corrupt(format!("{} bytes is too short", bytes.len()))),
    };
    if version > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            key: key.to_owned(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    if version == 0 {
        return Err(corrupt("schema version 0".into()));
    }
    let (record, used): (SessionRecord, usize) = match version {
        1 => {
            let (old, used): (old::Record<old::V1>, usize) =
                bincode::serde::decode_from_slice(body, config())
                    .map_err(|e| corrupt(e.to_string()))?;
            (old.upgrade(), used)
        }
        2 => {
            let (old, used): (old::Record<old::V2>, usize) =
                bincode::serde::decode_from_slice(body, config())
                    .map_err(|e| corrupt(e.to_string()))?;
            (old.upgrade(), used)
        }
        _ => {
            bincode::serde::decode_from_slice(body, config()).map_err(|e| corrupt(e.to_string()))?
        }
    };
    if used != body.len() {
        return Err(corrupt(format!(
            "{} trailing bytes after the record",
            body.len() - used
        )));
    }
    if record.key != key {
        return Err(corrupt(format!("record names key {:?}", record.key)));
    }
    Ok(record)
}

/// Older schema versions, read and upgraded: 1 (before
/// [`PendingMessage::model`]) and 2 (before
/// [`PendingMessage::idempotency_key`]). Only the pending messages changed.
///
/// [`PendingMessage::model`]: warden_core::PendingMessage::model
/// [`PendingMessage::idempotency_key`]: warden_core::PendingMessage::idempotency_key
mod old {
    use std::path::PathBuf;

    use serde::Deserialize;
    use warden_core::store::{RecordStatus, StoredUsage};
    use warden_core::{PendingMessage, SessionKey, SessionRecord};

    /// A pending message of version 1.
    #[derive(Deserialize)]
    pub(super) struct V1 {
        id: u64,
        text: String,
        accepted_at_ms: u64,
    }

    impl From<V1> for PendingMessage {
        fn from(p: V1) -> Self {
            Self {
                id: p.id,
                text: p.text,
                accepted_at_ms: p.accepted_at_ms,
                model: None,
                idempotency_key: None,
            }
        }
    }

    /// A pending message of version 2.
    #[derive(Deserialize)]
    pub(super) struct V2 {
        id: u64,
        text: String,
        accepted_at_ms: u64,
        model: Option<String>,
    }

    impl From<V2> for PendingMessage {
        fn from(p: V2) -> Self {
            Self {
                id: p.id,
                text: p.text,
                accepted_at_ms: p.accepted_at_ms,
                model: p.model,
                idempotency_key: None,
            }
        }
    }

    /// A record of an older version: the fields in their order then, with
    /// that version's pending messages `P`.
    #[derive(Deserialize)]
    pub(super) struct Record<P> {
        key: String,
        workspace: Option<PathBuf>,
        agent_session_id: Option<String>,
        past_session_ids: Vec<String>,
        model: Option<String>,
        usage: Option<StoredUsage>,
        status: RecordStatus,
        restart_count: u32,
        created_at_ms: u64,
        last_active_ms: u64,
        pending: Vec<P>,
        next_message_id: u64,
    }

    impl<P: Into<PendingMessage>> Record<P> {
        /// The same record in today's schema.
        pub(super) fn upgrade(self) -> SessionRecord {
            let mut r = SessionRecord::new(&SessionKey::new(&self.key), self.workspace);
            r.agent_session_id = self.agent_session_id;
            r.past_session_ids = self.past_session_ids;
            r.model = self.model;
            r.usage = self.usage;
            r.status = self.status;
            r.restart_count = self.restart_count;
            r.created_at_ms = self.created_at_ms;
            r.last_active_ms = self.last_active_ms;
            r.pending = self.pending.into_iter().map(Into::into).collect();
            r.next_message_id = self.next_message_id;
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// A record of an older layout with pending messages `P`, written as a
    /// build of that time wrote it under `version`.
    fn old_record<P: serde::Serialize>(version: u16, pending: P) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct RecordOld<P> {
            key: String,
            workspace: Option<std::path::PathBuf>,
            agent_session_id: Option<String>,
            past_session_ids: Vec<String>,
            model: Option<String>,
            usage: Option<warden_core::store::StoredUsage>,
            status: warden_core::store::RecordStatus,
            restart_count: u32,
            created_at_ms: u64,
            last_active_ms: u64,
            pending: Vec<P>,
            next_message_id: u64,
        }
        let old = RecordOld {
            key: "ws".into(),
            workspace: Some("/work/ws".into()),
            agent_session_id: Some("conv-1".into()),
            past_session_ids: vec!["conv-0".into()],
            model: Some("claude-x".into()),
            usage: None,
            status: warden_core::store::RecordStatus::Idle,
            restart_count: 2,
            created_at_ms: 10,
            last_active_ms: 20,
            pending: vec![pending],
            next_message_id: 4,
        };
        let mut bytes = version.to_be_bytes().to_vec();
        bytes.extend(bincode::serde::encode_to_vec(&old, config()).expect("encode"));
        bytes
    }

    /// The fields every version has, read back from `record`.
    fn check_upgraded(record: &SessionRecord) {
        assert_eq!(record.key, "ws");
        assert_eq!(record.workspace.as_deref(), Some(Path::new("/work/ws")));
        assert_eq!(record.agent_session_id.as_deref(), Some("conv-1"));
        assert_eq!(record.past_session_ids, ["conv-0"]);
        assert_eq!(record.model.as_deref(), Some("claude-x"));
        assert_eq!(record.status, warden_core::store::RecordStatus::Idle);
        assert_eq!((record.restart_count, record.created_at_ms), (2, 10));
        assert_eq!((record.last_active_ms, record.next_message_id), (20, 4));
        assert_eq!(record.pending.len(), 1);
        let p = &record.pending[0];
        assert_eq!(
            (p.id, p.text.as_str(), p.accepted_at_ms),
            (3, "left over", 15)
        );
        assert_eq!(p.idempotency_key, None);
    }

    #[test]
    fn records_of_versions_1_and_2_read_back_upgraded() {
        #[derive(serde::Serialize)]
        struct PendingV1 {
            id: u64,
            text: String,
            accepted_at_ms: u64,
        }
        #[derive(serde::Serialize)]
        struct PendingV2 {
            id: u64,
            text: String,
            accepted_at_ms: u64,
            model: Option<String>,
        }
        let v1 = old_record(
            1,
            PendingV1 {
                id: 3,
                text: "left over".into(),
                accepted_at_ms: 15,
            },
        );
        let record = decode("ws", &v1).expect("a version 1 record decodes");
        check_upgraded(&record);
        assert_eq!(record.pending[0].model, None);
        let v2 = old_record(
            2,
            PendingV2 {
                id: 3,
                text: "left over".into(),
                accepted_at_ms: 15,
                model: Some("m2".into()),
            },
        );
        let record = decode("ws", &v2).expect("a version 2 record decodes");
        check_upgraded(&record);
        assert_eq!(record.pending[0].model.as_deref(), Some("m2"));
        // Read as today's layout, version 2 bytes do not decode (so the
        // version check above is what reads them).
        let mut as_v3 = v2.clone();
        as_v3[..2].copy_from_slice(&3u16.to_be_bytes());
        assert!(matches!(
            decode("ws", &as_v3),
            Err(StoreError::Corrupt { .. })
        ));
        // Written again, it is version 3 and keeps the model and the key.
        let mut again = record.clone();
        again.pending[0].idempotency_key = Some("k-1".into());
        let bytes = encode(&again).expect("encode");
        assert_eq!(u16::from_be_bytes([bytes[0], bytes[1]]), 3);
        assert_eq!(decode("ws", &bytes).expect("decode"), again);
    }
}
