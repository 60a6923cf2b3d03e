//! Mapping absolute sandbox paths into a sandbox's directory on the host.

use std::path::{Component, Path, PathBuf};

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PathError {
    #[error("path {0:?} is not absolute")]
    NotAbsolute(String),
    #[error("path {0:?} escapes the sandbox")]
    Escapes(String),
}

/// `/work/a.py` → `<fs>/work/a.py`. `fs` must be canonical. `..` is refused outright rather than
/// resolved, and the deepest existing ancestor is canonicalized so a symlink a sandbox process
/// planted cannot lead outside either.
pub(crate) fn resolve(fs: &Path, sandbox_path: &str) -> Result<PathBuf, PathError> {
    let path = Path::new(sandbox_path);
    if !path.is_absolute() {
        return Err(PathError::NotAbsolute(sandbox_path.to_owned()));
    }
    let mut host = fs.to_path_buf();
    for component in path.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => host.push(part),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(PathError::Escapes(sandbox_path.to_owned()));
            }
        }
    }
    let existing = host
        .ancestors()
        .find(|p| p.symlink_metadata().is_ok())
        .ok_or_else(|| PathError::Escapes(sandbox_path.to_owned()))?;
    match existing.canonicalize() {
        Ok(real) if real.starts_with(fs) => Ok(host),
        _ => Err(PathError::Escapes(sandbox_path.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_inside_and_refuses_escapes() {
        let dir = tempfile::tempdir().unwrap();
        let fs = dir.path().canonicalize().unwrap();
        assert_eq!(resolve(&fs, "/work/a.py").unwrap(), fs.join("work/a.py"));
        assert_eq!(resolve(&fs, "/").unwrap(), fs);
        assert!(matches!(
            resolve(&fs, "work"),
            Err(PathError::NotAbsolute(_))
        ));
        assert!(matches!(
            resolve(&fs, "/work/../../etc/passwd"),
            Err(PathError::Escapes(_))
        ));
        std::os::unix::fs::symlink("/etc", fs.join("link")).unwrap();
        assert!(matches!(
            resolve(&fs, "/link/passwd"),
            Err(PathError::Escapes(_))
        ));
    }
}
