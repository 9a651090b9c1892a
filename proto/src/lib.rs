//! Ferrite proto.
