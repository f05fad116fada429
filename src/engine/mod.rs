//! The async side of dagloop: the only module that spawns tasks, sleeps, reads clocks and talks
//! to the outside world. It performs the actions of the sans-IO core.
//!
//! `inner` drives one step's scheduler; `bus` stamps and delivers events.

pub mod bus;
pub mod inner;
