//! Temporary files and directories named after the process that writes them
//! (`PREFIX{pid}`: a weight copy being prepared, an index being built), and
//! the removal of those left by processes that no longer run (killed, or
//! stopped by a signal before they could clean up).

use std::path::Path;

/// Whether process `pid` runs, where `/proc` tells (Linux); `None` elsewhere.
fn running(pid: u32) -> Option<bool> {
    if !Path::new("/proc/self").exists() {
        return None;
    }
    Some(pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists())
}

/// Removes every entry of `dir` named `{prefix}{pid}` whose process no longer
/// runs (files and whole directories); returns how many. Nothing is removed
/// where it cannot be told which processes run.
pub fn remove_stale(dir: &Path, prefix: &str) -> usize {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if running(pid) != Some(false) {
            continue;
        }
        let path = entry.path();
        let gone = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        if gone.is_ok() {
            tracing::info!(path = %path.display(), "removed what a stopped process left unfinished");
            removed += 1;
        }
    }
    removed
}
