//! consort-agents against what runs on this machine alone: the role actor, external commands
//! and the coding-agent CLI presets (real processes), the OpenAI-compatible client against
//! loopback servers, scripted replay, the script skeleton and the generated artifact reference.
//! No PostgreSQL and no network. (`secrets.rs` is a binary of its own: it captures the global
//! log; `real_model.rs` too: it needs llama.cpp's server.)

mod actor;
mod command;
mod openai;
mod presets;
mod reference;
mod script;
mod skeleton;
