//! The data directory's format version, and migrating an older directory
//! on start.
//!
//! `FORMAT` (one line, `idem-data-format N`) names the version of the whole
//! directory: the log segments, the entries in them and the snapshot file
//! each carry their own version too, and any change to one of them raises
//! this one. On start:
//!
//! - a directory of this build's version is used as it is;
//! - a newer or unreadable one is refused, never misread;
//! - an older one is copied whole to `<dir>.format-N.backup` (beside it,
//!   written under a temporary name, synced, then renamed, so a backup that
//!   exists is complete), then migrated in place one version at a time,
//!   `FORMAT` being replaced (atomically) after each step. A step must be
//!   safe to run again: a crash during one runs it again on the next start,
//!   and the backup, already complete, is kept as it is.
//!
//! A directory written before `FORMAT` existed (the first durable release)
//! is version 1.

use std::fs;
use std::path::{Path, PathBuf};

use super::wal::{replace_file, sync_dir};

/// The data directory format this build writes.
pub const DATA_FORMAT: u32 = 1;

const FILE: &str = "FORMAT";
const MAGIC: &str = "idem-data-format";

/// One migration: turns a directory of version `from` into `from + 1`, in
/// place. Must be safe to run again after a crash part way.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    /// The version it migrates from.
    pub from: u32,
    /// What it does.
    pub run: fn(&Path) -> Result<(), String>,
}

/// This build's migrations, oldest first (none while the format is 1).
pub const STEPS: &[Step] = &[];

/// Why a data directory cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// Written by a newer idemd.
    #[error(
        "{path}: data directory format {found} is newer than this idemd reads (up to {supported}); run a newer idemd, or restore a backup made for this one"
    )]
    Newer {
        /// The format file.
        path: PathBuf,
        /// Its version.
        found: u32,
        /// The newest this build reads.
        supported: u32,
    },
    /// Not a format file of Idem.
    #[error("{path}: not an Idem data directory format file ({reason})")]
    Foreign {
        /// The format file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// No migration from this version.
    #[error("{path}: no migration from data directory format {from} in this idemd")]
    NoStep {
        /// The directory.
        path: PathBuf,
        /// The version.
        from: u32,
    },
    /// A migration step failed.
    #[error(
        "{path}: migrating data directory format {from} to {} failed: {reason}; the directory as it was is kept in {}", from + 1, backup.display()
    )]
    Step {
        /// The directory.
        path: PathBuf,
        /// The version it was migrating from.
        from: u32,
        /// Why.
        reason: String,
        /// The backup of the directory before migrating.
        backup: PathBuf,
    },
    /// The files could not be read or written.
    #[error("{path}: {what}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The error.
        source: std::io::Error,
    },
}

fn io(path: &Path, what: &'static str) -> impl FnOnce(std::io::Error) -> FormatError {
    let path = path.to_owned();
    move |source| FormatError::Io { path, what, source }
}

/// What [`prepare`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepared {
    /// A new directory, now marked with this build's format.
    Created,
    /// Already of this build's format.
    Current,
    /// Migrated from `from`; the directory as it was is in `backup`.
    Migrated {
        /// The version it had.
        from: u32,
        /// Where its copy is.
        backup: PathBuf,
    },
}

/// Checks the format of `dir` (held under its lock) and migrates it to
/// [`DATA_FORMAT`] if it is older.
pub fn prepare(dir: &Path) -> Result<Prepared, FormatError> {
    prepare_with(dir, DATA_FORMAT, STEPS)
}

/// [`prepare`] with a given current version and steps (tests).
fn prepare_with(dir: &Path, current: u32, steps: &[Step]) -> Result<Prepared, FormatError> {
    let found = match read(dir)? {
        Some(v) => v,
        None if dir.join("log").exists() || dir.join("snapshot").exists() => 1,
        None => {
            write(dir, current)?;
            return Ok(Prepared::Created);
        }
    };
    if found > current {
        return Err(FormatError::Newer {
            path: dir.join(FILE),
            found,
            supported: current,
        });
    }
    if found == current {
        if !dir.join(FILE).exists() {
            write(dir, current)?;
        }
        return Ok(Prepared::Current);
    }
    let backup = backup_path(dir, found);
    if !backup.exists() {
        copy_dir(dir, &backup)?;
    }
    tracing::warn!(
        dir = %dir.display(),
        from = found,
        to = current,
        backup = %backup.display(),
        "migrating the data directory (a copy of it as it was is kept)"
    );
    for from in found..current {
        let step = steps
            .iter()
            .find(|s| s.from == from)
            .ok_or_else(|| FormatError::NoStep {
                path: dir.to_owned(),
                from,
            })?;
        (step.run)(dir).map_err(|reason| FormatError::Step {
            path: dir.to_owned(),
            from,
            reason,
            backup: backup.clone(),
        })?;
        write(dir, from + 1)?;
    }
    Ok(Prepared::Migrated {
        from: found,
        backup,
    })
}

/// Where the copy of `dir` at format `version` is kept.
fn backup_path(dir: &Path, version: u32) -> PathBuf {
    let name = dir
        .file_name()
        .map_or_else(|| "idem-data".into(), |n| n.to_string_lossy().into_owned());
    dir.with_file_name(format!("{name}.format-{version}.backup"))
}

/// The version in `dir`'s format file; `None` when there is none.
fn read(dir: &Path) -> Result<Option<u32>, FormatError> {
    let path = dir.join(FILE);
    let text = match fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&path, "read")(e)),
    };
    let foreign = |reason: &str| FormatError::Foreign {
        path: path.clone(),
        reason: reason.to_owned(),
    };
    let text = std::str::from_utf8(&text).map_err(|_| foreign("not text"))?;
    let version = text
        .trim_end()
        .strip_prefix(MAGIC)
        .and_then(|v| v.strip_prefix(' '))
        .ok_or_else(|| foreign("no format line"))?;
    version
        .parse()
        .map(Some)
        .map_err(|_| foreign("the version is not a number"))
}

/// Replaces `dir`'s format file atomically.
fn write(dir: &Path, version: u32) -> Result<(), FormatError> {
    replace_file(dir, FILE, format!("{MAGIC} {version}\n").as_bytes()).map_err(|e| {
        FormatError::Io {
            path: dir.join(FILE),
            what: "write",
            source: std::io::Error::other(e.to_string()),
        }
    })
}

/// Copies `from` (without its lock file) to `to`: into a temporary
/// directory first, every file synced, then renamed.
fn copy_dir(from: &Path, to: &Path) -> Result<(), FormatError> {
    let tmp = to.with_extension("tmp");
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(io(&tmp, "remove"))?;
    }
    copy_tree(from, &tmp)?;
    fs::rename(&tmp, to).map_err(io(to, "rename"))?;
    if let Some(parent) = to.parent() {
        let _ = sync_dir(parent);
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), FormatError> {
    fs::create_dir_all(to).map_err(io(to, "create"))?;
    for entry in fs::read_dir(from).map_err(io(from, "read directory"))? {
        let entry = entry.map_err(io(from, "read directory"))?;
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let kind = entry.file_type().map_err(io(&src, "stat"))?;
        if entry.file_name() == "LOCK" {
            continue;
        }
        if kind.is_dir() {
            copy_tree(&src, &dst)?;
        } else if kind.is_file() {
            fs::copy(&src, &dst).map_err(io(&src, "copy"))?;
            fs::File::open(&dst)
                .and_then(|f| f.sync_all())
                .map_err(io(&dst, "sync"))?;
        }
    }
    sync_dir(to).map_err(|e| FormatError::Foreign {
        path: to.to_owned(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            let p = std::env::temp_dir().join(format!(
                "idem-format-{name}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = fs::remove_dir_all(&p);
            let _ = fs::remove_dir_all(backup_path(&p, 1));
            fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
            for v in 0..4 {
                let _ = fs::remove_dir_all(backup_path(&self.0, v));
            }
        }
    }

    fn version(dir: &Path) -> Option<u32> {
        read(dir).unwrap()
    }

    #[test]
    fn a_new_directory_is_marked_and_a_current_one_left_alone() {
        let d = TempDir::new("new");
        assert_eq!(prepare(&d.0).unwrap(), Prepared::Created);
        assert_eq!(version(&d.0), Some(DATA_FORMAT));
        assert_eq!(prepare(&d.0).unwrap(), Prepared::Current);
    }

    #[test]
    fn a_directory_of_the_first_release_is_format_1() {
        let d = TempDir::new("legacy");
        fs::create_dir_all(d.0.join("log")).unwrap();
        assert_eq!(prepare_with(&d.0, 1, &[]).unwrap(), Prepared::Current);
        assert_eq!(version(&d.0), Some(1));
    }

    #[test]
    fn newer_and_foreign_formats_are_refused() {
        let d = TempDir::new("newer");
        write(&d.0, DATA_FORMAT + 1).unwrap();
        let e = prepare(&d.0).unwrap_err();
        assert!(matches!(e, FormatError::Newer { found, .. } if found == DATA_FORMAT + 1));
        assert!(e.to_string().contains("newer than this idemd reads"), "{e}");
        fs::write(d.0.join(FILE), b"something else 1\n").unwrap();
        let e = prepare(&d.0).unwrap_err();
        assert!(matches!(e, FormatError::Foreign { .. }), "{e}");
        fs::write(d.0.join(FILE), format!("{MAGIC} x\n")).unwrap();
        assert!(matches!(
            prepare(&d.0).unwrap_err(),
            FormatError::Foreign { .. }
        ));
    }

    fn step_1(dir: &Path) -> Result<(), String> {
        let old = fs::read_to_string(dir.join("log/data")).map_err(|e| e.to_string())?;
        fs::write(dir.join("log/data"), old.replace("v1", "v2")).map_err(|e| e.to_string())?;
        fs::write(dir.join("steps"), "1").map_err(|e| e.to_string())
    }

    fn step_2(dir: &Path) -> Result<(), String> {
        let done = fs::read_to_string(dir.join("steps")).map_err(|e| e.to_string())?;
        fs::write(dir.join("steps"), format!("{done}2")).map_err(|e| e.to_string())
    }

    fn failing(_: &Path) -> Result<(), String> {
        Err("disk on fire".into())
    }

    /// Step 1, then `second` from version 2.
    fn two_steps(second: fn(&Path) -> Result<(), String>) -> [Step; 2] {
        [
            Step {
                from: 1,
                run: step_1,
            },
            Step {
                from: 2,
                run: second,
            },
        ]
    }

    fn old_dir(name: &str) -> TempDir {
        let d = TempDir::new(name);
        fs::create_dir_all(d.0.join("log")).unwrap();
        fs::write(d.0.join("log/data"), "records v1").unwrap();
        fs::write(d.0.join("LOCK"), "").unwrap();
        d
    }

    #[test]
    fn an_older_directory_is_copied_then_migrated_step_by_step() {
        let d = old_dir("migrate");
        let steps = two_steps(step_2);
        let done = prepare_with(&d.0, 3, &steps).unwrap();
        let backup = backup_path(&d.0, 1);
        assert_eq!(
            done,
            Prepared::Migrated {
                from: 1,
                backup: backup.clone()
            }
        );
        assert_eq!(version(&d.0), Some(3));
        assert_eq!(fs::read_to_string(d.0.join("steps")).unwrap(), "12");
        assert_eq!(
            fs::read_to_string(d.0.join("log/data")).unwrap(),
            "records v2"
        );
        // The copy is the directory as it was (without its lock).
        assert_eq!(
            fs::read_to_string(backup.join("log/data")).unwrap(),
            "records v1"
        );
        assert!(!backup.join("LOCK").exists());
        assert!(!backup.join("steps").exists());
        assert_eq!(prepare_with(&d.0, 3, &steps).unwrap(), Prepared::Current);
    }

    #[test]
    fn a_failed_step_names_the_backup_and_resumes_where_it_stopped() {
        let d = old_dir("fail");
        let broken = two_steps(failing);
        let e = prepare_with(&d.0, 3, &broken).unwrap_err();
        let backup = backup_path(&d.0, 1);
        assert!(e.to_string().contains(&backup.display().to_string()), "{e}");
        assert!(e.to_string().contains("format 2 to 3"), "{e}");
        // Step 1 is recorded as done; the backup is of version 1.
        assert_eq!(version(&d.0), Some(2));
        let fixed = two_steps(step_2);
        let done = prepare_with(&d.0, 3, &fixed).unwrap();
        assert_eq!(
            done,
            Prepared::Migrated {
                from: 2,
                backup: backup_path(&d.0, 2)
            }
        );
        assert_eq!(fs::read_to_string(d.0.join("steps")).unwrap(), "12");
        assert_eq!(
            fs::read_to_string(backup.join("log/data")).unwrap(),
            "records v1"
        );
    }

    #[test]
    fn a_version_without_a_step_is_refused() {
        let d = old_dir("nostep");
        let e = prepare_with(&d.0, 2, &[]).unwrap_err();
        assert!(matches!(e, FormatError::NoStep { from: 1, .. }), "{e}");
    }
}
