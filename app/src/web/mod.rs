//! What every HTTP route of the service shares, whoever contributes the route
//! — the service's own router (`crate::http`) or a strategy that serves routes
//! of its own (the `queue` strategy's request results, the lock strategies'
//! statistics): [`AppError`], the one mapping of failures to problem+json
//! answers, and extractors whose rejections are problems ([`ApiJson`],
//! [`SalePath`]).
//!
//! It sits below the strategies so that their routes answer exactly like the
//! service's own, and it knows nothing of routing, state or authentication.

pub mod error;
pub mod extract;

pub use error::{AppError, PROBLEM_TYPE_PREFIX, Problem};
pub use extract::{ApiJson, SalePath};
