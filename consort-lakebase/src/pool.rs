//! The warm branch pool: branches of the current base, ready before they are asked for.
//!
//! * [`BranchPool::acquire`] pops a ready branch of the requested base (a few milliseconds),
//!   or creates one on the spot when none is ready, and starts a background refill up to
//!   [`PoolConfig::size`]; or, with [`PoolConfig::as_leased`], up to as many as were ever
//!   leased at once (at least one). Alone on a machine the refill runs ahead in time the CPU
//!   would not use; beside other lanes, every ready branch beyond the demand is a copy of the
//!   base made for nothing when the base changes (each story's migration), on CPU another lane
//!   needed.
//! * A branch is never reused: every acquired branch is owned by a [`Lease`], which deletes it
//!   on [`Lease::release`] (or keeps it for inspection after a failed run when
//!   [`PoolConfig::keep_failed`] is set, until [`PoolConfig::keep_failed_for`] has passed). A
//!   lease dropped without release deletes its branch in the background.
//! * When a request's base differs from the pool's (new migrations), the pool prepares the new
//!   base, deletes the ready branches of the old one, and refills.
//! * [`BranchPool::start`] and [`BranchPool::shutdown`] run the provider's orphan sweeper, so
//!   branches of a killed process do not live for long.
//!
//! All methods take `&self` and are safe to call from many tasks at once.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::error::{Error, Result};
use crate::names::BranchNamer;
use crate::provider::{BaseRef, BaseSpec, Branch, BranchProvider};

/// Pool settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// How many branches of the current base to keep ready (4 suits the local backend); with
    /// [`PoolConfig::as_leased`], the most kept ready.
    pub size: usize,
    /// Keep ready only as many branches as were ever leased at once (at least one, at most
    /// `size`): for pools that share the machine's cores (lanes), where a branch made ahead
    /// and dropped unused costs another lane's time.
    pub as_leased: bool,
    /// Keep the branch of a failed run for inspection instead of deleting it.
    pub keep_failed: bool,
    /// How long a kept branch lives before the sweeper removes it.
    pub keep_failed_for: Duration,
}

impl PoolConfig {
    /// How many ready branches the refill keeps, given the most leased at once.
    fn wanted(&self, peak: usize) -> usize {
        if self.as_leased {
            peak.clamp(1, self.size)
        } else {
            self.size
        }
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            size: 4,
            as_leased: false,
            keep_failed: false,
            keep_failed_for: Duration::from_secs(3600),
        }
    }
}

/// Counters of a pool (shared, so they survive an actor restart when passed in again).
#[derive(Debug, Default)]
pub struct PoolStats {
    created: AtomicU64,
    dropped: AtomicU64,
    kept: AtomicU64,
    served_warm: AtomicU64,
    served_cold: AtomicU64,
    invalidations: AtomicU64,
    swept: AtomicU64,
}

/// A snapshot of [`PoolStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PoolStatsSnapshot {
    /// Branches created.
    pub created: u64,
    /// Branches deleted.
    pub dropped: u64,
    /// Branches kept for inspection after a failed run.
    pub kept: u64,
    /// Branches created and not deleted (ready, leased or kept).
    pub live: u64,
    /// Acquisitions served by a ready branch.
    pub served_from_pool: u64,
    /// Acquisitions that had to create a branch on the spot.
    pub created_on_demand: u64,
    /// Base changes that emptied the pool.
    pub invalidations: u64,
    /// Orphans removed by the sweeper.
    pub swept: u64,
}

impl PoolStats {
    /// The current values.
    pub fn snapshot(&self) -> PoolStatsSnapshot {
        let created = self.created.load(Ordering::Relaxed);
        let dropped = self.dropped.load(Ordering::Relaxed);
        PoolStatsSnapshot {
            created,
            dropped,
            kept: self.kept.load(Ordering::Relaxed),
            live: created.saturating_sub(dropped),
            served_from_pool: self.served_warm.load(Ordering::Relaxed),
            created_on_demand: self.served_cold.load(Ordering::Relaxed),
            invalidations: self.invalidations.load(Ordering::Relaxed),
            swept: self.swept.load(Ordering::Relaxed),
        }
    }
}

#[derive(Debug, Default)]
struct PoolState {
    base: Option<BaseRef>,
    generation: u64,
    ready: VecDeque<Branch>,
    creating: usize,
    /// Branches leased and not yet given back.
    leased: usize,
    /// The most branches ever leased at once: how many the refill keeps ready.
    peak: usize,
}

impl PoolState {
    /// One more branch leased.
    fn lease_one(&mut self) {
        self.leased += 1;
        self.peak = self.peak.max(self.leased);
    }
}

#[derive(Debug)]
struct PoolInner {
    provider: Arc<dyn BranchProvider>,
    cfg: PoolConfig,
    namer: BranchNamer,
    stats: Arc<PoolStats>,
    state: Mutex<PoolState>,
    base_lock: tokio::sync::Mutex<()>,
    refilling: AtomicBool,
    closed: AtomicBool,
    /// Names whose deletion could not be started (no runtime): deleted at shutdown.
    orphaned: Mutex<Vec<String>>,
    /// Releases running in the background ([`Lease::release_in_background`]); shutdown waits
    /// for them.
    releasing: Mutex<tokio::task::JoinSet<()>>,
    refill_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// A pool of ready branches over one provider. Cheap to clone (shared state).
#[derive(Debug, Clone)]
pub struct BranchPool {
    inner: Arc<PoolInner>,
}

/// What [`BranchPool::acquire`] hands out.
#[derive(Debug)]
pub struct Acquired {
    /// The lease owning the branch.
    pub lease: Lease,
    /// Milliseconds spent preparing the base (migrations) for this call; 0 when reused.
    pub prepare_ms: u64,
    /// Milliseconds spent getting the branch (popping or creating it).
    pub acquire_ms: u64,
    /// Whether a ready branch served the call.
    pub from_pool: bool,
}

/// What happened to a released branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// It was deleted.
    Deleted,
    /// It was kept for inspection until the given time.
    Kept(SystemTime),
}

/// Owns one acquired branch; releasing (or dropping) it deletes the branch.
#[derive(Debug)]
pub struct Lease {
    branch: Branch,
    armed: bool,
    /// Still counted among the pool's leased branches.
    counted: bool,
    pool: Arc<PoolInner>,
}

impl Lease {
    /// The leased branch.
    pub fn branch(&self) -> &Branch {
        &self.branch
    }

    /// Releases the branch: deleted, or kept for inspection when `failed` and the pool keeps
    /// failed branches.
    pub async fn release(mut self, failed: bool) -> Result<Released> {
        self.armed = false;
        self.give_back();
        let branch = self.branch.clone();
        let p = &self.pool;
        if failed && p.cfg.keep_failed {
            let until = SystemTime::now() + p.cfg.keep_failed_for;
            match p.provider.keep_for_inspection(&branch, until).await {
                Ok(()) => {
                    p.stats.kept.fetch_add(1, Ordering::Relaxed);
                    debug!(branch = %branch.name, "failed run: branch kept for inspection");
                    return Ok(Released::Kept(until));
                }
                Err(e) => {
                    warn!(branch = %branch.name, error = %consort_actors::error_chain(&e), "could not keep the branch; deleting it")
                }
            }
        }
        if let Err(e) = p.delete(&branch.name).await {
            // Deletion failed now: leave it to the shutdown sweep.
            relock(&p.orphaned).push(branch.name.clone());
            return Err(e);
        }
        Ok(Released::Deleted)
    }
}

/// Locks one of the pool's side lists (orphaned names, release tasks, the refill handle), or
/// the state for a read. A panic elsewhere cannot leave the lists half-changed (each use is one
/// push, take or spawn), dropping their content would leave branches undeleted, and a read
/// reports what is there: a poisoned lock is taken over. (Changes to the state go through
/// `PoolInner::lock`, which refuses a poisoned one.)
fn relock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Lease {
    /// The branch is no longer in use: the pool stops counting it among the leased ones (what
    /// its refill keeps ready follows that count), before its deletion, which may take a while.
    fn give_back(&mut self) {
        if std::mem::take(&mut self.counted) {
            let mut st = relock(&self.pool.state);
            st.leased = st.leased.saturating_sub(1);
        }
    }

    /// [`Lease::release`] on a background task, so the caller does not wait for the branch to
    /// be dropped: a `DROP DATABASE` takes tens of milliseconds, and longer when the provider is
    /// busy creating the pool's next warm branch. [`BranchPool::shutdown`] waits for every such
    /// release; a failure is logged, and the branch is left to the shutdown sweep. Without a
    /// runtime the lease is dropped instead (its branch is then deleted at shutdown).
    pub fn release_in_background(mut self, failed: bool) {
        self.give_back();
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return drop(self);
        };
        let pool = self.pool.clone();
        let name = self.branch.name.clone();
        let release = async move {
            if let Err(e) = self.release(failed).await {
                warn!(branch = %name, error = %consort_actors::error_chain(&e), "releasing a branch in the background");
            }
        };
        let mut set = relock(&pool.releasing);
        // Reap the releases that are done, so the set holds only running ones.
        while set.try_join_next().is_some() {}
        set.spawn_on(release, &handle);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.give_back();
        if self.armed {
            self.pool.delete_later(self.branch.name.clone());
        }
    }
}

impl PoolInner {
    async fn delete(&self, name: &str) -> Result<()> {
        self.provider.delete(name).await?;
        self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn delete_later(self: &Arc<Self>, name: String) {
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                let me = self.clone();
                h.spawn(async move {
                    if let Err(e) = me.delete(&name).await {
                        warn!(branch = %name, error = %consort_actors::error_chain(&e), "deleting a released branch");
                    }
                });
            }
            Err(_) => {
                relock(&self.orphaned).push(name);
            }
        }
    }

    async fn create_one(&self, base: &BaseRef) -> Result<Branch> {
        let name = self.namer.next_name();
        let b = self.provider.create(&name, base).await?;
        self.stats.created.fetch_add(1, Ordering::Relaxed);
        Ok(b)
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, PoolState>> {
        self.state
            .lock()
            .map_err(|_| Error::Poisoned("the branch pool's state"))
    }

    /// Starts the background refill when it is not running.
    fn refill(self: &Arc<Self>) {
        if self.closed.load(Ordering::Acquire) || self.cfg.size == 0 {
            return;
        }
        if self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            self.refilling.store(false, Ordering::Release);
            return;
        };
        let me = self.clone();
        let task = handle.spawn(async move {
            me.refill_loop().await;
            me.refilling.store(false, Ordering::Release);
        });
        *self
            .refill_task
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(task);
    }

    async fn refill_loop(self: &Arc<Self>) {
        let mut failures = 0u32;
        loop {
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            let (base, generation) = {
                let Ok(mut st) = self.lock() else { return };
                let Some(base) = st.base.clone() else { return };
                if st.ready.len() + st.creating >= self.cfg.wanted(st.peak) {
                    return;
                }
                st.creating += 1;
                (base, st.generation)
            };
            let made = self.create_one(&base).await;
            let surplus = {
                let Ok(mut st) = self.lock() else { return };
                st.creating -= 1;
                match made {
                    Ok(b)
                        if st.generation == generation && !self.closed.load(Ordering::Acquire) =>
                    {
                        st.ready.push_back(b);
                        failures = 0;
                        None
                    }
                    Ok(b) => Some(b),
                    Err(e) => {
                        failures += 1;
                        warn!(error = %consort_actors::error_chain(&e), failures, "refilling the branch pool");
                        None
                    }
                }
            };
            if let Some(b) = surplus {
                let _ = self.delete(&b.name).await;
            }
            if failures >= 3 {
                return;
            }
            if failures > 0 {
                tokio::time::sleep(Duration::from_millis(200 * u64::from(failures))).await;
            }
        }
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        let leftovers: Vec<String> = self
            .state
            .get_mut()
            // A panic elsewhere does not make the ready branches any less ours to delete.
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .ready
            .drain(..)
            .map(|b| b.name)
            .collect();
        if leftovers.is_empty() {
            return;
        }
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            let provider = self.provider.clone();
            let stats = self.stats.clone();
            h.spawn(async move {
                for name in leftovers {
                    if provider.delete(&name).await.is_ok() {
                        stats.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    }
}

impl BranchPool {
    /// A pool over `provider` with fresh counters.
    pub fn new(provider: Arc<dyn BranchProvider>, cfg: PoolConfig) -> Self {
        Self::with_stats(provider, cfg, Arc::new(PoolStats::default()))
    }

    /// A pool that counts into `stats`.
    pub fn with_stats(
        provider: Arc<dyn BranchProvider>,
        cfg: PoolConfig,
        stats: Arc<PoolStats>,
    ) -> Self {
        BranchPool {
            inner: Arc::new(PoolInner {
                provider,
                cfg,
                namer: BranchNamer::new(),
                stats,
                state: Mutex::new(PoolState::default()),
                base_lock: tokio::sync::Mutex::new(()),
                refilling: AtomicBool::new(false),
                closed: AtomicBool::new(false),
                orphaned: Mutex::new(Vec::new()),
                releasing: Mutex::new(tokio::task::JoinSet::new()),
                refill_task: Mutex::new(None),
            }),
        }
    }

    /// The provider.
    pub fn provider(&self) -> &Arc<dyn BranchProvider> {
        &self.inner.provider
    }

    /// The counters.
    pub fn stats(&self) -> PoolStatsSnapshot {
        self.inner.stats.snapshot()
    }

    /// The shared counters.
    pub fn stats_handle(&self) -> Arc<PoolStats> {
        self.inner.stats.clone()
    }

    /// How many branches are ready now.
    pub fn ready(&self) -> usize {
        relock(&self.inner.state).ready.len()
    }

    /// The current base, once one was prepared.
    pub fn current_base(&self) -> Option<BaseRef> {
        relock(&self.inner.state).base.clone()
    }

    /// Waits for the running refill (if any) to end. Its outcome is in the pool's state and
    /// stats; a refill that panicked has nothing left to wait for.
    async fn join_refill(&self) {
        let task = self
            .inner
            .refill_task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    /// The start-up sweep: removes the provider's orphans. Returns how many.
    pub async fn start(&self) -> Result<usize> {
        let n = self.inner.provider.sweep_orphans().await?;
        self.inner
            .stats
            .swept
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// Makes `spec` the current base and returns once the pool holds its full size of ready
    /// branches (or the refill gave up); from then on it keeps that many ready, as if that many
    /// had been leased at once.
    pub async fn warm(&self, spec: &BaseSpec) -> Result<()> {
        self.switch_base(spec).await?;
        {
            let mut st = self.inner.lock()?;
            st.peak = st.peak.max(self.inner.cfg.size);
        }
        self.inner.refill();
        self.join_refill().await;
        Ok(())
    }

    /// Makes `spec` the current base (preparing it) when it is not; returns the base and the
    /// milliseconds spent preparing it.
    async fn switch_base(&self, spec: &BaseSpec) -> Result<(BaseRef, u64)> {
        let key = spec.key();
        let current = self.inner.lock()?.base.clone();
        if let Some(b) = current.filter(|b| b.key == key) {
            return Ok((b, 0));
        }
        let _g = self.inner.base_lock.lock().await;
        let current = self.inner.lock()?.base.clone();
        if let Some(b) = current.filter(|b| b.key == key) {
            return Ok((b, 0));
        }
        let t = Instant::now();
        let base = self.inner.provider.prepare_base(spec).await?;
        let prepare_ms = t.elapsed().as_millis() as u64;
        let stale: Vec<Branch> = {
            let mut st = self.inner.lock()?;
            let had_base = st.base.is_some();
            st.base = Some(base.clone());
            st.generation += 1;
            if had_base {
                self.inner
                    .stats
                    .invalidations
                    .fetch_add(1, Ordering::Relaxed);
            }
            st.ready.drain(..).collect()
        };
        for b in stale {
            self.inner.delete_later(b.name);
        }
        Ok((base, prepare_ms))
    }

    /// Gets a fresh branch of `spec`'s base.
    pub async fn acquire(&self, spec: &BaseSpec) -> Result<Acquired> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::PoolShutDown);
        }
        let (base, prepare_ms) = self.switch_base(spec).await?;
        let t = Instant::now();
        let popped = {
            let mut st = self.inner.lock()?;
            st.lease_one();
            match st.ready.iter().position(|b| b.base.key == base.key) {
                Some(i) => st.ready.remove(i),
                None => None,
            }
        };
        let from_pool = popped.is_some();
        let branch = match popped {
            Some(b) => {
                self.inner.stats.served_warm.fetch_add(1, Ordering::Relaxed);
                b
            }
            None => {
                self.inner.stats.served_cold.fetch_add(1, Ordering::Relaxed);
                match self.inner.create_one(&base).await {
                    Ok(b) => b,
                    Err(e) => {
                        let mut st = relock(&self.inner.state);
                        st.leased = st.leased.saturating_sub(1);
                        return Err(e);
                    }
                }
            }
        };
        let acquire_ms = t.elapsed().as_millis() as u64;
        self.inner.refill();
        Ok(Acquired {
            lease: Lease {
                branch,
                armed: true,
                counted: true,
                pool: self.inner.clone(),
            },
            prepare_ms,
            acquire_ms,
            from_pool,
        })
    }

    /// Stops refilling, deletes the ready branches and anything whose deletion was deferred,
    /// then sweeps the provider's orphans. Returns how many branches were removed.
    pub async fn shutdown(&self) -> Result<usize> {
        self.inner.closed.store(true, Ordering::Release);
        self.join_refill().await;
        let mut releasing = std::mem::take(&mut *relock(&self.inner.releasing));
        while releasing.join_next().await.is_some() {}
        let mut names: Vec<String> = self.inner.lock()?.ready.drain(..).map(|b| b.name).collect();
        names.append(&mut relock(&self.inner.orphaned));
        let mut n = 0;
        for name in names {
            match self.inner.delete(&name).await {
                Ok(()) => n += 1,
                Err(e) => {
                    warn!(branch = %name, error = %consort_actors::error_chain(&e), "deleting a pool branch at shutdown")
                }
            }
        }
        match self.inner.provider.sweep_orphans().await {
            Ok(s) => {
                self.inner
                    .stats
                    .swept
                    .fetch_add(s as u64, Ordering::Relaxed);
                n += s;
            }
            Err(e) => warn!(error = %consort_actors::error_chain(&e), "sweeping at shutdown"),
        }
        Ok(n)
    }
}
