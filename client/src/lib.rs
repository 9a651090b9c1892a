//! Ferrite client library.
