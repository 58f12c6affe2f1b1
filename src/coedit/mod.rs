//! Several people typing in one text at once (a text answer, a chat's
//! draft), with no keystroke lost: operational transformation with one
//! authority per text.
//!
//! Each editor ([`TextClient`]) sends what it typed as an operation
//! ([`TextOp`]) on the last revision it saw; the authority ([`TextDoc`],
//! kept by the chat actor) carries it over the edits taken since, applies
//! it, and publishes it as the next revision ([`Edit`]); every editor
//! carries it over what it typed meanwhile. Everyone converges on one
//! text, with every character anyone typed kept unless someone deleted it
//! after seeing it.
//!
//! Files: [`op`] operations (apply, compose, transform, diff, the wire
//! form); [`doc`] the authority's copy; [`client`] an editor's.

pub(crate) mod client;
pub(crate) mod doc;
pub(crate) mod op;

pub use client::{ClientError, Outgoing, Received, TextClient};
pub use doc::{Edit, EditError, Taken, TextDoc};
pub use op::{OpError, Step, TextOp};

#[cfg(test)]
mod sim_tests;
#[cfg(test)]
mod tests;
