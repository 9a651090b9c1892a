//! Ferrite xstream.
