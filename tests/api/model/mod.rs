//! Model-based tests: a small reference model of dropgate's state, driven in lockstep with
//! the real scripts (`scripts`) and the real gateway under faults (`gateway`).

mod gateway;
mod nemesis;
mod scripts;
mod world;
