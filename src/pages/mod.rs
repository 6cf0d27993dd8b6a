//! Page actions: opening the pages (and corpus documents) a policy asks for.
//!
//! [`guard`] decides what may be fetched (SSRF protection); [`reader`]
//! fetches, extracts and caches. Profiles decide how a page is chunked and
//! spliced ([`crate::profile::Pages`]).

pub mod guard;
pub mod reader;

pub use guard::{refused_reason, Lookup, Refusal, UrlPolicy};
pub use reader::{html_to_text, Page, PageError, PageReader, PageSettings};
