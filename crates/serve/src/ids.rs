//! Turn ids. A cluster node's ids name the node that started the turn
//! (`turn_<node in hex>_<random>`), so any node knows where to ask for it.
//! A turn sent with an idempotency key gets an id derived from its session
//! and key (`turn_<32 hex digits>`), the same on every node and after a
//! restart, so a retried request finds it; the turn keeps its request's
//! fingerprint, so a request repeating the key with another body is told
//! apart from a retry.

use sha2::{Digest, Sha256};
use warden_core::SessionKey;

/// The id of the turn of session `key` its client named `idempotency_key`:
/// `turn_` and the first 128 bits of SHA-256 over both, in hex. It names
/// no node (any node reads it from the cluster's store).
pub(crate) fn idempotent_turn_id(key: &SessionKey, idempotency_key: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(key.as_str().as_bytes());
    hash.update([0u8]);
    hash.update(idempotency_key.as_bytes());
    let digest = hash.finalize();
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("turn_{hex}")
}

/// The fingerprint of a `POST /v1/turns` with an idempotency key: SHA-256
/// over its `message`, `model` and `agent` as the body gives them (an
/// absent field differs from every given one, an empty one included), in
/// hex. Each field is length-prefixed, so no two bodies share one. Stable
/// across builds, platforms and nodes: it is stored with the turn
/// ([`StoredTurn::fingerprint`](warden_core::store::StoredTurn)) and
/// compared after a restart or on another node.
pub(crate) fn request_fingerprint(
    message: &str,
    model: Option<&str>,
    agent: Option<&str>,
) -> String {
    let mut hash = Sha256::new();
    hash.update(b"warden-turn-request-v1");
    for field in [Some(message), model, agent] {
        match field {
            None => hash.update([0u8]),
            Some(text) => {
                hash.update([1u8]);
                hash.update((text.len() as u64).to_be_bytes());
                hash.update(text.as_bytes());
            }
        }
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// A turn id naming `node`: `turn_<node in hex>_<16 hex digits>`.
pub(crate) fn turn_id(node: Option<&str>) -> String {
    let tail = rand::random::<u64>();
    match node {
        None => format!("turn_{tail:016x}"),
        Some(n) => {
            let hex: String = n.bytes().map(|b| format!("{b:02x}")).collect();
            format!("turn_{hex}_{tail:016x}")
        }
    }
}

/// The node a turn id names, if it names one.
pub(crate) fn node_of_turn(id: &str) -> Option<String> {
    let (hex, tail) = id.strip_prefix("turn_")?.split_once('_')?;
    let is_hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    if hex.is_empty() || hex.len() % 2 != 0 || !is_hex(hex) || tail.len() != 16 || !is_hex(tail) {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_id_names_its_node_and_only_a_clusters_ids_do() {
        let id = turn_id(Some("node-a_1.x"));
        assert!(id.starts_with("turn_"), "{id}");
        assert_eq!(node_of_turn(&id).as_deref(), Some("node-a_1.x"));
        assert_eq!(node_of_turn(&turn_id(None)), None);
        assert_eq!(node_of_turn("turn_zz_0000000000000001"), None);
        assert_eq!(node_of_turn("turn_6_0000000000000001"), None);
        assert_eq!(node_of_turn("nope"), None);
        assert_eq!(node_of_turn("turn_61_../../x/0000000"), None);
    }

    #[test]
    fn an_idempotency_key_names_one_turn_per_session() {
        let a = SessionKey::new("a");
        let id = idempotent_turn_id(&a, "k1");
        assert_eq!(id, idempotent_turn_id(&a, "k1"));
        assert_eq!(id.len(), "turn_".len() + 32, "{id}");
        assert_ne!(id, idempotent_turn_id(&a, "k2"));
        assert_ne!(id, idempotent_turn_id(&SessionKey::new("b"), "k1"));
        // The separator keeps ("a", "bk") and ("ab", "k") apart.
        assert_ne!(
            idempotent_turn_id(&SessionKey::new("ab"), "k"),
            idempotent_turn_id(&a, "bk")
        );
        assert_eq!(node_of_turn(&id), None);
        // Stable across builds and platforms: a restarted server, or
        // another node, derives the same id (SHA-256 of "a\0k1").
        assert_eq!(
            idempotent_turn_id(&a, "k1"),
            "turn_fb97f2ca0918a2711297b0359b49adeb"
        );
    }

    #[test]
    fn a_request_fingerprint_tells_every_field_apart() {
        let fp = request_fingerprint("hello", None, None);
        assert_eq!(fp, request_fingerprint("hello", None, None));
        assert_eq!(fp.len(), 64, "{fp}");
        let others = [
            request_fingerprint("hello!", None, None),
            request_fingerprint("hello", Some("m"), None),
            request_fingerprint("hello", Some(""), None),
            request_fingerprint("hello", None, Some("openai")),
            request_fingerprint("hello", None, Some("")),
            // A model and an agent of the same text are different fields.
            request_fingerprint("hello", Some("x"), None),
            request_fingerprint("hello", None, Some("x")),
            // The lengths keep ("ab", "c") and ("a", "bc") apart.
            request_fingerprint("ab", Some("c"), None),
            request_fingerprint("a", Some("bc"), None),
        ];
        let mut all: Vec<&String> = others.iter().collect();
        all.push(&fp);
        let distinct: std::collections::HashSet<_> = all.iter().collect();
        assert_eq!(distinct.len(), all.len(), "{all:#?}");
        // Stable across builds and platforms: stored, and compared after a
        // restart or on another node (SHA-256 of the tag, then 1, the
        // length in 8 bytes big-endian and "hello", then 0 and 0).
        assert_eq!(
            fp,
            "f4fe410fddd46ba49291d8f725ec626ee116493a5dafb0165d0efa06cda5ac9a"
        );
    }
}
