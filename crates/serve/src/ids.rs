//! Turn ids. A cluster node's ids name the node that started the turn
//! (`turn_<node in hex>_<random>`), so any node knows where to ask for it.

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
}
