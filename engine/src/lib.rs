//! Ferrite engine.
pub mod config;
pub mod fabric;
pub mod jobs;
pub mod region;
pub mod server;
pub mod store;
pub mod target;
pub use server::{Engine, EngineHandle};
