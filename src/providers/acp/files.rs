//! File access an operator granted an agent: ACP's `fs/read_text_file` (and
//! `fs/write_text_file` when writing is granted too), confined to one
//! directory. An agent without a grant is not offered the capability, and
//! its requests are refused all the same.
//!
//! A path is resolved with every symbolic link followed before it is
//! compared with the directory, so a link cannot lead out of it. (A link
//! swapped in between the check and the access is not guarded against: the
//! directory is the operator's, not a remote client's.)

use std::path::{Component, Path, PathBuf};

use agent_client_protocol::v1::schema::{
    ReadTextFileRequest, ReadTextFileResponse, WriteTextFileRequest, WriteTextFileResponse,
};
use agent_client_protocol::{Error, ErrorCode};
use serde_json::json;

use crate::config::AgentSpec;

/// Largest file the agent may read, in bytes.
pub const MAX_READ_BYTES: u64 = 16 * 1024 * 1024;

/// What one agent may do with the host's files.
#[derive(Debug, Clone)]
pub struct FileAccess {
    /// The granted directory, resolved.
    root: Option<PathBuf>,
    write: bool,
}

impl FileAccess {
    /// The grant of `spec`; an error if its directory cannot be resolved.
    pub fn of(spec: &AgentSpec) -> Result<Self, String> {
        let root = match &spec.files {
            Some(dir) => Some(std::fs::canonicalize(dir).map_err(|e| {
                format!(
                    "agent `{}`: file access directory `{}`: {e}",
                    spec.name,
                    dir.display()
                )
            })?),
            None => None,
        };
        Ok(Self {
            write: root.is_some() && spec.files_write,
            root,
        })
    }

    /// Whether reading is granted (what `initialize` advertises).
    pub fn can_read(&self) -> bool {
        self.root.is_some()
    }

    /// Whether writing is granted.
    pub fn can_write(&self) -> bool {
        self.write
    }

    /// The file `path` names, if it is an existing file inside the granted
    /// directory.
    pub fn resolve_read(&self, path: &Path) -> Result<PathBuf, Error> {
        let root = self.root.as_ref().ok_or_else(|| refused("reading files"))?;
        let path = absolute(path)?;
        let real = std::fs::canonicalize(path).map_err(|e| not_found(path, &e))?;
        inside(root, &real, path)?;
        Ok(real)
    }

    /// Where writing `path` writes, if that is inside the granted directory
    /// (the file may not exist yet; its directory must).
    pub fn resolve_write(&self, path: &Path) -> Result<PathBuf, Error> {
        let root = self.root.as_ref().filter(|_| self.write);
        let root = root.ok_or_else(|| refused("writing files"))?;
        let path = absolute(path)?;
        let real = match std::fs::canonicalize(path) {
            Ok(real) => real,
            Err(_) => {
                let (Some(parent), Some(Component::Normal(name))) =
                    (path.parent(), path.components().next_back())
                else {
                    return Err(bad_path(path, "does not name a file"));
                };
                let parent = std::fs::canonicalize(parent).map_err(|e| not_found(parent, &e))?;
                parent.join(name)
            }
        };
        inside(root, &real, path)?;
        Ok(real)
    }

    /// Answer `fs/read_text_file`: the file's text, or the lines asked for
    /// (`line` is 1-based).
    pub async fn read(&self, r: &ReadTextFileRequest) -> Result<ReadTextFileResponse, Error> {
        let real = self.resolve_read(&r.path)?;
        let meta = tokio::fs::metadata(&real)
            .await
            .map_err(|e| not_found(&r.path, &e))?;
        if !meta.is_file() {
            return Err(bad_path(&r.path, "is not a file"));
        }
        if meta.len() > MAX_READ_BYTES {
            return Err(bad_path(
                &r.path,
                &format!("is larger than {MAX_READ_BYTES} bytes"),
            ));
        }
        let text = tokio::fs::read_to_string(&real)
            .await
            .map_err(|e| bad_path(&r.path, &format!("cannot be read as text: {e}")))?;
        Ok(ReadTextFileResponse::new(lines(&text, r.line, r.limit)))
    }

    /// Answer `fs/write_text_file`.
    pub async fn write(&self, r: &WriteTextFileRequest) -> Result<WriteTextFileResponse, Error> {
        let real = self.resolve_write(&r.path)?;
        tokio::fs::write(&real, r.content.as_bytes())
            .await
            .map_err(|e| bad_path(&r.path, &format!("cannot be written: {e}")))?;
        Ok(WriteTextFileResponse::new())
    }
}

/// The lines `[line, line + limit)` of `text` (1-based), with their line
/// ends; all of it when neither is given.
pub fn lines(text: &str, line: Option<u32>, limit: Option<u32>) -> String {
    if line.is_none() && limit.is_none() {
        return text.to_owned();
    }
    let skip = line.map_or(0, |l| l.max(1) as usize - 1);
    let take = limit.map_or(usize::MAX, |l| l as usize);
    text.split_inclusive('\n').skip(skip).take(take).collect()
}

fn absolute(path: &Path) -> Result<&Path, Error> {
    if !path.is_absolute() {
        return Err(bad_path(path, "must be absolute"));
    }
    Ok(path)
}

fn inside(root: &Path, real: &Path, asked: &Path) -> Result<(), Error> {
    if real.starts_with(root) {
        Ok(())
    } else {
        Err(Error::invalid_params().data(json!(format!(
            "`{}` is outside the directory this agent may use",
            asked.display()
        ))))
    }
}

fn refused(what: &str) -> Error {
    Error::invalid_params().data(json!(format!(
        "{what} is not granted to this agent (the operator grants it per agent)"
    )))
}

fn bad_path(path: &Path, why: &str) -> Error {
    Error::invalid_params().data(json!(format!("`{}` {why}", path.display())))
}

fn not_found(path: &Path, e: &std::io::Error) -> Error {
    Error::new(
        ErrorCode::RESOURCE_NOT_FOUND,
        format!("`{}`: {e}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(dir: &Path, write: bool) -> FileAccess {
        let mut spec = AgentSpec::new("a", "x", vec![]);
        spec.files = Some(dir.to_owned());
        spec.files_write = write;
        FileAccess::of(&spec).expect("grant")
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tandem-files-{name}-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(d.join("root/sub")).expect("mkdir");
        std::fs::write(d.join("root/sub/a.txt"), "one\ntwo\nthree\n").expect("write");
        std::fs::write(d.join("secret.txt"), "no").expect("write");
        d
    }

    fn message(e: &Error) -> String {
        format!("{} {}", e.message, e.data.clone().unwrap_or_default())
    }

    #[test]
    fn reads_stay_inside_the_granted_directory() {
        let d = scratch("read");
        let a = access(&d.join("root"), false);
        assert!(a.resolve_read(&d.join("root/sub/a.txt")).is_ok());
        for (path, says) in [
            (d.join("secret.txt"), "outside"),
            (d.join("root/../secret.txt"), "outside"),
            (PathBuf::from("sub/a.txt"), "absolute"),
            (d.join("root/missing.txt"), "No such file"),
        ] {
            let e = a
                .resolve_read(&path)
                .expect_err(&path.display().to_string());
            assert!(message(&e).contains(says), "{path:?}: {}", message(&e));
        }
        // A link that leads out is followed, then refused.
        std::os::unix::fs::symlink(d.join("secret.txt"), d.join("root/link")).expect("link");
        let e = a.resolve_read(&d.join("root/link")).expect_err("link out");
        assert!(message(&e).contains("outside"), "{}", message(&e));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn writes_need_their_own_grant_and_stay_inside() {
        let d = scratch("write");
        let read_only = access(&d.join("root"), false);
        let e = read_only
            .resolve_write(&d.join("root/new.txt"))
            .expect_err("read-only");
        assert!(message(&e).contains("not granted"), "{}", message(&e));
        let a = access(&d.join("root"), true);
        assert!(a.can_write());
        assert!(a.resolve_write(&d.join("root/new.txt")).is_ok());
        assert!(a.resolve_write(&d.join("root/sub/a.txt")).is_ok());
        let e = a
            .resolve_write(&d.join("root/../escape.txt"))
            .expect_err("escape");
        assert!(message(&e).contains("outside"), "{}", message(&e));
        let e = a
            .resolve_write(&d.join("root/nodir/x.txt"))
            .expect_err("no dir");
        assert!(message(&e).contains("No such file"), "{}", message(&e));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn no_grant_refuses_everything() {
        let d = scratch("none");
        let a = FileAccess::of(&AgentSpec::new("a", "x", vec![])).expect("no grant");
        assert!(!a.can_read() && !a.can_write());
        let e = a.resolve_read(&d.join("root/sub/a.txt")).expect_err("read");
        assert!(message(&e).contains("not granted"), "{}", message(&e));
        let e = a.resolve_write(&d.join("root/x")).expect_err("write");
        assert!(message(&e).contains("not granted"), "{}", message(&e));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn line_and_limit_pick_lines() {
        let t = "one\ntwo\nthree\n";
        assert_eq!(lines(t, None, None), t);
        assert_eq!(lines(t, Some(2), None), "two\nthree\n");
        assert_eq!(lines(t, Some(2), Some(1)), "two\n");
        assert_eq!(lines(t, None, Some(1)), "one\n");
        assert_eq!(lines(t, Some(9), None), "");
    }
}
