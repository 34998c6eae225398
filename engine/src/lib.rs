pub mod antichain;
pub mod batch;
pub mod groups;
pub mod json;
#[cfg(feature = "python")]
mod python;
pub mod pending;
pub mod selection;
pub mod summary;
pub mod time;
pub mod topology;
pub mod tracker;
