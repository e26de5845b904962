//! The branch passwords this process knows, and renewing the password of a branch an earlier
//! process made.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::ServerProvider;
use super::catalog::role_meta;
use crate::error::{Error, Result};
use crate::names::{db_ident, quote_ident, quote_literal, random_password, validate_branch_name};
use crate::provider::{Branch, ConnectInfo, Secret};
use crate::scram;

/// Branch name → password, for the branches this process made or renewed.
#[derive(Default)]
pub(super) struct SecretStore(Mutex<HashMap<String, Secret>>);

impl SecretStore {
    /// The map. A panic elsewhere cannot leave it half-changed (each use is one `get`,
    /// `insert` or `remove` under the lock), so a poisoned lock is taken over rather than
    /// failing every later branch.
    fn map(&self) -> MutexGuard<'_, HashMap<String, Secret>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn get(&self, name: &str) -> Option<Secret> {
        self.map().get(name).cloned()
    }

    pub(super) fn insert(&self, name: &str, secret: Secret) {
        self.map().insert(name.to_string(), secret);
    }

    pub(super) fn remove(&self, name: &str) {
        self.map().remove(name);
    }
}

impl ServerProvider {
    /// The branch's connection data; a branch of an earlier process gets a new password.
    pub(super) async fn connect_info_impl(&self, branch: &Branch) -> Result<ConnectInfo> {
        let secret = match self.secrets.get(&branch.name) {
            Some(s) => s,
            None => self.renew_password(branch).await?,
        };
        let ident = db_ident(&branch.name);
        Ok(ConnectInfo {
            host: self.target.branch_host.clone(),
            port: self.target.branch_port,
            database: ident.clone(),
            user: ident,
            secret,
            expires_at: None,
            sslmode: self.target.branch_ssl,
            ca_file: None,
        })
    }

    /// Gives the role of a branch made by an earlier process a new password.
    async fn renew_password(&self, branch: &Branch) -> Result<Secret> {
        validate_branch_name(&branch.name)?;
        let ident = db_ident(&branch.name);
        let password = random_password();
        let verifier = scram::verifier(password.as_bytes(), scram::BRANCH_ITERATIONS);
        let mut slot = self.admin.slot().await;
        let admin = self.admin.client(&mut slot).await?;
        if role_meta(admin, &ident).await?.is_none() {
            return Err(Error::NotFound(format!("branch {}", branch.name)));
        }
        admin
            .batch_execute(&format!(
                "ALTER ROLE {} PASSWORD {}",
                quote_ident(&ident),
                quote_literal(&verifier)
            ))
            .await
            .map_err(|e| Error::from_pg("renewing a branch password", e))?;
        let s = Secret::new(password);
        self.secrets.insert(&branch.name, s.clone());
        Ok(s)
    }
}
