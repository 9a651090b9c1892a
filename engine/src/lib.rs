//! Ferrite engine.
