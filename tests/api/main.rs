//! One integration binary; each module holds the tests of one behaviour area.

mod admin;
mod batches;
mod catalog;
mod claims;
mod cli;
mod deploy;
mod durability;
mod edge;
mod faults;
mod helpers;
mod http;
mod model;
mod observe;
mod operators;
mod outbox;
mod proxy;
mod restock;
mod rollback;
mod services;
mod soldout;
mod stalls;
mod writer;
