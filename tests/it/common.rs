//! Test doubles at the trait boundaries.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use seeker::profile::Profile;
use seeker::search::dispatch::Dispatcher;
use seeker::search::{Document, SearchBackend, SearchError};

/// Repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every shipped policy profile.
pub fn profiles() -> BTreeMap<String, Profile> {
    Profile::load_dir(&root().join("config/policies")).expect("profiles load")
}

/// A shipped policy profile by name.
pub fn profile(name: &str) -> Profile {
    profiles()[name].clone()
}

pub fn doc(id: &str, title: &str, text: &str) -> Document {
    Document {
        id: id.into(),
        title: title.into(),
        text: text.into(),
        url: None,
        score: 1.0,
        backend: "static".into(),
    }
}

/// A backend with fixed answers per query; unknown queries get no documents,
/// queries listed in `failing` fail. Records every query it was asked.
#[derive(Default)]
pub struct StaticBackend {
    pub answers: HashMap<String, Vec<Document>>,
    pub failing: Vec<String>,
    pub asked: Mutex<Vec<String>>,
}

impl StaticBackend {
    pub fn with(answers: &[(&str, Vec<Document>)]) -> Arc<Self> {
        Arc::new(Self {
            answers: answers
                .iter()
                .map(|(q, d)| (q.to_string(), d.clone()))
                .collect(),
            ..Self::default()
        })
    }
}

#[async_trait]
impl SearchBackend for StaticBackend {
    async fn search(&self, query: &str, k: usize) -> Result<Vec<Document>, SearchError> {
        self.asked.lock().unwrap().push(query.to_string());
        if self.failing.iter().any(|f| f == query) {
            return Err(SearchError::Backend("backend down".into()));
        }
        let mut docs = self.answers.get(query).cloned().unwrap_or_default();
        docs.truncate(k);
        Ok(docs)
    }
}

/// A dispatcher whose only (and default) backend, `static`, is `backend`.
pub fn dispatcher(backend: Arc<StaticBackend>) -> Arc<Dispatcher> {
    Arc::new(Dispatcher::single("static", backend))
}

/// The default data fetched by scripts/fetch-defaults.sh; panics with the fix
/// when it is missing (a missing fixture is a failure, never a skip).
pub fn default_data(relative: &str) -> PathBuf {
    let path = root().join(relative);
    assert!(
        Path::new(&path).is_file(),
        "{} is missing: run scripts/fetch-defaults.sh --no-index first",
        path.display()
    );
    path
}

/// POSTs `body` as JSON to `url` and returns the JSON answer; panics on a
/// transport error or a body that is not JSON.
pub async fn post_json(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> serde_json::Value {
    client
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// GETs `url` and returns the JSON answer; panics on a transport error or
/// a body that is not JSON.
pub async fn get_json(client: &reqwest::Client, url: &str) -> serde_json::Value {
    client.get(url).send().await.unwrap().json().await.unwrap()
}

/// The server's `/metrics` text (Prometheus exposition format).
pub async fn metrics_of(client: &reqwest::Client, base: &str) -> String {
    let response = client.get(format!("{base}/metrics")).send().await.unwrap();
    response.text().await.unwrap()
}

/// Runs one rollout of `profile` on `engine` against `backend`: the outcome
/// and every event, in order.
pub async fn run_scripted(
    engine: &seeker::engine::scripted::ScriptedEngine,
    profile: Profile,
    backend: Arc<StaticBackend>,
    req: &seeker::rollout::RolloutRequest,
) -> (
    Result<seeker::rollout::RolloutOutcome, seeker::rollout::RolloutError>,
    Vec<seeker::rollout::RolloutEvent>,
) {
    let ctx = seeker::rollout::RolloutContext {
        engine: Arc::new(engine.clone()),
        text: engine.text(),
        search: dispatcher(backend),
        profile: Arc::new(profile),
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let result = seeker::rollout::run(&ctx, req, &tx).await;
    drop(tx);
    let mut events = Vec::new();
    while let Some(e) = rx.recv().await {
        events.push(e);
    }
    (result, events)
}
