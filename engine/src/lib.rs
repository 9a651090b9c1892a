//! Ferrite engine.
pub mod jobs;
pub mod region;
pub mod store;
