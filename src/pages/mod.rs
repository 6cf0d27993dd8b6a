//! Page actions: opening the pages (and corpus documents) a policy asks for.
//!
//! [`guard`] decides what may be fetched (SSRF protection); [`reader`]
//! fetches and caches; [`extract`] turns HTML into text, and [`shape`] keeps
//! pages too deep to parse away from its parsers. Profiles decide how a page is chunked and
//! spliced ([`crate::profile::Pages`]).

pub mod corpus;
pub mod extract;
pub mod guard;
pub mod reader;
pub mod shape;

pub use corpus::{Article, Corpus};
pub use extract::html_to_text;
pub use guard::{refused_reason, Lookup, Refusal, UrlPolicy};
pub use reader::{Page, PageError, PageReader, PageSettings};
