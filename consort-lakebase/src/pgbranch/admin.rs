//! The provider's administrator connections, and statements retried while a source database
//! is busy.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Mutex, MutexGuard};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config};
use tracing::debug;

use crate::error::{Error, Result};
use crate::pgconn::connect_config;
use crate::provider::SslMode;

/// Most administrator connections one provider opens.
pub(super) const ADMIN_CONNECTIONS: usize = 4;

/// Administrator connections, opened on first use. Several, so that branches are created
/// and dropped concurrently: concurrent `CREATE DATABASE … STRATEGY FILE_COPY` share the
/// checkpoints each of them must wait for, and a drop does not queue behind a create.
pub(super) struct AdminPool {
    /// The administrator's configuration (its dbname is replaced per use).
    cfg: Config,
    ssl: SslMode,
    /// The database the pooled connections use.
    maintenance: String,
    slots: Vec<Mutex<Option<Client>>>,
    /// Where the next wait for a busy connection queues.
    next: AtomicU64,
    /// How long to retry a busy source database.
    busy_timeout: Duration,
    busy_retries: AtomicU64,
    /// This provider's liveness key: every connection opened holds its shared lock.
    live: u32,
}

/// One administrator connection slot, held for a few statements.
pub(super) type Slot<'a> = MutexGuard<'a, Option<Client>>;

impl AdminPool {
    /// A pool whose first slot holds `first` (a connection to `maintenance` that already holds
    /// the liveness lock `live`).
    pub(super) fn new(
        cfg: Config,
        ssl: SslMode,
        maintenance: String,
        first: Client,
        busy_timeout: Duration,
        live: u32,
    ) -> Self {
        AdminPool {
            cfg,
            ssl,
            maintenance,
            slots: std::iter::once(Some(first))
                .chain(std::iter::repeat_with(|| None))
                .take(ADMIN_CONNECTIONS)
                .map(Mutex::new)
                .collect(),
            next: AtomicU64::new(0),
            busy_timeout,
            busy_retries: AtomicU64::new(0),
            live,
        }
    }

    /// This provider's liveness key (in the marker of everything it makes).
    pub(super) fn live(&self) -> u32 {
        self.live
    }

    /// The administrator's configuration for database `db`.
    pub(super) fn cfg_for(&self, db: &str) -> Config {
        let mut cfg = self.cfg.clone();
        cfg.dbname(db);
        cfg
    }

    /// A fresh administrator connection to database `db` (not pooled), holding the provider's
    /// liveness lock: while any of its sessions lives, a sweeper on another host knows that
    /// what it made is in use.
    pub(super) async fn connect(&self, db: &str) -> Result<Client> {
        let c = connect_config(&self.cfg_for(db), self.ssl, None).await?;
        super::meta::hold_live(&c, self.live).await?;
        Ok(c)
    }

    /// A free slot, or (all busy) the next one in turn.
    pub(super) async fn slot(&self) -> Slot<'_> {
        for slot in &self.slots {
            if let Ok(guard) = slot.try_lock() {
                return guard;
            }
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed) as usize;
        self.slots[n % self.slots.len()].lock().await
    }

    /// The slot's connection, (re)opened when it is missing or closed.
    pub(super) async fn client<'g>(&self, slot: &'g mut Option<Client>) -> Result<&'g Client> {
        if slot.as_ref().is_none_or(Client::is_closed) {
            *slot = None;
        }
        match slot {
            Some(c) => Ok(c),
            None => Ok(slot.insert(self.connect(&self.maintenance).await?)),
        }
    }

    /// How often a busy source database was retried.
    pub(super) fn busy_retries(&self) -> u64 {
        self.busy_retries.load(Ordering::Relaxed)
    }

    /// Runs `sql`, retrying while a source database is busy (SQLSTATE 55006).
    pub(super) async fn exec_busy(&self, client: &Client, sql: &str, what: &str) -> Result<()> {
        let deadline = Instant::now() + self.busy_timeout;
        let mut delay = Duration::from_millis(10);
        loop {
            let Err(e) = client.batch_execute(sql).await else {
                return Ok(());
            };
            let err = Error::from_pg(what, e);
            if err.sqlstate() != Some(&SqlState::OBJECT_IN_USE) {
                return Err(err);
            }
            if Instant::now() >= deadline {
                return Err(Error::TemplateBusy(format!(
                    "{what}: still busy after {} ms: {err}",
                    self.busy_timeout.as_millis()
                )));
            }
            debug!(what, "source database busy; retrying");
            self.busy_retries.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(200));
        }
    }
}
