//! One integration binary; each module holds the tests of one behaviour area.

mod admin;
mod claims;
mod durability;
mod faults;
mod helpers;
mod http;
mod services;
