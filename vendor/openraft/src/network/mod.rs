//! The Raft network interface.

mod backoff;
mod factory;
#[allow(clippy::module_inception)]
mod network;
mod rpc_option;
mod rpc_type;

pub mod snapshot_transport;

pub use backoff::Backoff;
pub use factory::RaftNetworkFactory;
pub use network::PipelinedAppend;
pub use network::RaftNetwork;
pub use rpc_option::RPCOption;
pub use rpc_type::RPCTypes;
