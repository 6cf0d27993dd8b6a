//! Temporary files and directories named after the process that writes them
//! (`PREFIX{pid}`: a weight copy being prepared, an index being built), the
//! removal of those left by processes that no longer run (killed, or
//! stopped by a signal before they could clean up), and the replacement of a
//! directory in place that a kill at any instant cannot lose
//! ([`Replacement`]).

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

/// The names of a directory `target` replaced in place: the new build is
/// written to `{dir}/{tmp}{pid}` and the old one moved aside to
/// `{dir}/{aside}{pid}` while the new one is renamed in ([`replace_dir`]).
/// `dir` is `target`'s parent (same file system, so each rename is atomic).
#[derive(Clone, Debug)]
pub struct Replacement {
    /// The directory being replaced (absolute).
    pub target: std::path::PathBuf,
    /// Prefix of builds in progress, e.g. `.index.tmp-`.
    pub tmp: String,
    /// Prefix of old directories moved aside, e.g. `.index.old-`.
    pub aside: String,
}

impl Replacement {
    fn parent(&self) -> &Path {
        self.target.parent().unwrap_or(Path::new("."))
    }

    /// Where this process builds the new directory.
    pub fn tmp_path(&self) -> std::path::PathBuf {
        self.parent()
            .join(format!("{}{}", self.tmp, std::process::id()))
    }

    fn aside_path(&self) -> std::path::PathBuf {
        self.parent()
            .join(format!("{}{}", self.aside, std::process::id()))
    }

    /// Entries of the parent named `{prefix}{pid}` whose process no longer
    /// runs and for which `complete` holds, newest first.
    fn orphans(&self, prefix: &str, complete: &dyn Fn(&Path) -> bool) -> Vec<std::path::PathBuf> {
        let Ok(entries) = std::fs::read_dir(self.parent()) else {
            return Vec::new();
        };
        let mut found: Vec<(std::time::SystemTime, std::path::PathBuf)> = entries
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_prefix(prefix))
                    .and_then(|p| p.parse::<u32>().ok())
                    .is_some_and(|pid| running(pid) == Some(false))
            })
            .map(|e| e.path())
            .filter(|p| complete(p))
            .map(|p| {
                let modified = std::fs::metadata(&p)
                    .and_then(|m| m.modified())
                    .unwrap_or(std::time::UNIX_EPOCH);
                (modified, p)
            })
            .collect();
        found.sort_by_key(|f| std::cmp::Reverse(f.0));
        found.into_iter().map(|(_, p)| p).collect()
    }

    /// After a replacement was killed between moving the old directory
    /// aside and renaming the new one in, `target` is missing: this renames
    /// back the newest complete directory a stopped process left — its
    /// finished new build, else the old directory it moved aside — and
    /// returns it. Nothing happens while `target` exists, or where it cannot
    /// be told which processes run.
    ///
    /// # Errors
    /// The rename's I/O error.
    pub fn recover(
        &self,
        complete: &dyn Fn(&Path) -> bool,
    ) -> std::io::Result<Option<std::path::PathBuf>> {
        if self.target.exists() {
            return Ok(None);
        }
        let mut candidates = self.orphans(&self.tmp, complete);
        candidates.extend(self.orphans(&self.aside, complete));
        let Some(found) = candidates.into_iter().next() else {
            return Ok(None);
        };
        std::fs::rename(&found, &self.target)?;
        tracing::warn!(
            from = %found.display(),
            to = %self.target.display(),
            "adopted what an interrupted index replacement left"
        );
        Ok(Some(found))
    }

    /// [`Self::recover`], then removes the unfinished builds and the old
    /// directories that stopped processes left.
    ///
    /// # Errors
    /// The recovering rename's I/O error.
    pub fn clean(&self, complete: &dyn Fn(&Path) -> bool) -> std::io::Result<()> {
        self.recover(complete)?;
        remove_stale(self.parent(), &self.tmp);
        remove_stale(self.parent(), &self.aside);
        Ok(())
    }

    /// Puts the finished build at [`Self::tmp_path`] in place of `target`,
    /// so that a process killed at any instant leaves `target` holding the
    /// old or the new directory, or missing with both beside it for
    /// [`Self::recover`]: (1) the old `target`, if any, is renamed aside,
    /// (2) the new build is renamed to `target`, (3) the old one is removed.
    ///
    /// # Errors
    /// A rename's I/O error; if the second fails, the old directory is
    /// renamed back first.
    pub fn replace(&self) -> std::io::Result<()> {
        let tmp = self.tmp_path();
        let aside = self.aside_path();
        if aside.exists() {
            std::fs::remove_dir_all(&aside)?;
        }
        let moved_aside = match std::fs::rename(&self.target, &aside) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(e),
        };
        if let Err(e) = std::fs::rename(&tmp, &self.target) {
            if moved_aside {
                let _ = std::fs::rename(&aside, &self.target);
            }
            return Err(e);
        }
        if moved_aside {
            if let Err(e) = std::fs::remove_dir_all(&aside) {
                tracing::warn!(path = %aside.display(), error = %e, "could not remove the old index");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A pid whose process has ended.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    /// A complete directory holding `what` (its "manifest", written last).
    fn build(path: &Path, what: &str) {
        std::fs::create_dir_all(path).unwrap();
        std::fs::write(path.join("segment"), what).unwrap();
        std::fs::write(path.join("manifest"), what).unwrap();
    }

    fn complete(path: &Path) -> bool {
        path.join("manifest").is_file()
    }

    fn served(r: &Replacement) -> Option<String> {
        r.recover(&complete).unwrap();
        std::fs::read_to_string(r.target.join("manifest")).ok()
    }

    fn setup() -> (tempfile::TempDir, Replacement, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let r = Replacement {
            target: dir.path().join("index"),
            tmp: ".index.tmp-".into(),
            aside: ".index.old-".into(),
        };
        let pid = dead_pid();
        let tmp = dir.path().join(format!(".index.tmp-{pid}"));
        let aside = dir.path().join(format!(".index.old-{pid}"));
        (dir, r, tmp, aside)
    }

    /// What a replacement killed at each instant leaves on disk, and what is
    /// served from it: always the old or the new directory, whole.
    #[test]
    fn a_kill_at_any_step_of_a_replacement_leaves_the_old_or_the_new_directory() {
        // Killed while building: the old one stays.
        let (_d, r, tmp, _) = setup();
        build(&r.target, "old");
        std::fs::create_dir_all(&tmp).unwrap();
        std::fs::write(tmp.join("segment"), "half").unwrap();
        assert_eq!(served(&r).as_deref(), Some("old"));
        // Built, not yet moved: the old one stays.
        let (_d, r, tmp, _) = setup();
        build(&r.target, "old");
        build(&tmp, "new");
        assert_eq!(served(&r).as_deref(), Some("old"));
        // Old one moved aside, new one not yet in: the new one is adopted.
        let (_d, r, tmp, aside) = setup();
        build(&aside, "old");
        build(&tmp, "new");
        assert_eq!(served(&r).as_deref(), Some("new"));
        assert!(!tmp.exists() && aside.exists());
        // ... and without a finished new one, the old one comes back.
        let (_d, r, tmp, aside) = setup();
        build(&aside, "old");
        std::fs::create_dir_all(&tmp).unwrap();
        assert_eq!(served(&r).as_deref(), Some("old"));
        // New one in, old one not (or half) removed: the new one.
        let (_d, r, _, aside) = setup();
        build(&r.target, "new");
        build(&aside, "old");
        std::fs::remove_file(aside.join("manifest")).unwrap();
        assert_eq!(served(&r).as_deref(), Some("new"));
        // A first build killed before its end leaves nothing to serve.
        let (_d, r, tmp, _) = setup();
        std::fs::create_dir_all(&tmp).unwrap();
        assert_eq!(served(&r), None);
    }

    #[test]
    fn clean_adopts_then_removes_what_stopped_processes_left() {
        let (dir, r, tmp, aside) = setup();
        build(&aside, "old");
        build(&tmp, "new");
        r.clean(&complete).unwrap();
        assert_eq!(served(&r).as_deref(), Some("new"));
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["index"]);
    }

    #[test]
    fn replace_puts_the_new_directory_in_and_leaves_nothing_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let r = Replacement {
            target: dir.path().join("index"),
            tmp: ".index.tmp-".into(),
            aside: ".index.old-".into(),
        };
        // First build: nothing to move aside.
        build(&r.tmp_path(), "first");
        r.replace().unwrap();
        assert_eq!(served(&r).as_deref(), Some("first"));
        build(&r.tmp_path(), "second");
        r.replace().unwrap();
        assert_eq!(served(&r).as_deref(), Some("second"));
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["index"]);
    }
}
