//! Where a project's records are kept, as `[store]` says: files under `.consort/` that only
//! this checkout sees (the default), or a PostgreSQL store every machine driving the project
//! names ([`consort_lakebase::store`]).
//!
//! Every command reads and writes a feature's ledger through [`Records`]: the same hash chain
//! either way. With the shared store, the small record files a clone needs beside the ledgers
//! (an added feature's `request.md`, a lane's `lane.json`) are kept in the store too and
//! written into the clone's `.consort/` when it opens the project ([`Records::open`]); a row
//! that names a feature that is no valid id, or a file of another name, is refused.
//!
//! **Invariant:** with the shared store, nothing a run needs from another machine is only a
//! file here: the ledgers, the backlog's order, requests, lane records and leases are rows.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use consort_actors::{
    ContentHash, Entry, Event, EventLog, EventLogOpener, FileEventLog, Ledger, LedgerError, genesis,
};
use consort_lakebase::Secret;
use consort_lakebase::store::{
    Holding, Lease, PgEventLog, PgEventLogOpener, StoreError, StoreHandle,
};

use crate::backlog::{BacklogError, Feature, record_dir};

mod lease;
mod state_index;

pub(crate) use state_index::{ChainHead, StateIndex};

use crate::config::{ProjectConfig, StoreConfig};
pub use lease::{LeaseKeeper, holder_name};

/// The record files the shared store keeps beside a feature's ledger, by name.
pub const SHARED_FILES: [&str; 2] = ["request.md", "lane.json"];

/// Why the project's records could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordsError {
    /// The store's URL is not in the environment.
    #[error(
        "the shared store's URL: set the environment variable {var} (named by [store] url_env in consort.toml)"
    )]
    MissingUrl {
        /// The variable.
        var: String,
    },
    /// The store's URL cannot be used.
    #[error("the shared store's URL in {var}")]
    BadUrl {
        /// The variable.
        var: String,
        /// Why (the URL's password is never in it).
        #[source]
        source: consort_lakebase::Error,
    },
    /// The shared store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A ledger file.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The backlog: its file, a request, an id.
    #[error(transparent)]
    Backlog(#[from] crate::backlog::BacklogError),
    /// A record file here could not be read or written.
    #[error("the record {path}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Another process holds the feature.
    #[error(
        "feature {feature} is driven by {holder} since {since}; it is free again when that process ends or its hold runs out"
    )]
    Held {
        /// The feature.
        feature: String,
        /// Who holds it.
        holder: String,
        /// Since when (RFC 3339).
        since: String,
    },
    /// A row of the shared store names no valid feature or record file.
    #[error("the shared store holds a record that is not Consort's: {what}")]
    Foreign {
        /// What it names.
        what: String,
    },
}

impl RecordsError {
    /// Whether the error is the person's at the command line (a request without a title, a
    /// bad or taken feature id).
    pub fn is_usage(&self) -> bool {
        matches!(self, RecordsError::Backlog(b) if b.is_usage())
    }
}

/// What a feature's ledger holds, as a check of its whole chain found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainSummary {
    /// How many entries.
    pub entries: u64,
    /// The last entry's hash (the genesis hash when there is none).
    pub head: ContentHash,
}

/// A project's records: its files here, or its shared store.
#[derive(Debug, Clone)]
pub struct Records {
    dir: PathBuf,
    shared: Option<Shared>,
    /// The features' states as last replayed, shared by every handle of the project.
    index: Arc<StateIndex>,
}

#[derive(Debug, Clone)]
struct Shared {
    store: Arc<StoreHandle>,
    lease: Duration,
}

/// A store's URL and project name.
type StoreKey = (String, String);

/// One connection per store and project in a process, kept while a handle uses it.
static STORES: Mutex<Option<HashMap<StoreKey, Weak<StoreHandle>>>> = Mutex::new(None);

impl Records {
    /// The records of the project at `dir` as `config` says. With the shared store: connects
    /// (one connection per process), brings its schema to this version, and writes the
    /// record files it keeps into this checkout's `.consort/`.
    pub fn open(dir: &Path, config: &ProjectConfig) -> Result<Records, RecordsError> {
        let StoreConfig::Postgres {
            url_env,
            project,
            lease_seconds,
        } = &config.store
        else {
            return Ok(Records {
                dir: dir.to_path_buf(),
                shared: None,
                index: Arc::default(),
            });
        };
        let url = std::env::var(url_env).map_err(|_| RecordsError::MissingUrl {
            var: url_env.clone(),
        })?;
        let store = connected(&url, project).map_err(|e| match e {
            Connect::Url(source) => RecordsError::BadUrl {
                var: url_env.clone(),
                source,
            },
            Connect::Store(e) => RecordsError::Store(e),
        })?;
        let records = Records {
            dir: dir.to_path_buf(),
            shared: Some(Shared {
                store,
                lease: Duration::from_secs(*lease_seconds),
            }),
            index: Arc::default(),
        };
        records.refresh()?;
        Ok(records)
    }

    /// The project's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The shared store, when the records are kept in one.
    pub fn store(&self) -> Option<&Arc<StoreHandle>> {
        self.shared.as_ref().map(|s| &s.store)
    }

    /// The project's features in backlog order: `consort.toml`'s first, then the added ones,
    /// as the backlog file or the shared store orders them (each id the store gives checked:
    /// its rows are untrusted).
    pub fn backlog(&self, config: &ProjectConfig) -> Result<Vec<Feature>, RecordsError> {
        let Some(shared) = &self.shared else {
            return Ok(crate::backlog::features(&self.dir, config)?);
        };
        let ids = shared.store.backlog()?;
        if let Some(bad) = ids.iter().find(|id| crate::backlog::check_id(id).is_err()) {
            return Err(RecordsError::Foreign {
                what: format!("a backlog entry {bad:?}"),
            });
        }
        Ok(crate::backlog::listed(&self.dir, config, ids))
    }

    /// Appends the request in `file` to the backlog as feature `id` (see
    /// [`crate::backlog::add`]); with the shared store, the store's backlog gets it with its
    /// request, and a feature another machine added first under that id is refused.
    pub fn add_feature(
        &self,
        config: &ProjectConfig,
        file: &Path,
        id: Option<&str>,
    ) -> Result<Feature, RecordsError> {
        let Some(shared) = &self.shared else {
            return Ok(crate::backlog::add(&self.dir, config, file, id)?);
        };
        let (feature, request) =
            crate::backlog::prepare_add(&self.dir, &self.backlog(config)?, file, id)?;
        if !shared.store.add_feature(&feature.id, &request)? {
            return Err(BacklogError::Duplicate { id: feature.id }.into());
        }
        Ok(feature)
    }

    /// How long a hold on a feature lasts unless renewed (the shared store's; None with files).
    pub fn lease_time(&self) -> Option<Duration> {
        self.shared.as_ref().map(|s| s.lease)
    }

    fn ledger_file(&self, feature: &Feature) -> PathBuf {
        self.dir.join(feature.ledger())
    }

    /// Every entry of `feature`'s ledger, each checked; none before its first run.
    pub fn entries(&self, feature: &Feature) -> Result<Vec<Entry<Event>>, RecordsError> {
        match &self.shared {
            Some(shared) => Ok(shared.store.entries(&feature.id)?),
            None => {
                let path = self.ledger_file(feature);
                if !path.exists() {
                    return Ok(Vec::new());
                }
                Ok(Ledger::<Event>::read(&path)?)
            }
        }
    }

    /// Where each of `features`' chains ends (None: no entry yet), in their order, read
    /// without reading the chains: the last entry's number and hash with the shared store (one
    /// statement for all of them), the ledger file's length and time of change with files
    /// (one `stat` each).
    pub(crate) fn heads(&self, features: &[Feature]) -> Result<Vec<Option<String>>, RecordsError> {
        match &self.shared {
            Some(shared) => {
                let ids: Vec<String> = features.iter().map(|f| f.id.clone()).collect();
                let mut ends: HashMap<String, String> = shared
                    .store
                    .heads(&ids)?
                    .into_iter()
                    .map(|(id, seq, hash)| (id, format!("{seq}:{hash}")))
                    .collect();
                Ok(features.iter().map(|f| ends.remove(&f.id)).collect())
            }
            None => features
                .iter()
                .map(|f| {
                    let path = self.ledger_file(f);
                    let meta = match std::fs::metadata(&path) {
                        Ok(m) if m.len() > 0 => m,
                        Ok(_) => return Ok(None),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                        Err(source) => return Err(RecordsError::File { path, source }),
                    };
                    let changed = meta
                        .modified()
                        .map_err(|source| RecordsError::File { path, source })?;
                    Ok(Some(format!("{}@{changed:?}", meta.len())))
                })
                .collect(),
        }
    }

    /// The features' states as last replayed ([`StateIndex`]).
    pub(crate) fn index(&self) -> &StateIndex {
        &self.index
    }

    /// Whether `feature`'s ledger has no entry yet (its run has not started).
    pub fn is_fresh(&self, feature: &Feature) -> Result<bool, RecordsError> {
        match &self.shared {
            Some(_) => Ok(self.entries(feature)?.is_empty()),
            None => {
                let path = self.ledger_file(feature);
                Ok(std::fs::metadata(&path).map_or(true, |m| m.len() == 0))
            }
        }
    }

    /// Checks `feature`'s whole chain.
    pub fn verify(&self, feature: &Feature) -> Result<ChainSummary, RecordsError> {
        match &self.shared {
            Some(_) => {
                let entries = self.entries(feature)?;
                Ok(ChainSummary {
                    entries: entries.len() as u64,
                    head: entries.last().map_or_else(genesis, |e| e.hash),
                })
            }
            None => {
                let report = Ledger::<Event>::verify(self.ledger_file(feature))?;
                Ok(ChainSummary {
                    entries: report.entries,
                    head: report.head,
                })
            }
        }
    }

    /// How a conductor opens `feature`'s ledger; with the shared store its appends carry
    /// `lease`.
    pub fn opener(&self, feature: &Feature, lease: Option<Lease>) -> EventLogOpener {
        match &self.shared {
            Some(shared) => Arc::new(PgEventLogOpener {
                store: Arc::clone(&shared.store),
                feature: feature.id.clone(),
                lease,
            }),
            None => Arc::new(FileEventLog(self.ledger_file(feature))),
        }
    }

    /// `feature`'s ledger opened for a person's decision (a gate, a retry, a retirement). With
    /// the shared store, a decision without `lease` ends the lease of whoever drives the
    /// feature (see `consort_lakebase::store`); one the driving process records itself (the
    /// harness change it finds on resume) carries its lease.
    pub fn open_log(
        &self,
        feature: &Feature,
        lease: Option<Lease>,
    ) -> Result<Box<dyn EventLog>, RecordsError> {
        Ok(match &self.shared {
            Some(shared) => Box::new(PgEventLog::open(
                Arc::clone(&shared.store),
                &feature.id,
                lease,
            )?),
            None => Box::new(Ledger::<Event>::open(self.ledger_file(feature))?),
        })
    }

    /// Keeps `feature`'s record file `name` (one of [`SHARED_FILES`]) in the shared store as
    /// it is here; nothing with files.
    pub fn share_file(&self, feature: &Feature, name: &str) -> Result<(), RecordsError> {
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        let path = self.dir.join(&feature.record_dir).join(name);
        let body = std::fs::read_to_string(&path).map_err(|source| RecordsError::File {
            path: path.clone(),
            source,
        })?;
        Ok(shared.store.put_document(&feature.id, name, &body)?)
    }

    /// Takes `feature`'s lease in the shared store and keeps it while the keeper lives;
    /// refused while another process holds it. None with files (the feature's lock file is
    /// the hold there).
    pub fn hold(&self, feature: &Feature) -> Result<Option<LeaseKeeper>, RecordsError> {
        let Some(shared) = &self.shared else {
            return Ok(None);
        };
        match shared
            .store
            .acquire(&feature.id, &holder_name(), shared.lease)?
        {
            Some(lease) => Ok(Some(LeaseKeeper::keep(
                Arc::clone(&shared.store),
                lease,
                shared.lease,
            ))),
            None => {
                let held = self
                    .holdings()?
                    .into_iter()
                    .find(|h| h.feature == feature.id);
                Err(RecordsError::Held {
                    feature: feature.id.clone(),
                    holder: held
                        .as_ref()
                        .map_or_else(|| "another process".into(), |h| h.holder.clone()),
                    since: held.map_or_else(String::new, |h| {
                        h.since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    }),
                })
            }
        }
    }

    /// Keeps `lease` (taken from this store) renewed while the keeper lives; None with files.
    pub fn keep(&self, lease: Lease) -> Option<LeaseKeeper> {
        let shared = self.shared.as_ref()?;
        Some(LeaseKeeper::keep(
            Arc::clone(&shared.store),
            lease,
            shared.lease,
        ))
    }

    /// Who holds which feature (the shared store's leases; none with files).
    pub fn holdings(&self) -> Result<Vec<Holding>, RecordsError> {
        match &self.shared {
            Some(shared) => Ok(shared.store.holdings()?),
            None => Ok(Vec::new()),
        }
    }

    /// Writes the record files the shared store keeps into this checkout, where they differ
    /// (done when the records are opened, and again by a process taking a feature over).
    pub fn refresh(&self) -> Result<(), RecordsError> {
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        for (feature, name, body) in shared.store.documents()? {
            if crate::backlog::check_id(&feature).is_err() || !SHARED_FILES.contains(&name.as_str())
            {
                return Err(RecordsError::Foreign {
                    what: format!("a file {name:?} of feature {feature:?}"),
                });
            }
            let path = self.dir.join(record_dir(&feature)).join(&name);
            if std::fs::read_to_string(&path).is_ok_and(|here| here == body) {
                continue;
            }
            let file = |source| RecordsError::File {
                path: path.clone(),
                source,
            };
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(file)?;
            }
            crate::replace_file::replace_file(&path, body.as_bytes()).map_err(file)?;
        }
        Ok(())
    }
}

enum Connect {
    Url(consort_lakebase::Error),
    Store(StoreError),
}

/// The process's connection to `project`'s store at `url`, made when none is open.
fn connected(url: &str, project: &str) -> Result<Arc<StoreHandle>, Connect> {
    let key = (url.to_string(), project.to_string());
    let mut stores = STORES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let stores = stores.get_or_insert_with(HashMap::new);
    if let Some(store) = stores.get(&key).and_then(Weak::upgrade) {
        return Ok(store);
    }
    let info = consort_lakebase::connect_info_of_url(&Secret::new(url.to_string()))
        .map_err(Connect::Url)?;
    let store = Arc::new(StoreHandle::connect(&info, project).map_err(Connect::Store)?);
    stores.insert(key, Arc::downgrade(&store));
    Ok(store)
}
