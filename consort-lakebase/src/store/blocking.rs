//! The store for code that does not await: a [`StoreHandle`] keeps one connection on a thread
//! of its own with a runtime of its own, and each call waits for its answer there, from
//! whatever runtime (or none) the caller is on. The conductor's event log
//! ([`PgEventLog`]) and the project's commands use it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::mpsc::{Sender, channel};

use std::time::Duration;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use consort_actors::{Entry, Event};

use super::{Fence, Holding, Lease, PgStore, StoreError};
use crate::provider::ConnectInfo;

/// Work for the store's thread: it runs the future the closure makes with the connection.
type Job =
    Box<dyn for<'a> FnOnce(&'a mut PgStore) -> Pin<Box<dyn Future<Output = ()> + 'a>> + Send>;

/// One connection to a project's shared store, usable from code that does not await.
#[derive(Debug)]
pub struct StoreHandle {
    project: String,
    /// The store's thread awaits its jobs, so the connection's driver runs between them (a
    /// dropped transaction's rollback is sent at once, a closed connection noticed).
    jobs: UnboundedSender<Job>,
}

fn gone() -> StoreError {
    StoreError::Thread("the store's thread is gone".into())
}

impl StoreHandle {
    /// Connects to `project`'s store on the database `info` names (bringing its schema to this
    /// version), on a thread of its own.
    pub fn connect(info: &ConnectInfo, project: &str) -> Result<StoreHandle, StoreError> {
        let (jobs, inbox) = unbounded_channel::<Job>();
        let (opened, first) = channel();
        let (info, name) = (info.clone(), project.to_string());
        std::thread::Builder::new()
            .name(format!("consort-store-{project}"))
            .spawn(move || serve(&info, &name, inbox, &opened))
            .map_err(|e| StoreError::Thread(e.to_string()))?;
        first
            .recv()
            .map_err(|_| StoreError::Thread("the store's thread ended at once".into()))??;
        Ok(StoreHandle {
            project: project.to_string(),
            jobs,
        })
    }

    /// The project whose records these are.
    pub fn project(&self) -> &str {
        &self.project
    }

    /// Runs `work` with the connection on the store's thread and waits for its answer.
    fn call<R: Send + 'static>(
        &self,
        work: impl for<'a> FnOnce(
            &'a mut PgStore,
        ) -> Pin<Box<dyn Future<Output = Result<R, StoreError>> + 'a>>
        + Send
        + 'static,
    ) -> Result<R, StoreError> {
        let (answer, done) = channel();
        let job: Job = Box::new(move |store| {
            Box::pin(async move {
                let _ = answer.send(work(store).await);
            })
        });
        self.jobs.send(job).map_err(|_| gone())?;
        done.recv().map_err(|_| gone())?
    }

    /// [`PgStore::entries`].
    pub fn entries(&self, feature: &str) -> Result<Vec<Entry<Event>>, StoreError> {
        let feature = feature.to_string();
        self.call(move |s| Box::pin(async move { s.entries(&feature).await }))
    }

    /// [`PgStore::append`], with the lease when given, else as a person whose decision was
    /// judged on the ledger's first `seen` entries ([`Fence::PersonJudgedOn`]).
    pub fn append(
        &self,
        feature: &str,
        event: &Event,
        lease: Option<&Lease>,
        seen: u64,
    ) -> Result<Entry<Event>, StoreError> {
        let (feature, event, lease) = (feature.to_string(), event.clone(), lease.cloned());
        self.call(move |s| {
            Box::pin(async move {
                let fence = lease
                    .as_ref()
                    .map_or(Fence::PersonJudgedOn { seen }, Fence::Lease);
                s.append(&feature, &event, fence).await
            })
        })
    }

    /// [`PgStore::acquire`].
    pub fn acquire(
        &self,
        feature: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let (feature, holder) = (feature.to_string(), holder.to_string());
        self.call(move |s| Box::pin(async move { s.acquire(&feature, &holder, ttl).await }))
    }

    /// [`PgStore::heads`].
    pub fn heads(&self, features: &[String]) -> Result<Vec<(String, i64, String)>, StoreError> {
        let features = features.to_vec();
        self.call(move |s| Box::pin(async move { s.heads(&features).await }))
    }

    /// [`PgStore::take_next`].
    pub fn take_next(
        &self,
        features: &[String],
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let (features, holder) = (features.to_vec(), holder.to_string());
        self.call(move |s| Box::pin(async move { s.take_next(&features, &holder, ttl).await }))
    }

    /// [`PgStore::renew`].
    pub fn renew(&self, lease: &Lease, ttl: Duration) -> Result<bool, StoreError> {
        let lease = lease.clone();
        self.call(move |s| Box::pin(async move { s.renew(&lease, ttl).await }))
    }

    /// [`PgStore::release`].
    pub fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let lease = lease.clone();
        self.call(move |s| Box::pin(async move { s.release(&lease).await }))
    }

    /// [`PgStore::backlog`].
    pub fn backlog(&self) -> Result<Vec<String>, StoreError> {
        self.call(|s| Box::pin(async move { s.backlog().await }))
    }

    /// [`PgStore::add_feature`].
    pub fn add_feature(&self, feature: &str, request: &str) -> Result<bool, StoreError> {
        let (feature, request) = (feature.to_string(), request.to_string());
        self.call(move |s| Box::pin(async move { s.add_feature(&feature, &request).await }))
    }

    /// [`PgStore::documents`].
    pub fn documents(&self) -> Result<Vec<(String, String, String)>, StoreError> {
        self.call(|s| Box::pin(async move { s.documents().await }))
    }

    /// [`PgStore::put_document`].
    pub fn put_document(&self, feature: &str, name: &str, body: &str) -> Result<(), StoreError> {
        let (feature, name, body) = (feature.to_string(), name.to_string(), body.to_string());
        self.call(move |s| Box::pin(async move { s.put_document(&feature, &name, &body).await }))
    }

    /// [`PgStore::try_merge_lock`].
    pub fn try_merge_lock(&self) -> Result<bool, StoreError> {
        self.call(|s| Box::pin(async move { s.try_merge_lock().await }))
    }

    /// [`PgStore::merge_lock_intact`].
    pub fn merge_lock_intact(&self) -> Result<bool, StoreError> {
        self.call(|s| Box::pin(async move { Ok(s.merge_lock_intact()) }))
    }

    /// [`PgStore::merge_unlock`].
    pub fn merge_unlock(&self) -> Result<(), StoreError> {
        self.call(|s| Box::pin(async move { s.merge_unlock().await }))
    }

    /// [`PgStore::holdings`].
    pub fn holdings(&self) -> Result<Vec<Holding>, StoreError> {
        self.call(|s| Box::pin(async move { s.holdings().await }))
    }
}

/// The store's thread: connects, says so, then runs each job until every handle is dropped.
fn serve(
    info: &ConnectInfo,
    project: &str,
    mut inbox: UnboundedReceiver<Job>,
    opened: &Sender<Result<(), StoreError>>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = opened.send(Err(StoreError::Thread(e.to_string())));
            return;
        }
    };
    runtime.block_on(async {
        let mut store = match PgStore::connect(info, project).await {
            Ok(store) => store,
            Err(e) => {
                let _ = opened.send(Err(e));
                return;
            }
        };
        if opened.send(Ok(())).is_err() {
            return;
        }
        while let Some(job) = inbox.recv().await {
            // A lost connection is made again before the next job; when that fails, the job
            // runs on the closed one and answers with the error.
            if store.is_closed()
                && let Err(e) = store.reconnect().await
            {
                tracing::warn!(error = %consort_actors::error_chain(&e), "the store cannot be reached");
            }
            job(&mut store).await;
        }
    });
}

/// A feature's ledger in the shared store as a conductor's event log
/// ([`consort_actors::EventLog`]). The conductor appends inline, as it does to the file ledger
/// (whose append waits for an fsync); here an append waits for its commit on the store's
/// thread. An append carries the lease the log was opened with, when one; without one it is a
/// person's decision, judged on the entries the log holds.
#[derive(Debug)]
pub struct PgEventLog {
    feature: String,
    entries: Vec<Entry<Event>>,
    store: Arc<StoreHandle>,
    lease: Option<Lease>,
}

impl PgEventLog {
    /// Opens `feature`'s ledger in the store, reading and checking every entry; appends carry
    /// `lease` when given (a person's appends carry none).
    pub fn open(
        store: Arc<StoreHandle>,
        feature: &str,
        lease: Option<Lease>,
    ) -> Result<PgEventLog, StoreError> {
        Ok(PgEventLog {
            entries: store.entries(feature)?,
            feature: feature.to_string(),
            store,
            lease,
        })
    }
}

impl consort_actors::EventLog for PgEventLog {
    fn entries(&self) -> &[Entry<Event>] {
        &self.entries
    }

    fn append(&mut self, event: &Event) -> Result<&Entry<Event>, consort_actors::EventLogError> {
        // What the log holds is what the event was judged on (a person's decision is refused
        // when the store's ledger holds more by now).
        let seen = self.entries.len() as u64;
        let entry = self
            .store
            .append(&self.feature, event, self.lease.as_ref(), seen)
            .map_err(|e| match e {
                StoreError::MovedOn { seen, now, .. } => {
                    consort_actors::LedgerMovedOn { seen, now }.into()
                }
                e => consort_actors::EventLogError::Store(Box::new(e)),
            })?;
        self.entries.push(entry);
        Ok(&self.entries[self.entries.len() - 1])
    }
}

/// Opens a feature's ledger in the shared store for a conductor
/// ([`consort_actors::OpenEventLog`]).
#[derive(Debug, Clone)]
pub struct PgEventLogOpener {
    /// The store.
    pub store: Arc<StoreHandle>,
    /// The feature.
    pub feature: String,
    /// The lease the driving process holds, which every append carries.
    pub lease: Option<Lease>,
}

impl consort_actors::OpenEventLog for PgEventLogOpener {
    fn open(&self) -> Result<Box<dyn consort_actors::EventLog>, consort_actors::EventLogError> {
        PgEventLog::open(Arc::clone(&self.store), &self.feature, self.lease.clone())
            .map(|log| Box::new(log) as Box<dyn consort_actors::EventLog>)
            .map_err(|e| consort_actors::EventLogError::Store(Box::new(e)))
    }
}
