//! One module per scenario (each a subcommand).

pub mod agent_stream;
pub mod cluster;
pub mod coedit;
pub mod connections;
pub mod drafts;
pub mod durable;
pub mod fanout;
pub mod hostile;
pub mod reconnect;
pub mod recovery;
pub mod store;
