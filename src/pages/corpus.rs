//! The local corpus as page actions see it: a target that is not an absolute
//! URL opens a document by id or title ([`Corpus`]). The trait is defined here,
//! below the search layer, and the tantivy index (`search::bm25::Bm25Index`)
//! implements it, so the page reader imports nothing of search.

/// A corpus document opened whole by a page action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Article {
    /// The id of its first passage.
    pub id: String,
    pub title: String,
    /// Every passage with that title, in corpus order, joined by blank lines.
    pub text: String,
}

/// Documents a page action opens by id or title when its target is not an
/// absolute URL: the local corpus (`search::bm25::Bm25Index` is one).
pub trait Corpus: Send + Sync + 'static {
    /// The article `locator` names (a document id, else a title), or `None`.
    /// Synchronous: the reader calls it off the async runtime.
    ///
    /// # Errors
    /// Why the corpus could not be read (a damaged index), in words.
    fn article(&self, locator: &str) -> Result<Option<Article>, String>;
}
