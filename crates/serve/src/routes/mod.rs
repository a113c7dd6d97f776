//! The handlers, one module per resource.

pub(crate) mod ops;
pub(crate) mod sessions;
pub(crate) mod turns;
