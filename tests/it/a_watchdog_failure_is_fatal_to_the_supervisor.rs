//! Streams never run unwatched: when the watchdog fails or stops, the
//! supervisor stops too, taking its sessions and their streams with it.

use std::time::Duration;

use crate::common::*;
use ractor::ActorStatus;
use warden_core::{Supervisor, TurnError};

/// Starts a turn, breaks the watchdog with `break_it`, and checks the tree
/// went down: the supervisor stopped, the running turn is answered, nothing
/// more is served. Returns the running turn's stream.
async fn the_tree_goes_down_when(
    break_it: impl FnOnce(&Supervisor),
) -> warden_core::testing::AttemptControl {
    let (sup, ctl) = supervisor_with(config()).await;
    let turn = sup.send("ws", "hi").await.expect("send");
    let a = ctl
        .next_attempt()
        .within("the attempt")
        .await
        .expect("opened");
    break_it(&sup);
    sup.actor()
        .wait(Some(LIMIT))
        .await
        .expect("the supervisor stops when its watchdog is gone");
    assert_eq!(sup.actor().get_status(), ActorStatus::Stopped);
    match turn.finish().within("the running turn").await {
        Err(TurnError::SessionStopped { .. }) => {}
        other => panic!("unexpected {other:?}"),
    }
    assert!(sup.send("ws", "again").await.is_err(), "nothing is served");
    a
}

fn panic_in_the_watchdog(sup: &Supervisor) {
    // An expiry callback runs on the watchdog's task: a panic there fails
    // the watchdog actor.
    sup.watchdog()
        .watch(Some(Duration::from_millis(1)), |_| {
            panic!("expiry callback exploded")
        })
        .map(std::mem::forget)
        .expect("watch");
}

#[tokio::test(start_paused = true)]
async fn a_panicking_watchdog_stops_the_supervisor_and_answers_its_turns() {
    the_tree_goes_down_when(panic_in_the_watchdog).await;
}

#[tokio::test(start_paused = true)]
async fn a_stopped_watchdog_stops_the_supervisor_and_answers_its_turns() {
    the_tree_goes_down_when(|sup| sup.watchdog().actor().stop(Some("gone".into()))).await;
}

/// ractor runs no `post_stop` for an actor failing in
/// `handle_supervisor_evt` and kills its children, so unless the supervisor
/// stops its sessions itself, the running `StreamTask` task keeps reading
/// with nothing watching it.
#[tokio::test(start_paused = true)]
async fn the_streams_of_a_supervisor_whose_watchdog_failed_are_dropped() {
    let a = the_tree_goes_down_when(panic_in_the_watchdog).await;
    a.dropped().within("the stream to be dropped").await;
}
