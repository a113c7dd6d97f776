//! [`SledLabels`]: a small map from session key to a short text, in its
//! own tree beside the records (`warden serve` keeps there the agent each
//! session runs). Kept apart from [`SessionRecord`](warden_core::SessionRecord)
//! so that the record's encoding, and every reader of it, is unchanged.

use std::sync::atomic::Ordering;

use warden_core::StoreError;

use crate::{SledStore, backend, describe};

/// A map of session key → label in one tree of a [`SledStore`]'s
/// database; see [`SledStore::labels`].
#[derive(Debug, Clone)]
pub struct SledLabels {
    store: SledStore,
    tree: sled::Tree,
}

impl SledStore {
    /// The labels kept in tree `name` of this database (created empty if
    /// new). `sessions` and the turn logs' tree are not label trees.
    pub fn labels(&self, name: &str) -> Result<SledLabels, StoreError> {
        if name == crate::TREE || name == crate::turns::TREE {
            return Err(backend(format!("{name:?} is not a label tree")));
        }
        let tree = self.db.open_tree(name).map_err(|e| backend(describe(&e)))?;
        Ok(SledLabels {
            store: self.clone(),
            tree,
        })
    }
}

impl SledLabels {
    /// The label of `key`, if it has one.
    pub fn get(&self, key: &str) -> Result<Option<String>, StoreError> {
        let value = self
            .tree
            .get(key.as_bytes())
            .map_err(|e| backend(describe(&e)))?;
        Ok(value.map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// Gives `key` the label `value` unless it has one (atomically: of two
    /// racing calls one wins); the label it has afterwards. Not flushed
    /// yet: see [`flush`](Self::flush), or [`label`](Self::label).
    pub fn set_if_absent(&self, key: &str, value: &str) -> Result<String, StoreError> {
        let swapped = self
            .tree
            .compare_and_swap(key.as_bytes(), None::<&[u8]>, Some(value.as_bytes()))
            .map_err(|e| backend(describe(&e)))?;
        // Counted as a write, so the next flush covers it.
        self.store.commit.written.fetch_add(1, Ordering::SeqCst);
        Ok(match swapped {
            Ok(()) => value.to_owned(),
            Err(current) => current
                .current
                .map(|v| String::from_utf8_lossy(&v).into_owned())
                .unwrap_or_else(|| value.to_owned()),
        })
    }

    /// [`set_if_absent`](Self::set_if_absent), on disk when it returns.
    pub async fn label(&self, key: &str, value: &str) -> Result<String, StoreError> {
        let label = self.set_if_absent(key, value)?;
        self.flush().await?;
        Ok(label)
    }

    /// Flushes everything written so far to disk (with the records').
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.store.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_label_is_set_once_and_read_back_after_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let store = SledStore::open(dir.path()).expect("open");
            let labels = store.labels("agents").expect("labels");
            assert_eq!(labels.get("a").expect("get"), None);
            assert_eq!(labels.label("a", "codex").await.expect("label"), "codex");
            assert_eq!(labels.label("a", "gemini").await.expect("label"), "codex");
            assert!(store.labels("sessions").is_err());
        }
        let store = SledStore::open(dir.path()).expect("reopen");
        let labels = store.labels("agents").expect("labels");
        assert_eq!(labels.get("a").expect("get").as_deref(), Some("codex"));
    }
}
