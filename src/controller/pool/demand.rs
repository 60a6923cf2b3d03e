//! Demand-sized pools (`spec.maxReady`): how many unclaimed members to keep, from the claims of
//! the last window and the time to make a member Ready ([`demand_target`]): pure, tested with
//! exact expected outputs. The pool's claims are remembered here too ([`ClaimLog`]), as the
//! executor cache shows its claimers: a claimer deleted before the pool looked still counts.
//!
//! The rule keeps ready what the window's claims would use during one refill: the most claims
//! made within any span of one refill time (the slowest of the pool's members, claimed ones
//! too, so that the measure holds while a burst has taken every Ready one). A pool that kept that many would have served each of
//! those claims warm while the members they took were being replaced. It grows as soon as a
//! burst is seen, keeps its size for one window after the burst (the cooldown: bursts come
//! back), and falls to `minReady` (zero by default) after a window without a claim.

use std::{collections::HashMap, time::Duration};

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::crd::{BriqExecutorPoolSpec, PoolDemand};

/// The window of a pool that sets no `demandWindowSeconds`.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(300);
/// The refill time assumed until one of the pool's members has been made Ready.
pub const DEFAULT_REFILL: Duration = Duration::from_secs(10);

/// A demand-sized pool's bounds and window, if its spec asks for demand sizing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub min_ready: i32,
    pub max_ready: i32,
    pub window: Duration,
}

impl Bounds {
    pub fn of(spec: &BriqExecutorPoolSpec) -> Option<Bounds> {
        let max_ready = spec.max_ready?;
        Some(Bounds {
            min_ready: spec.min_ready.unwrap_or(0).clamp(0, max_ready),
            max_ready,
            window: spec
                .demand_window_seconds
                .map_or(DEFAULT_WINDOW, |s| Duration::from_secs(s.into())),
        })
    }
}

/// What the rule decided: the members to keep, what it saw, and when to look again (when the
/// oldest claim leaves the window, the target may fall).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub members: i32,
    pub seen: PoolDemand,
    pub recheck: Option<Duration>,
}

/// A claim on a pool: when its claimer was created, and whether it went cold (the claimer
/// created its own sandbox).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub at: Timestamp,
    pub cold: bool,
}

/// The members a pool with `bounds` keeps, given its `claims` (in any order; those outside the
/// window are not counted) and the time to make a member Ready (`refill`).
pub fn demand_target(bounds: Bounds, claims: &[Claim], refill: Duration, now: Timestamp) -> Target {
    let window = SignedDuration::try_from(bounds.window).unwrap_or(SignedDuration::MAX);
    let in_window: Vec<&Claim> = claims
        .iter()
        .filter(|claim| claim.at <= now && now.duration_since(claim.at) < window)
        .collect();
    let cold = in_window.iter().filter(|claim| claim.cold).count();
    let mut recent: Vec<Timestamp> = in_window.iter().map(|claim| claim.at).collect();
    recent.sort();
    // Claim times are whole seconds (creationTimestamp): claims stamped up to the refill,
    // rounded up to a whole second, apart may have come within one refill.
    let span = SignedDuration::from_secs(
        i64::try_from(refill.as_secs() + u64::from(refill.subsec_nanos() > 0)).unwrap_or(i64::MAX),
    );
    // The most claims within [t, t + span] for a claim's time t: two pointers over the sorted
    // times.
    let mut peak = 0;
    let mut end = 0;
    for (start, at) in recent.iter().enumerate() {
        while end < recent.len() && recent[end].duration_since(*at) <= span {
            end += 1;
        }
        peak = peak.max(end - start);
    }
    let peak = i32::try_from(peak).unwrap_or(i32::MAX);
    let recheck = recent
        .first()
        .map(|oldest| (window - now.duration_since(*oldest)).unsigned_abs());
    Target {
        members: peak.clamp(bounds.min_ready, bounds.max_ready),
        seen: PoolDemand {
            claims_in_window: i32::try_from(recent.len()).unwrap_or(i32::MAX),
            cold_in_window: i32::try_from(cold).unwrap_or(i32::MAX),
            peak_per_refill: peak,
            refill_millis: u64::try_from(refill.as_millis()).unwrap_or(u64::MAX),
        },
        recheck,
    }
}

/// The time to make a member Ready: the slowest of the pool's members made Ready whose
/// (creation, first Ready) times are in `made` (a pool sized for its slowest refill is not
/// caught short by it), else the last one measured (`last`: while every member is still being
/// made, say), else [`DEFAULT_REFILL`].
pub fn refill_time(made: &[(Timestamp, Timestamp)], last: Option<Duration>) -> Duration {
    made.iter()
        .map(|(created, ready)| ready.duration_since(*created).unsigned_abs())
        .max()
        .or(last)
        .unwrap_or(DEFAULT_REFILL)
}

/// The claims each pool has seen (by claimer uid), kept for the pool's window so that a claimer
/// deleted before the pool looked again still counts. Kept in memory: after a restart the pool
/// counts the claimers the cache still shows.
#[derive(Default)]
pub struct ClaimLog {
    pools: HashMap<String, HashMap<String, Claim>>,
    /// The refill time each pool last measured.
    refills: HashMap<String, Duration>,
}

impl ClaimLog {
    /// Adds the claims of `pool` seen now (by claimer uid; a claim seen cold once stays cold),
    /// forgets what is older than `window`, and returns every claim remembered.
    pub fn record(
        &mut self,
        pool: &str,
        claimers: impl IntoIterator<Item = (String, Claim)>,
        window: Duration,
        now: Timestamp,
    ) -> Vec<Claim> {
        let window = SignedDuration::try_from(window).unwrap_or(SignedDuration::MAX);
        let log = self.pools.entry(pool.to_owned()).or_default();
        for (uid, claim) in claimers {
            log.entry(uid)
                .and_modify(|known| known.cold |= claim.cold)
                .or_insert(claim);
        }
        log.retain(|_, claim| now.duration_since(claim.at) < window);
        let times = log.values().copied().collect();
        if log.is_empty() {
            self.pools.remove(pool);
        }
        times
    }

    /// The refill time of `pool` from the members it has made (`made`, see [`refill_time`]),
    /// remembered for when none can be measured.
    pub fn refill(&mut self, pool: &str, made: &[(Timestamp, Timestamp)]) -> Duration {
        let refill = refill_time(made, self.refills.get(pool).copied());
        if !made.is_empty() {
            self.refills.insert(pool.to_owned(), refill);
        }
        refill
    }

    /// Keeps only the pools in `live`.
    pub fn retain(&mut self, live: &std::collections::HashSet<String>) {
        self.pools.retain(|pool, _| live.contains(pool));
        self.refills.retain(|pool, _| live.contains(pool));
    }

    pub fn len(&self) -> usize {
        self.pools.len() + self.refills.len()
    }
}

#[cfg(test)]
mod tests;
