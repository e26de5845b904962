//! How the conductor reaches role actors and the Lakebase actor.
//!
//! The conductor depends on these two small traits, not on concrete actors, so that
//! `consort-agents` and `consort-lakebase` (which this crate does not know) plug in through
//! their ractor actors under supervision ([`SupervisedRole`], [`SupervisedLakebase`]).

use std::time::Duration;

use ractor::ActorRef;

use crate::core::artifact::{InfraFault, TestRunReceipt};
use crate::core::protocol::{
    AgentFailure, InfraError, PromoteReport, PromoteRequest, VerifyRequest,
};
use crate::core::role::ActorId;
use crate::runtime::gate::BoxFuture;
use crate::runtime::messages::{Assignment, LakebaseMsg, RoleMsg, RoleReply};
use crate::runtime::supervision::{Supervised, SupervisionError};

/// A role the conductor can assign steps to.
pub trait RoleEndpoint: Send + Sync {
    /// The identity recorded as author of what this role produces.
    fn identity(&self) -> &ActorId;

    /// Performs one assignment within `timeout` (per attempt).
    fn assign(&self, assignment: Assignment, timeout: Duration) -> BoxFuture<'_, RoleReply>;
}

/// The Lakebase side: verifications and promotions.
pub trait LakebaseEndpoint: Send + Sync {
    /// Runs the suite on a fresh branch.
    fn verify(
        &self,
        request: VerifyRequest,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<TestRunReceipt, InfraError>>;

    /// Applies the migrations to the parent database.
    fn promote(
        &self,
        request: PromoteRequest,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<PromoteReport, InfraError>>;
}

/// A role actor under a supervisor: a crash mid-step restarts it and retries the same
/// assignment; past the restart intensity the step fails as an infrastructure fault.
#[derive(Debug, Clone)]
pub struct SupervisedRole {
    /// The identity of the actor.
    pub id: ActorId,
    /// The supervised handle.
    pub handle: Supervised<RoleMsg>,
}

impl RoleEndpoint for SupervisedRole {
    fn identity(&self) -> &ActorId {
        &self.id
    }

    fn assign(&self, assignment: Assignment, timeout: Duration) -> BoxFuture<'_, RoleReply> {
        Box::pin(async move {
            let mut crashes = 0usize;
            loop {
                let incarnation = self.handle.incarnation();
                let result = self
                    .handle
                    .call(|port| RoleMsg::Assign(assignment.clone(), port), timeout)
                    .await;
                match result {
                    // The actor reported its own crash before its supervisor restarts it: wait
                    // for the restart and retry the same assignment, within the intensity limit.
                    Ok(Err(AgentFailure::Crashed { detail })) => {
                        crashes += 1;
                        if crashes > self.handle.policy().max_restarts {
                            return Err(AgentFailure::Crashed { detail });
                        }
                        tracing::warn!(role = %self.id, %detail, "agent crashed; retrying the step after the restart");
                        if let Err(e) = self.handle.wait_for_restart(incarnation, timeout).await {
                            return Err(AgentFailure::Crashed {
                                detail: format!("{detail}; {e}"),
                            });
                        }
                    }
                    Ok(reply) => return reply,
                    Err(SupervisionError::Timeout { after, .. }) => {
                        return Err(AgentFailure::Timeout {
                            secs: after.as_secs(),
                        });
                    }
                    Err(e) => {
                        return Err(AgentFailure::Crashed {
                            detail: e.to_string(),
                        });
                    }
                }
            }
        })
    }
}

/// A plain (unsupervised) role actor, for embedding and tests.
#[derive(Debug, Clone)]
pub struct DirectRole {
    /// The identity of the actor.
    pub id: ActorId,
    /// The actor.
    pub actor: ActorRef<RoleMsg>,
}

impl RoleEndpoint for DirectRole {
    fn identity(&self) -> &ActorId {
        &self.id
    }

    fn assign(&self, assignment: Assignment, timeout: Duration) -> BoxFuture<'_, RoleReply> {
        Box::pin(async move {
            match self
                .actor
                .call(|port| RoleMsg::Assign(assignment, port), Some(timeout))
                .await
            {
                Ok(ractor::rpc::CallResult::Success(reply)) => reply,
                Ok(ractor::rpc::CallResult::Timeout) => Err(AgentFailure::Timeout {
                    secs: timeout.as_secs(),
                }),
                Ok(ractor::rpc::CallResult::SenderError) | Err(_) => Err(AgentFailure::Crashed {
                    detail: "the role actor went away".into(),
                }),
            }
        })
    }
}

/// The Lakebase actor under a supervisor.
#[derive(Debug, Clone)]
pub struct SupervisedLakebase {
    /// The supervised handle.
    pub handle: Supervised<LakebaseMsg>,
}

fn infra(e: SupervisionError) -> InfraError {
    InfraError {
        fault: e.infra_fault(),
        detail: e.to_string(),
    }
}

impl LakebaseEndpoint for SupervisedLakebase {
    fn verify(
        &self,
        request: VerifyRequest,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<TestRunReceipt, InfraError>> {
        Box::pin(async move {
            self.handle
                .call(|port| LakebaseMsg::Verify(request.clone(), port), timeout)
                .await
                .map_err(infra)?
        })
    }

    fn promote(
        &self,
        request: PromoteRequest,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<PromoteReport, InfraError>> {
        Box::pin(async move {
            self.handle
                .call(|port| LakebaseMsg::Promote(request.clone(), port), timeout)
                .await
                .map_err(infra)?
        })
    }
}

/// A plain (unsupervised) Lakebase actor.
#[derive(Debug, Clone)]
pub struct DirectLakebase {
    /// The actor.
    pub actor: ActorRef<LakebaseMsg>,
}

async fn call_direct<R: Send + 'static>(
    actor: &ActorRef<LakebaseMsg>,
    build: impl FnOnce(ractor::RpcReplyPort<Result<R, InfraError>>) -> LakebaseMsg,
    timeout: Duration,
) -> Result<R, InfraError> {
    match actor.call(build, Some(timeout)).await {
        Ok(ractor::rpc::CallResult::Success(reply)) => reply,
        Ok(ractor::rpc::CallResult::Timeout) => Err(InfraError {
            fault: InfraFault::Timeout,
            detail: format!(
                "no answer within {}",
                crate::core::text::duration_text(timeout)
            ),
        }),
        Ok(ractor::rpc::CallResult::SenderError) | Err(_) => Err(InfraError {
            fault: InfraFault::ActorCrashing,
            detail: "the Lakebase actor went away".into(),
        }),
    }
}

impl LakebaseEndpoint for DirectLakebase {
    fn verify(
        &self,
        request: VerifyRequest,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<TestRunReceipt, InfraError>> {
        Box::pin(call_direct(
            &self.actor,
            |port| LakebaseMsg::Verify(request, port),
            timeout,
        ))
    }

    fn promote(
        &self,
        request: PromoteRequest,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<PromoteReport, InfraError>> {
        Box::pin(call_direct(
            &self.actor,
            |port| LakebaseMsg::Promote(request, port),
            timeout,
        ))
    }
}
