//! An actor made from a function: a test double for any protocol whose answers need no state of
//! their own (a role actor answering from a script, a Lakebase actor reading the work tree);
//! and an approver made from a function.

use std::fmt;
use std::sync::Arc;

use consort_actors::{
    ActorId, Approver, Artifact, Assignment, BoxFuture, GateApproval, GateRequest, Produced,
    RoleMsg, Usage,
};
use ractor::{Actor, ActorProcessingErr, ActorRef, Message};

/// How an [`FnActor`] handles one message.
type Handler<M> = Arc<dyn Fn(M) -> Result<(), ActorProcessingErr> + Send + Sync>;

/// An actor that hands every message to one function. It keeps no state; clones share the
/// function, so a supervisor restarts it as the same double.
pub struct FnActor<M> {
    handle: Handler<M>,
}

impl<M> FnActor<M> {
    /// An actor that handles each message with `handle`; an `Err` fails the actor, as an error
    /// from a real actor's handler does.
    pub fn new(
        handle: impl Fn(M) -> Result<(), ActorProcessingErr> + Send + Sync + 'static,
    ) -> Self {
        FnActor {
            handle: Arc::new(handle),
        }
    }
}

impl<M> Clone for FnActor<M> {
    fn clone(&self) -> Self {
        FnActor {
            handle: Arc::clone(&self.handle),
        }
    }
}

impl<M> fmt::Debug for FnActor<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FnActor")
    }
}

impl<M: Message> Actor for FnActor<M> {
    type Msg = M;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<M>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(&self, _: ActorRef<M>, msg: M, _: &mut ()) -> Result<(), ActorProcessingErr> {
        (self.handle)(msg)
    }
}

/// A role actor playing `id` that answers every assignment at once with the artifact `answer`
/// gives for it (an `Err` fails the actor).
pub fn role(
    id: ActorId,
    answer: impl Fn(&Assignment) -> Result<Artifact, ActorProcessingErr> + Send + Sync + 'static,
) -> FnActor<RoleMsg> {
    FnActor::new(move |msg| {
        match msg {
            RoleMsg::Assign(a, port) => {
                let artifact = answer(&a)?;
                let _ = port.send(Ok(Produced {
                    assignment: a.id,
                    author: id.clone(),
                    artifact,
                    usage: Usage::default(),
                    transcript: None,
                }));
            }
            RoleMsg::Identify(port) => {
                let _ = port.send(id.clone());
            }
        }
        Ok(())
    })
}

/// An approver made from a function, which decides each gate at once from its request.
pub struct FnApprover<F>(pub F);

impl<F> fmt::Debug for FnApprover<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FnApprover")
    }
}

impl<F> Approver for FnApprover<F>
where
    F: Fn(&GateRequest) -> Option<GateApproval> + Send + Sync,
{
    fn decide<'a>(&'a self, request: &'a GateRequest) -> BoxFuture<'a, Option<GateApproval>> {
        let decision = (self.0)(request);
        Box::pin(async move { decision })
    }
}
