use std::time::Duration;

use super::*;

#[test]
fn turns_go_round_the_namespaces_with_waiters_whatever_one_has_queued() {
    let mut turns = Turns::default();
    for ticket in 1..=5 {
        turns.push("noisy", ticket, Priority::Foreground);
    }
    turns.push("quiet", 6, Priority::Foreground);
    turns.push("other", 7, Priority::Foreground);
    turns.push("noisy", 8, Priority::Foreground);
    let served: Vec<u64> = std::iter::from_fn(|| turns.next()).collect();
    assert_eq!(served, vec![1, 6, 7, 2, 3, 4, 5, 8]);
    assert!(turns.is_empty());
}

#[test]
fn a_pool_refill_waits_behind_the_claims_of_its_namespace_and_no_other_namespace_does() {
    use Priority::{Background, Foreground};
    let mut turns = Turns::default();
    // The refill's members came first, then the claims that set it off, then another namespace.
    turns.push("agents", 1, Background);
    turns.push("agents", 2, Background);
    turns.push("agents", 3, Foreground);
    turns.push("other", 4, Background);
    turns.push("agents", 5, Foreground);
    let served: Vec<u64> = std::iter::from_fn(|| turns.next()).collect();
    // agents' claims first (3, 5), round-robin with other's turn (4), then agents' refill.
    assert_eq!(served, vec![3, 4, 5, 1, 2]);
    turns.push("agents", 6, Background);
    turns.push("agents", 7, Foreground);
    turns.remove("agents", 7);
    assert_eq!(turns.len(), 1);
    assert_eq!(turns.next(), Some(6));
    assert!(turns.is_empty());
}

#[tokio::test]
async fn a_freed_slot_goes_to_a_waiting_claim_before_the_refill_that_waited_longer() {
    let share = FairShare::new(1);
    let held = share.take("agents", Priority::Foreground).await;
    let mut refill = Box::pin(share.take("agents", Priority::Background));
    assert!(pending(&mut refill).await, "no slot is free");
    let mut claim = Box::pin(share.take("agents", Priority::Foreground));
    assert!(pending(&mut claim).await);
    drop(held);
    let claimed = claim.await;
    assert!(
        pending(&mut refill).await,
        "the refill went before the claim"
    );
    drop(claimed);
    let _refill = refill.await;
}

#[test]
fn a_namespace_coming_back_waits_for_its_turn_behind_those_waiting() {
    let mut turns = Turns::default();
    turns.push("a", 1, Priority::Foreground);
    turns.push("b", 2, Priority::Foreground);
    assert_eq!(turns.next(), Some(1));
    // `a` has nobody left: it rejoins at the back.
    turns.push("a", 3, Priority::Foreground);
    turns.push("c", 4, Priority::Foreground);
    let served: Vec<u64> = std::iter::from_fn(|| turns.next()).collect();
    assert_eq!(served, vec![2, 3, 4]);
}

#[test]
fn a_waiter_that_gives_up_leaves_no_turn_behind() {
    let mut turns = Turns::default();
    turns.push("a", 1, Priority::Foreground);
    turns.push("b", 2, Priority::Foreground);
    turns.push("a", 3, Priority::Foreground);
    turns.remove("b", 2);
    turns.remove("a", 1);
    assert_eq!(turns.len(), 1);
    assert_eq!(turns.next(), Some(3));
    assert_eq!(turns.next(), None);
}

/// Whether `future` is still pending after everything ready has run.
async fn pending<F: Future + Unpin>(future: &mut F) -> bool {
    tokio::time::timeout(Duration::from_millis(20), future)
        .await
        .is_err()
}

#[tokio::test]
async fn a_freed_slot_goes_to_the_next_namespace_not_to_the_one_with_the_most_queued() {
    let share = FairShare::new(2);
    let [first, second] = [
        share.take("noisy", Priority::Foreground).await,
        share.take("noisy", Priority::Foreground).await,
    ];
    let mut noisy = Box::pin(share.take("noisy", Priority::Foreground));
    let mut noisy_again = Box::pin(share.take("noisy", Priority::Foreground));
    assert!(pending(&mut noisy).await, "no slot is free");
    assert!(pending(&mut noisy_again).await);
    let mut quiet = Box::pin(share.take("quiet", Priority::Foreground));
    assert!(pending(&mut quiet).await);
    assert_eq!(share.waiting(), 3);

    drop(first);
    let _noisy = noisy.await;
    drop(second);
    // quiet came after both of noisy's waiters, yet is served before the second.
    let _quiet = quiet.await;
    assert!(pending(&mut noisy_again).await);
    assert_eq!(share.waiting(), 1);
}

#[tokio::test]
async fn a_wait_given_up_frees_the_slot_it_was_handed() {
    let share = FairShare::new(1);
    let held = share.take("a", Priority::Foreground).await;
    let mut gives_up = Box::pin(share.take("b", Priority::Foreground));
    assert!(pending(&mut gives_up).await);
    let mut waits = Box::pin(share.take("c", Priority::Foreground));
    assert!(pending(&mut waits).await);
    drop(gives_up);
    assert_eq!(share.waiting(), 1);
    drop(held);
    let _c = waits.await;
    assert_eq!(share.waiting(), 0);
}

#[tokio::test]
async fn a_reconcile_that_only_waits_holds_no_slot() {
    let share = FairShare::new(1);
    let waiting = Held::take(&share, "noisy", Priority::Foreground).await;
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let long = tokio::spawn(async move {
        waiting.without(released).await.ok();
        waiting
    });
    // While the noisy one only waits, the quiet one gets the slot.
    let quiet = tokio::time::timeout(
        Duration::from_secs(5),
        Held::take(&share, "quiet", Priority::Foreground),
    )
    .await;
    assert!(quiet.is_ok(), "the waiting reconcile kept its slot");
    drop(quiet);
    release.send(()).unwrap();
    let _noisy = long.await.unwrap();
}
