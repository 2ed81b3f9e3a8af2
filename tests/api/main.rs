//! One integration binary; each module holds the tests of one behaviour area.

mod admin;
mod batches;
mod catalog;
mod claims;
mod cli;
mod durability;
mod faults;
mod helpers;
mod http;
mod restock;
mod services;
mod writer;
