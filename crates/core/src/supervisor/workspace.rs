//! A supervisor's workspaces: the key of a path, sends to a workspace, and
//! names bound to workspaces. Every path is normalized once, here
//! ([`normalize_workspace`]), and its normalization announced.

use std::path::{Path, PathBuf};

use crate::session::{SendOptions, SessionHandle, TurnHandle};
use crate::source::SessionKey;
use crate::transition::{At, Parent, Transition};
use crate::workspace::normalize_workspace;

use super::{Supervisor, SupervisorError};

impl Supervisor {
    /// The key the workspace at `path` maps to: the path normalized
    /// (absolute, symlinks and `.`/`..` resolved, no trailing separator),
    /// as every workspace entry point computes it. Two spellings of one
    /// directory give one key. The same as
    /// [`SessionKey::for_workspace`], which needs no supervisor, and
    /// announces the normalization on the bus.
    pub fn key_for(&self, path: impl AsRef<Path>) -> Result<SessionKey, SupervisorError> {
        let path = self.normalize(path.as_ref())?;
        Ok(SessionKey::of_normalized(&path))
    }

    /// The session of workspace `path` (normalized; its key is the
    /// normalized path).
    pub async fn workspace(
        &self,
        path: impl AsRef<Path>,
    ) -> Result<SessionHandle, SupervisorError> {
        let path = self.normalize(path.as_ref())?;
        let key = SessionKey::of_normalized(&path);
        self.session_inner(key, Some(path), None).await
    }

    /// Sends `message` to the session of workspace `path` (normalized).
    pub async fn send_to_workspace(
        &self,
        path: impl AsRef<Path>,
        message: impl Into<String>,
    ) -> Result<TurnHandle, SupervisorError> {
        self.send_to_workspace_with(path, message, SendOptions::default())
            .await
    }

    /// [`send_to_workspace`](Self::send_to_workspace) with per-turn
    /// [`SendOptions`].
    pub async fn send_to_workspace_with(
        &self,
        path: impl AsRef<Path>,
        message: impl Into<String>,
        options: SendOptions,
    ) -> Result<TurnHandle, SupervisorError> {
        let path = self.normalize(path.as_ref())?;
        let key = SessionKey::of_normalized(&path);
        self.send_inner(key, Some(path), None, message.into(), options)
            .await
    }

    /// Binds a name (a chat channel, a user) to a workspace; the path is
    /// normalized here, once.
    pub fn bind(
        &self,
        name: impl Into<String>,
        path: impl AsRef<Path>,
    ) -> Result<PathBuf, SupervisorError> {
        let path = self.normalize(path.as_ref())?;
        // A panic while holding the lock cannot leave the map half-written
        // (one insert or one get): the data is sound, use it.
        self.bindings.write().insert(name.into(), path.clone());
        Ok(path)
    }

    /// The workspace bound to `name`.
    pub fn bound(&self, name: &str) -> Option<PathBuf> {
        self.bindings.read().get(name).cloned()
    }

    /// Sends `message` to the workspace bound to `name`.
    pub async fn send_bound(
        &self,
        name: &str,
        message: impl Into<String>,
    ) -> Result<TurnHandle, SupervisorError> {
        let path = self
            .bound(name)
            .ok_or_else(|| SupervisorError::Unbound(name.to_owned()))?;
        let key = SessionKey::of_normalized(&path);
        self.send_inner(
            key,
            Some(path),
            None,
            message.into(),
            SendOptions::default(),
        )
        .await
    }

    fn normalize(&self, path: &Path) -> Result<PathBuf, SupervisorError> {
        let normalized = normalize_workspace(path).map_err(|e| SupervisorError::Workspace {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        if normalized.as_os_str() != path.as_os_str() {
            let key = SessionKey::of_normalized(&normalized);
            drop(
                Transition::WorkspaceNormalized {
                    original: path,
                    normalized: &normalized,
                }
                .record(At {
                    key: &key,
                    conversation: None,
                    parent: Parent::Root,
                    bus: Some(&self.bus),
                }),
            );
        }
        Ok(normalized)
    }
}
