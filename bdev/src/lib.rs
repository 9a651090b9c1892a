//! Ferrite bdev.
