//! What the integration tests share: traces built to order ([`traces`]), the known traces and
//! golden files of the command-line tests ([`cli`]), traces written byte by byte
//! where our writer would refuse ([`handmade`]), the allocation-counting global
//! allocator ([`counting_alloc`]), and a validator of the JSON outputs' schemas ([`schema`]).

#[cfg(feature = "cli")]
pub mod cli;
pub mod counting_alloc;
#[cfg(feature = "cli")]
pub mod handmade;
#[cfg(feature = "cli")]
pub mod schema;
pub mod traces;
