//! The runtime: the conductor actor that performs the machine's commands, the supervision of
//! role and Lakebase actors, the messages between them, the gates' approvers and the build
//! steps' workbench. It may use every other layer; no other layer uses it.

pub(crate) mod conductor;
pub(crate) mod gate;
pub(crate) mod messages;
pub(crate) mod supervision;
pub mod workbench;
