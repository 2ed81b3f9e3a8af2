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
mod findings;
mod helpers;
mod http;
mod lifecycle;
mod live;
mod model;
mod observe;
mod openapi;
mod operators;
mod outbox;
mod proxy;
mod restock;
mod rollback;
mod services;
mod stalls;
mod waitlist;
mod writer;
