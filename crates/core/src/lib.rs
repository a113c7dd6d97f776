//! placeholder
pub mod config;
pub mod error;
pub mod event;
pub mod lifecycle;
pub mod policy;
pub mod session;
pub mod source;
pub mod stream;
pub mod supervisor;
pub mod testing;
pub mod watchdog;
mod util;

pub use error::*;
pub use event::*;
pub use lifecycle::*;
pub use policy::*;
pub use session::*;
pub use source::*;
pub use stream::*;
pub use supervisor::*;
pub use watchdog::*;
