//! Ferrite engine.
pub mod jobs;
