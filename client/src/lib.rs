//! Ferrite client library.
pub mod io500;
