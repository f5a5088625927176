//! idemd, the Idem idempotency server.
#![allow(missing_docs)]
pub mod store;
