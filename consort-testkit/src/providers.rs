//! A branch provider wrapper that records every branch secret it hands out and can fail
//! `create` a number of times (a flaky server).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use consort_actors::Migration;
use consort_lakebase::{
    BaseRef, BaseSpec, BoxFuture, Branch, BranchProvider, Capabilities, ConnectInfo, Error,
    PromoteOutcome, Result,
};

/// Wraps a provider: records the password of every connection it hands out into a shared
/// set and fails the next `fail_creates` creates with a connection error.
#[derive(Debug)]
pub struct RecordingProvider {
    inner: Arc<dyn BranchProvider>,
    fail_creates: AtomicU32,
    injected: AtomicU32,
    secrets: Arc<Mutex<BTreeSet<String>>>,
}

impl RecordingProvider {
    /// Records into `secrets`; never fails.
    pub fn new(inner: Arc<dyn BranchProvider>, secrets: Arc<Mutex<BTreeSet<String>>>) -> Self {
        RecordingProvider {
            inner,
            fail_creates: AtomicU32::new(0),
            injected: AtomicU32::new(0),
            secrets,
        }
    }

    /// The same, failing the next `n` creates.
    pub fn failing_creates(self, n: u32) -> Self {
        self.fail_creates.store(n, Ordering::SeqCst);
        self
    }

    /// How many faults were injected so far.
    pub fn injected(&self) -> u32 {
        self.injected.load(Ordering::SeqCst)
    }
}

impl BranchProvider for RecordingProvider {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn prepare_base<'a>(&'a self, spec: &'a BaseSpec) -> BoxFuture<'a, Result<BaseRef>> {
        self.inner.prepare_base(spec)
    }

    fn create<'a>(&'a self, name: &'a str, from: &'a BaseRef) -> BoxFuture<'a, Result<Branch>> {
        Box::pin(async move {
            let left = self.fail_creates.load(Ordering::SeqCst);
            if left > 0 {
                self.fail_creates.store(left - 1, Ordering::SeqCst);
                self.injected.fetch_add(1, Ordering::SeqCst);
                return Err(Error::Connect(format!(
                    "injected fault: the server dropped the connection while creating {name}"
                )));
            }
            self.inner.create(name, from).await
        })
    }

    fn connect_info<'a>(&'a self, branch: &'a Branch) -> BoxFuture<'a, Result<ConnectInfo>> {
        Box::pin(async move {
            let info = self.inner.connect_info(branch).await?;
            self.secrets
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(info.secret.expose().to_string());
            Ok(info)
        })
    }

    fn reset<'a>(&'a self, branch: &'a Branch) -> BoxFuture<'a, Result<Branch>> {
        self.inner.reset(branch)
    }

    fn delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<()>> {
        self.inner.delete(name)
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<Branch>>> {
        self.inner.list(prefix)
    }

    fn sweep(&self, older_than: Duration) -> BoxFuture<'_, Result<usize>> {
        self.inner.sweep(older_than)
    }

    fn sweep_orphans(&self) -> BoxFuture<'_, Result<usize>> {
        self.inner.sweep_orphans()
    }

    fn sweep_unheld(&self) -> BoxFuture<'_, Result<usize>> {
        self.inner.sweep_unheld()
    }

    fn keep_for_inspection<'a>(
        &'a self,
        branch: &'a Branch,
        until: SystemTime,
    ) -> BoxFuture<'a, Result<()>> {
        self.inner.keep_for_inspection(branch, until)
    }

    fn promote<'a>(&'a self, migrations: &'a [Migration]) -> BoxFuture<'a, Result<PromoteOutcome>> {
        self.inner.promote(migrations)
    }
}
