//! Who is calling: every call to a kube-dispatch server carries a Kubernetes ServiceAccount
//! token as `authorization: Bearer <token>`; [`Authenticator`] verifies it with a TokenReview for
//! the expected audiences and [`AuthLayer`] puts the caller's [`Identity`] on the request (or
//! answers UNAUTHENTICATED with a message that says what is wrong, never the token).
//!
//!
//! - `identity`: who a caller is ([`Identity`], [`Caller`]), and this process's own identity;
//! - `groups`: a controller group as the tier keys it ([`GroupId`]), and which users may use a
//!   group listed with `--group-owner` ([`GroupOwners`]);
//! - `claims`: the bearer token of a request and the claims read from it before any review;
//! - `token_review`: the TokenReview of a token, cached and budgeted ([`Authenticator`]);
//! - `layer`: the tower layer that authenticates each call ([`AuthLayer`]);
//! - `error`: why a call is not authenticated ([`Unauthenticated`]).

mod claims;
mod error;
mod groups;
mod identity;
mod layer;
mod token_review;

pub use claims::bearer_token;
pub use error::Unauthenticated;
pub use groups::{GroupId, GroupOwners, NotOwner};
pub use identity::{Caller, Identity, own_identity};
pub use layer::{AuthLayer, Authenticate, Authentication};
pub use token_review::{AuthConfig, Authenticator};
