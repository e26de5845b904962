//! What the store keeps beside the ledgers: the backlog's order, each feature's small record
//! files (its request, its lane's record), and who holds which lease.

use chrono::{DateTime, Utc};

use super::{PgStore, StoreError, db};

/// The largest record file the store keeps (a request, a lane's record).
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;

/// Who drives a feature, as the store says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    /// The feature.
    pub feature: String,
    /// Who holds its lease (a process on a machine).
    pub holder: String,
    /// Since when.
    pub since: DateTime<Utc>,
    /// Whether the lease is still live (an expired one is free to take over).
    pub live: bool,
    /// How many of the feature's holders in a row were lost before this one.
    pub lost: u32,
}

impl Holding {
    /// Whether the fleet no longer takes the feature over: its holder's lease ran out and
    /// that made [`LOST_WORKERS_BOUND`](super::LOST_WORKERS_BOUND) workers lost in a row. It
    /// waits for a person: any decision on it (`consort stop`, `retry`, …) or a `consort run`
    /// of it starts the count again.
    pub fn halted_for_a_person(&self) -> bool {
        !self.live && i64::from(self.lost) + 1 >= i64::from(super::LOST_WORKERS_BOUND)
    }
}

impl PgStore {
    /// The features added to the backlog, in order (`consort.toml`'s first feature is not
    /// among them: every clone reads it from its own file).
    pub async fn backlog(&self) -> Result<Vec<String>, StoreError> {
        let rows = self
            .client
            .query(
                "SELECT feature FROM consort_store.backlog WHERE project = $1 ORDER BY position",
                &[&self.project],
            )
            .await
            .map_err(db("reading the backlog"))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Adds `feature` at the backlog's end with its request; false (and nothing changes)
    /// when the backlog has it already.
    pub async fn add_feature(&mut self, feature: &str, request: &str) -> Result<bool, StoreError> {
        check_size(feature, "request.md", request)?;
        let (project, tx) = self.begin("starting to add a feature").await?;
        // Two machines adding at once would both read the same end of the backlog: the
        // project's backlog lock (held to the commit) puts one after the other.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext('consort_store.backlog'), hashtext($1))",
            &[&project],
        )
        .await
        .map_err(db("locking the backlog"))?;
        let added = tx
            .execute(
                "INSERT INTO consort_store.backlog (project, position, feature) \
                 SELECT $1, coalesce(max(position), 0) + 1, $2 \
                 FROM consort_store.backlog WHERE project = $1 \
                 ON CONFLICT (project, feature) DO NOTHING",
                &[&project, &feature],
            )
            .await
            .map_err(db(format!("adding {feature} to the backlog")))?;
        if added == 1 {
            put(&tx, &project, feature, "request.md", request).await?;
        }
        tx.commit()
            .await
            .map_err(db(format!("committing {feature} to the backlog")))?;
        Ok(added == 1)
    }

    /// Every record file of the project's features: (feature, name, body).
    pub async fn documents(&self) -> Result<Vec<(String, String, String)>, StoreError> {
        let rows = self
            .client
            .query(
                "SELECT feature, name, CASE WHEN octet_length(body) <= $2::int8 THEN body END \
                 FROM consort_store.documents WHERE project = $1",
                &[&self.project, &(MAX_DOCUMENT_BYTES as i64)],
            )
            .await
            .map_err(db("reading the features' records"))?;
        rows.iter()
            .map(|r| {
                let (feature, name): (String, String) = (r.get(0), r.get(1));
                match r.get::<_, Option<String>>(2) {
                    Some(body) => Ok((feature, name, body)),
                    None => Err(StoreError::BadRow {
                        seq: 0,
                        reason: format!("its {name} is larger than {MAX_DOCUMENT_BYTES} bytes"),
                        feature,
                    }),
                }
            })
            .collect()
    }

    /// Keeps `body` as `feature`'s record file `name`, replacing what was there.
    pub async fn put_document(
        &self,
        feature: &str,
        name: &str,
        body: &str,
    ) -> Result<(), StoreError> {
        check_size(feature, name, body)?;
        put(&self.client, &self.project, feature, name, body).await
    }

    /// Takes the project's merge lock (a session advisory lock: held until given back or until
    /// this connection ends, when its process dies) unless another connection holds it;
    /// whether it was taken. Lanes on every machine merge and promote one at a time under it.
    pub async fn try_merge_lock(&mut self) -> Result<bool, StoreError> {
        let taken: bool = self
            .client
            .query_one(
                "SELECT pg_try_advisory_lock(hashtext('consort_store.merge'), hashtext($1))",
                &[&self.project],
            )
            .await
            .map(|r| r.get(0))
            .map_err(db("taking the merge lock"))?;
        if taken {
            self.merge_held = true;
            self.merge_lost = false;
        }
        Ok(taken)
    }

    /// Whether the merge lock this store took is still its own: false once the connection
    /// that held it was lost (the server gave the lock up with the session), so a merge must
    /// stop before it pushes or promotes.
    pub fn merge_lock_intact(&self) -> bool {
        self.merge_held && !self.merge_lost && !self.client.is_closed()
    }

    /// Gives the project's merge lock back.
    pub async fn merge_unlock(&mut self) -> Result<(), StoreError> {
        let was_held = std::mem::take(&mut self.merge_held);
        self.merge_lost = false;
        if !was_held || self.client.is_closed() {
            return Ok(());
        }
        self.client
            .query_one(
                "SELECT pg_advisory_unlock(hashtext('consort_store.merge'), hashtext($1))",
                &[&self.project],
            )
            .await
            .map_err(db("giving the merge lock back"))?;
        Ok(())
    }

    /// Every feature's lease that someone holds, live or run out, by feature.
    pub async fn holdings(&self) -> Result<Vec<Holding>, StoreError> {
        let rows = self
            .client
            .query(
                "SELECT feature, holder, since, expires_at > clock_timestamp(), lost \
                 FROM consort_store.leases \
                 WHERE project = $1 AND holder IS NOT NULL AND since IS NOT NULL \
                 ORDER BY feature",
                &[&self.project],
            )
            .await
            .map_err(db("reading who holds which feature"))?;
        rows.iter()
            .map(|r| {
                let feature: String = r.get(0);
                let lost = u32::try_from(r.get::<_, i32>(4)).map_err(|_| StoreError::BadRow {
                    feature: feature.clone(),
                    seq: 0,
                    reason: "its lease row counts fewer than no lost workers".into(),
                })?;
                Ok(Holding {
                    feature,
                    holder: r.get(1),
                    since: r.get(2),
                    live: r.get::<_, Option<bool>>(3) == Some(true),
                    lost,
                })
            })
            .collect()
    }
}

/// A record file larger than the store keeps is refused with its name.
fn check_size(feature: &str, name: &str, body: &str) -> Result<(), StoreError> {
    if body.len() > MAX_DOCUMENT_BYTES {
        return Err(StoreError::BadRow {
            feature: feature.to_string(),
            seq: 0,
            reason: format!("its {name} is larger than {MAX_DOCUMENT_BYTES} bytes"),
        });
    }
    Ok(())
}

async fn put(
    client: &impl tokio_postgres::GenericClient,
    project: &str,
    feature: &str,
    name: &str,
    body: &str,
) -> Result<(), StoreError> {
    client
        .execute(
            "INSERT INTO consort_store.documents (project, feature, name, body) \
             VALUES ($1, $2, $3, $4) \
             ON CONFLICT (project, feature, name) DO UPDATE SET body = EXCLUDED.body",
            &[&project, &feature, &name, &body],
        )
        .await
        .map_err(db(format!("keeping {feature}'s {name}")))?;
    Ok(())
}
