//! The balancing decision, on its own: which node gives how many idle
//! sessions to whom, given the live members' counts.

use super::*;

fn members(counts: &[(&str, u64)]) -> Vec<(String, u64)> {
    counts.iter().map(|(id, c)| (id.to_string(), *c)).collect()
}

fn plan_of(me: &str, counts: &[(&str, u64)], balance: &Balance) -> Vec<(String, usize)> {
    plan(me, &members(counts), balance)
}

/// Every member's count after one round in which every member acts on
/// the same counts.
fn after_round(counts: &[(&str, u64)], balance: &Balance) -> Vec<u64> {
    let mut after: Vec<u64> = counts.iter().map(|(_, c)| *c).collect();
    for (i, (me, _)) in counts.iter().enumerate() {
        for (to, n) in plan_of(me, counts, balance) {
            let j = counts
                .iter()
                .position(|(id, _)| *id == to)
                .expect("a member");
            after[i] -= n as u64;
            after[j] += n as u64;
        }
    }
    after
}

#[test]
fn a_returning_node_gets_its_share_from_both_others_in_one_round() {
    let counts = [("a", 150), ("b", 0), ("c", 150)];
    let balance = Balance::default().with_limit(100);
    assert_eq!(plan_of("a", &counts, &balance), vec![("b".into(), 50)]);
    assert_eq!(plan_of("c", &counts, &balance), vec![("b".into(), 50)]);
    assert!(
        plan_of("b", &counts, &balance).is_empty(),
        "b takes, never gives"
    );
    assert_eq!(after_round(&counts, &balance), vec![100, 100, 100]);
}

#[test]
fn a_round_hands_over_at_most_the_limit() {
    let counts = [("a", 150), ("b", 0), ("c", 150)];
    let balance = Balance::default().with_limit(20);
    assert_eq!(plan_of("a", &counts, &balance), vec![("b".into(), 20)]);
    // Round after round, the same limit, until the spread is gone.
    let mut now = counts.to_vec();
    let mut rounds = 0;
    loop {
        let after = after_round(&now, &balance);
        let still: Vec<u64> = now.iter().map(|(_, c)| *c).collect();
        if after == still {
            break;
        }
        now = now
            .iter()
            .zip(&after)
            .map(|((id, _), c)| (*id, *c))
            .collect();
        rounds += 1;
        assert!(rounds < 10, "no end: {now:?}");
    }
    assert_eq!(rounds, 3, "20 + 20 + 10 from each");
    assert_eq!(now, vec![("a", 100), ("b", 100), ("c", 100)]);
}

#[test]
fn givers_split_the_takers_so_no_taker_is_filled_twice() {
    let counts = [("a", 200), ("b", 0), ("c", 200), ("d", 0)];
    let balance = Balance::default().with_limit(1000);
    assert_eq!(
        plan_of("a", &counts, &balance),
        vec![("b".into(), 50), ("d".into(), 50)]
    );
    assert_eq!(after_round(&counts, &balance), vec![100, 100, 100, 100]);
    // Uneven: the fuller giver gives more, each taker to its deficit.
    let counts = [("a", 250), ("b", 20), ("c", 130), ("d", 0)];
    let after = after_round(&counts, &balance);
    assert_eq!(after.iter().sum::<u64>(), 400, "nothing lost: {after:?}");
    for c in &after {
        assert!((95..=105).contains(c), "{after:?}");
    }
}

#[test]
fn within_the_threshold_nothing_moves() {
    let balance = Balance::default();
    // Mean 100, threshold 10 %: 105 and 95 are 10 apart, not more.
    for me in ["a", "b", "c"] {
        assert!(plan_of(me, &[("a", 105), ("b", 95), ("c", 100)], &balance).is_empty());
    }
    // 106 and 94 are: down to the mean.
    assert_eq!(
        plan_of("a", &[("a", 106), ("b", 94), ("c", 100)], &balance),
        vec![("b".into(), 6)]
    );
    // Two givers at the threshold's edge still fill the one far below.
    assert_eq!(
        after_round(&[("a", 110), ("b", 80), ("c", 110)], &balance),
        vec![100, 100, 100]
    );
    // Few sessions: the threshold is at least one session.
    assert!(plan_of("a", &[("a", 1), ("b", 1), ("c", 0)], &balance).is_empty());
    assert_eq!(
        plan_of("a", &[("a", 3), ("b", 0), ("c", 0)], &balance),
        vec![("b".into(), 1), ("c".into(), 1)]
    );
    // Settled after a round: nobody gives again (no ping-pong).
    let after = after_round(&[("a", 5), ("b", 5), ("c", 0)], &balance);
    assert_eq!(after, vec![4, 4, 2]);
    let settled = [("a", 4), ("b", 4), ("c", 2)];
    assert_eq!(after_round(&settled, &balance), vec![4, 4, 2]);
}

#[test]
fn a_lone_node_an_empty_cluster_or_a_stranger_gives_nothing() {
    let balance = Balance::default();
    assert!(plan_of("a", &[("a", 100)], &balance).is_empty());
    assert!(plan_of("a", &[("a", 0), ("b", 0)], &balance).is_empty());
    assert!(plan_of("x", &[("a", 100), ("b", 0)], &balance).is_empty());
    assert!(plan_of("a", &[("a", 100), ("b", 0)], &balance.with_limit(0)).is_empty());
}

#[test]
fn the_spread_says_how_far_from_the_mean_each_member_is() {
    let s = Spread::of(&[150, 0, 150]);
    assert_eq!((s.nodes, s.sessions, s.spread), (3, 300, 150));
    assert!((s.mean - 100.0).abs() < 1e-9);
    assert!((s.deviation - 1.0).abs() < 1e-9, "b is 100 % below");
    let s = Spread::of(&[98, 102, 100]);
    assert!((s.deviation - 0.02).abs() < 1e-9);
    assert_eq!(Spread::of(&[]).deviation, 0.0);
}

#[test]
fn sleeping_sessions_go_first_then_idle_ones_then_busy_ones_longest_turn_first() {
    let lease = |k: &str| Lease {
        key: k.into(),
        node: "a".into(),
        epoch: 1,
    };
    let held = vec![
        lease("busy-new"),
        lease("idle"),
        lease("busy-old"),
        lease("asleep"),
    ];
    let running = vec![
        (SessionKey::new("busy-new"), Some(Duration::from_millis(10))),
        (SessionKey::new("idle"), None),
        (SessionKey::new("busy-old"), Some(Duration::from_secs(2))),
    ];
    let order: Vec<(String, bool)> = handover_order(held, &running)
        .into_iter()
        .map(|(l, busy)| (l.key, busy))
        .collect();
    let want = [
        ("asleep", false),
        ("idle", false),
        ("busy-old", true),
        ("busy-new", true),
    ];
    assert_eq!(
        order,
        want.map(|(k, b)| (k.to_owned(), b)).to_vec(),
        "busy sessions are candidates too, last, the one nearest its turn's end first"
    );
}
