//! The layout file (`layout_file` in gw.toml): the layout each volume's data was written in, so that a
//! start with a gw.toml that lays a volume out otherwise is refused instead of scrambling its data.
//!
//! # Why
//! A volume's layout is its stripe unit and its nodes in gw.toml's order, with their widths and node
//! exports (docs/gateway.md, "Layout"), and gw.toml is its only record: with `[[nodes]]` reordered, a
//! width or `stripe_kb` changed, or a node renamed, the next start reads every unit from another place
//! (the VM sees garbage, and its writes land over other units). A reload refuses or names such a change
//! and keeps the running layout (the module comment of [`super`], "Reload"); a restart cannot know, unless
//! the layout was recorded.
//!
//! # Model
//! JSON, version 1: each volume's layout, the nodes it uses in layout order (a node by name: one moved to
//! another address keeps its data):
//!
//! ```json
//! {"version": 1, "volumes": {"v": {"unit": 65536, "nodes": [{"node": "s1", "export": "v", "width": 1}]}}}
//! ```
//!
//! - At start, and with `--check-config`, each volume of gw.toml that has a record must have that layout,
//!   or the start fails, naming every volume that differs with both layouts ([`differences`]).
//! - Once the volumes are open, and after each reload, the file is written whole ([`crate::durable`])
//!   with the layouts the volumes run: a volume the configuration no longer has loses its record (its data
//!   is no longer the gateway's), and one whose layout a reload left as it runs keeps the running one.
//!
//! # Bounds
//! At most [`MAX_FILE_BYTES`] are read; at most [`super::MAX_VOLUMES`] volumes of at most
//! [`super::MAX_NODES`] nodes, widths summing to at most [`MAX_ROUND_UNITS`], names as NBD allows. A file
//! that does not parse or breaks a bound is one error naming the file and what is wrong, and the start
//! fails (remove the file to record the layouts anew).

use rein_model::stripe::MAX_ROUND_UNITS;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The version written and read.
pub const VERSION: u32 = 1;
/// Most bytes read and written: every layout a gw.toml can hold fits (at most
/// [`super::MAX_NODE_SESSIONS`] volume-node pairs, each a node name of at most 255 bytes and an export
/// name of at most 4,096, about 4.5 KB written out: 73 MB).
pub const MAX_FILE_BYTES: u64 = 128 << 20;

/// One node of a layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayoutNode {
    /// The node's name (`[[nodes]] name`).
    pub node: String,
    /// The export on the node that holds the volume's units.
    pub export: String,
    /// Units per round on the node (at least 1).
    pub width: u32,
}

/// A volume's layout: its unit and the nodes it uses, in layout order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layout {
    /// Bytes per stripe unit.
    pub unit: u64,
    /// The nodes used, in layout order.
    pub nodes: Vec<LayoutNode>,
}

impl Layout {
    /// The layout in words: `64 KiB units over s1 (export v, width 1), s2 (export v, width 2)`.
    pub fn describe(&self) -> String {
        let nodes: Vec<String> =
            self.nodes.iter().map(|n| format!("{} (export {:?}, width {})", n.node, n.export, n.width)).collect();
        let unit = if self.unit.is_multiple_of(1024) {
            format!("{} KiB", self.unit >> 10)
        } else {
            format!("{} B", self.unit)
        };
        format!("{unit} units over {}", nodes.join(", "))
    }

    fn check(&self) -> Result<(), LayoutError> {
        if self.unit == 0 || self.unit > 1 << 30 {
            return Err(LayoutError::Unit { got: self.unit });
        }
        if self.nodes.is_empty() || self.nodes.len() > super::MAX_NODES {
            return Err(LayoutError::NodeCount { got: self.nodes.len() });
        }
        let mut sum = 0u64;
        for (i, n) in self.nodes.iter().enumerate() {
            if n.node.is_empty() || n.node.len() > rein_proto::nbd::MAX_NAME_LEN {
                return Err(LayoutError::NodeName { index: i });
            }
            if n.export.len() > rein_proto::nbd::MAX_NAME_LEN {
                return Err(LayoutError::ExportName { node: n.node.clone() });
            }
            if n.width == 0 {
                return Err(LayoutError::ZeroWidth { node: n.node.clone() });
            }
            if self.nodes[..i].iter().any(|o| o.node == n.node) {
                return Err(LayoutError::Repeated { node: n.node.clone() });
            }
            sum += u64::from(n.width);
        }
        if sum > MAX_ROUND_UNITS {
            return Err(LayoutError::WidthSum { sum });
        }
        Ok(())
    }
}

/// What is wrong with one volume's layout in the file ([`LayoutFileError::Volume`] names the volume).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// A stripe unit outside 1 byte..=1 GiB.
    #[error("unit must be in 1..=1073741824 bytes, got {got}")]
    Unit {
        /// The unit given.
        got: u64,
    },
    /// No node, or more than [`super::MAX_NODES`].
    #[error("1..={} nodes, got {got}", super::MAX_NODES)]
    NodeCount {
        /// The nodes listed.
        got: usize,
    },
    /// A node name empty or longer than NBD allows.
    #[error("node {index}: a name of 1..={} bytes", rein_proto::nbd::MAX_NAME_LEN)]
    NodeName {
        /// The node's position in the layout.
        index: usize,
    },
    /// An export name longer than NBD allows.
    #[error("node {node}: an export name of at most {} bytes", rein_proto::nbd::MAX_NAME_LEN)]
    ExportName {
        /// The node.
        node: String,
    },
    /// A node of width 0.
    #[error("node {node}: width 0 (a layout lists only the nodes it uses)")]
    ZeroWidth {
        /// The node.
        node: String,
    },
    /// A node listed twice.
    #[error("node {node} listed twice")]
    Repeated {
        /// The node.
        node: String,
    },
    /// Widths summing past [`MAX_ROUND_UNITS`].
    #[error("the widths sum to {sum}, past {MAX_ROUND_UNITS}")]
    WidthSum {
        /// Their sum.
        sum: u64,
    },
}

/// What is wrong with a layout file's bytes ([`parse`]; the caller names the file).
#[derive(Debug, thiserror::Error)]
pub enum LayoutFileError {
    /// Not JSON of the file's schema.
    #[error("{0}")]
    Json(#[source] serde_json::Error),
    /// Another version than [`VERSION`].
    #[error("version {got} (this gateway reads version {VERSION})")]
    Version {
        /// The version in the file.
        got: u32,
    },
    /// More volumes than [`super::MAX_VOLUMES`].
    #[error("{count} volumes, past {}", super::MAX_VOLUMES)]
    Volumes {
        /// The volumes in the file.
        count: usize,
    },
    /// A volume name empty or longer than NBD allows.
    #[error("a volume name of 1..={} bytes", rein_proto::nbd::MAX_NAME_LEN)]
    VolumeName {
        /// The name given.
        name: String,
    },
    /// A volume's layout breaks a bound.
    #[error("volume {name}: {error}")]
    Volume {
        /// The volume.
        name: String,
        /// What is wrong with its layout.
        #[source]
        error: LayoutError,
    },
}

/// Why [`read`] could not give the layout file's record (a missing file is no error).
#[derive(Debug, thiserror::Error)]
pub enum LayoutReadError {
    /// The file is there but cannot be read.
    #[error("layout_file {}: cannot read it: {error}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The operating system's error.
        #[source]
        error: std::io::Error,
    },
    /// The file does not parse or breaks a bound; the message says how to go on.
    #[error("layout_file {}: {error} (fix it, or remove it to record the running layouts anew)", path.display())]
    Invalid {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        #[source]
        error: LayoutFileError,
    },
}

/// The file's contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayoutFile {
    /// [`VERSION`].
    pub version: u32,
    /// Each volume's layout, by the volume's name.
    pub volumes: BTreeMap<String, Layout>,
}

/// Parses and checks a layout file's bytes; the error says what is wrong (the caller names the file).
pub fn parse(bytes: &[u8]) -> Result<LayoutFile, LayoutFileError> {
    let f: LayoutFile = serde_json::from_slice(bytes).map_err(LayoutFileError::Json)?;
    if f.version != VERSION {
        return Err(LayoutFileError::Version { got: f.version });
    }
    if f.volumes.len() > super::MAX_VOLUMES {
        return Err(LayoutFileError::Volumes { count: f.volumes.len() });
    }
    for (name, l) in &f.volumes {
        if name.is_empty() || name.len() > rein_proto::nbd::MAX_NAME_LEN {
            return Err(LayoutFileError::VolumeName { name: name.clone() });
        }
        l.check().map_err(|error| LayoutFileError::Volume { name: name.clone(), error })?;
    }
    Ok(f)
}

/// Reads the layout file at `path`: `None` if there is none yet; an error naming the file otherwise.
pub fn read(path: &Path) -> Result<Option<LayoutFile>, LayoutReadError> {
    match crate::durable::read(path, MAX_FILE_BYTES) {
        Ok(bytes) => parse(&bytes).map(Some).map_err(|error| LayoutReadError::Invalid { path: path.into(), error }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(LayoutReadError::Read { path: path.into(), error }),
    }
}

/// Why the layouts could not be recorded ([`write()`]; the gateway's writer thread, which can stop).
#[derive(Debug, thiserror::Error)]
pub enum LayoutWriteError {
    /// The file would be longer than a start reads ([`MAX_FILE_BYTES`]).
    #[error("layout_file: {bytes} bytes of layouts, past the {max} a start reads")]
    TooLarge {
        /// The file's length as written.
        bytes: u64,
        /// The longest a start reads ([`MAX_FILE_BYTES`]).
        max: u64,
    },
    /// The file cannot be written; the error names it, the step and the operating system's error.
    #[error("layout_file: {0}")]
    Write(#[source] crate::durable::WriteError),
    /// The thread that writes it stopped before it answered (it panicked, or the runtime shut down).
    #[error("layout_file: the writer stopped: {0}")]
    WriterStopped(#[source] tokio::task::JoinError),
}

/// Writes `volumes` as the layout file at `path`, whole ([`crate::durable::write`]).
pub fn write(path: &Path, volumes: BTreeMap<String, Layout>) -> Result<(), LayoutWriteError> {
    let f = LayoutFile { version: VERSION, volumes };
    let mut bytes = serde_json::to_vec_pretty(&f).expect("a layout file serialises");
    bytes.push(b'\n');
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(LayoutWriteError::TooLarge { bytes: bytes.len() as u64, max: MAX_FILE_BYTES });
    }
    crate::durable::write(path, &bytes).map_err(LayoutWriteError::Write)
}

/// The answer of the thread that writes the layouts (`writer`, a blocking task around [`write()`]); one
/// that stopped before it answered (it panicked, or the runtime shut down) is
/// [`LayoutWriteError::WriterStopped`].
pub(crate) async fn writer_answer<T>(
    writer: tokio::task::JoinHandle<Result<T, LayoutWriteError>>,
) -> Result<T, LayoutWriteError> {
    writer.await.unwrap_or_else(|e| Err(LayoutWriteError::WriterStopped(e)))
}

/// The volumes of `now` whose layout differs from their record in `recorded`, one line each with both
/// layouts; volumes without a record are not named.
pub fn differences<'a>(
    recorded: &LayoutFile,
    now: impl IntoIterator<Item = (&'a str, Layout)>,
    file: &std::path::Path,
) -> Vec<String> {
    now.into_iter()
        .filter_map(|(name, layout)| {
            let old = recorded.volumes.get(name)?;
            (*old != layout).then(|| {
                format!(
                    "export {name}: {} lays it out as {}, its data was written as {}",
                    file.display(),
                    layout.describe(),
                    old.describe()
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layout writer that panics before it answers is [`LayoutWriteError::WriterStopped`], its message
    /// naming the file's key, the stop and the panic once; one that answers is its answer.
    #[tokio::test]
    async fn a_writer_that_panics_is_a_stopped_writer() {
        let panics = tokio::task::spawn_blocking(|| -> Result<(), LayoutWriteError> { panic!("the disk went away") });
        let e = writer_answer(panics).await.unwrap_err();
        assert!(matches!(&e, LayoutWriteError::WriterStopped(j) if j.is_panic()), "{e:?}");
        let text = e.to_string();
        assert!(text.starts_with("layout_file: the writer stopped: task "), "{text}");
        assert!(text.ends_with(" panicked with message \"the disk went away\""), "{text}");
        assert_eq!(text.matches("layout_file").count(), 1, "{text}");
        let answers = tokio::task::spawn_blocking(|| Ok::<_, LayoutWriteError>(7));
        assert_eq!(writer_answer(answers).await.unwrap(), 7);
        let too_large = tokio::task::spawn_blocking(|| Err::<(), _>(LayoutWriteError::TooLarge { bytes: 2, max: 1 }));
        assert!(matches!(writer_answer(too_large).await, Err(LayoutWriteError::TooLarge { bytes: 2, max: 1 })));
    }

    fn layout(nodes: &[(&str, u32)]) -> Layout {
        Layout {
            unit: 65536,
            nodes: nodes.iter().map(|&(n, w)| LayoutNode { node: n.into(), export: "v".into(), width: w }).collect(),
        }
    }

    #[test]
    fn a_file_round_trips_and_bad_ones_are_named() {
        let f = LayoutFile { version: VERSION, volumes: BTreeMap::from([("v".to_string(), layout(&[("s1", 1)]))]) };
        let text = serde_json::to_vec(&f).unwrap();
        assert_eq!(parse(&text).unwrap(), f);
        let bad = |json: &str| parse(json.as_bytes()).unwrap_err().to_string();
        assert!(bad(r#"{"version": 2, "volumes": {}}"#).contains("version 2"));
        assert!(bad(r#"{"version": 1, "volumes": {}, "x": 1}"#).contains("unknown field"));
        let v = |nodes: &str| format!(r#"{{"version": 1, "volumes": {{"v": {{"unit": 4096, "nodes": [{nodes}]}}}}}}"#);
        assert!(bad(&v("")).contains("volume v: 1..=256 nodes, got 0"));
        assert!(bad(&v(r#"{"node": "s1", "export": "v", "width": 0}"#)).contains("width 0"));
        let twice = r#"{"node": "s1", "export": "v", "width": 1}, {"node": "s1", "export": "w", "width": 1}"#;
        assert!(bad(&v(twice)).contains("node s1 listed twice"));
        assert!(bad(&v(r#"{"node": "s1", "export": "v", "width": 5000}"#)).contains("past 4096"));
        assert!(bad("not json").contains("expected"));
    }

    /// Each refusal of a layout file is its variant, carrying the volume, node or value; the messages are
    /// those of the `String` error (strings checked against it), the file's name and its cause once.
    #[test]
    fn layout_file_refusals_are_typed() {
        let bad = |json: &str| parse(json.as_bytes()).unwrap_err();
        let e = bad(r#"{"version": 2, "volumes": {}}"#);
        assert!(matches!(e, LayoutFileError::Version { got: 2 }), "{e:?}");
        assert_eq!(e.to_string(), "version 2 (this gateway reads version 1)");
        let e = bad("not json");
        assert!(matches!(e, LayoutFileError::Json(_)), "{e:?}");
        assert_eq!(e.to_string(), "expected ident at line 1 column 2");
        let e = bad(r#"{"version": 1, "volumes": {"": {"unit": 4096, "nodes": []}}}"#);
        assert!(matches!(&e, LayoutFileError::VolumeName { name } if name.is_empty()), "{e:?}");
        assert_eq!(e.to_string(), "a volume name of 1..=4096 bytes");
        let v = |nodes: &str| format!(r#"{{"version": 1, "volumes": {{"v": {{"unit": 4096, "nodes": [{nodes}]}}}}}}"#);
        let volume = |json: &str| match bad(json) {
            LayoutFileError::Volume { name, error } if name == "v" => error,
            other => panic!("not a volume's refusal: {other:?}"),
        };
        assert_eq!(volume(&v("")), LayoutError::NodeCount { got: 0 });
        let e = volume(&v(r#"{"node": "", "export": "v", "width": 1}"#));
        assert_eq!(
            (e.clone(), e.to_string()),
            (LayoutError::NodeName { index: 0 }, "node 0: a name of 1..=4096 bytes".into())
        );
        let e = volume(&v(r#"{"node": "s1", "export": "v", "width": 0}"#));
        assert_eq!(e, LayoutError::ZeroWidth { node: "s1".into() });
        assert_eq!(e.to_string(), "node s1: width 0 (a layout lists only the nodes it uses)");
        let twice = r#"{"node": "s1", "export": "v", "width": 1}, {"node": "s1", "export": "w", "width": 1}"#;
        assert_eq!(volume(&v(twice)), LayoutError::Repeated { node: "s1".into() });
        let e = volume(&v(r#"{"node": "s1", "export": "v", "width": 5000}"#));
        assert_eq!(
            (e.clone(), e.to_string()),
            (LayoutError::WidthSum { sum: 5000 }, "the widths sum to 5000, past 4096".into())
        );
        let e = bad(r#"{"version": 1, "volumes": {"v": {"unit": 0, "nodes": []}}}"#);
        assert_eq!(e.to_string(), "volume v: unit must be in 1..=1073741824 bytes, got 0");
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("layouts.json");
        std::fs::write(&path, r#"{"version": 2, "volumes": {}}"#).unwrap();
        let e = read(&path).unwrap_err();
        assert!(matches!(&e, LayoutReadError::Invalid { error: LayoutFileError::Version { got: 2 }, .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!(
                "layout_file {}: version 2 (this gateway reads version 1) (fix it, or remove it to record the running \
                 layouts anew)",
                path.display()
            )
        );
        let e = read(tmp.path()).unwrap_err();
        assert!(matches!(&e, LayoutReadError::Read { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!(
                "layout_file {}: cannot read it: it is a directory, not a regular file, so it is not read",
                tmp.path().display()
            )
        );
    }

    /// A layout file that cannot be written names the file, the step and the cause once, after
    /// `layout_file: `; one written is read back as it was.
    #[test]
    fn a_layout_file_that_cannot_be_written_is_named_once() {
        let tmp = tempfile::tempdir().unwrap();
        let volumes = BTreeMap::from([("v".to_string(), layout(&[("s1", 1)]))]);
        let path = tmp.path().join("missing").join("layouts.json");
        let e = write(&path, volumes.clone()).unwrap_err();
        assert!(matches!(&e, LayoutWriteError::Write(w) if w.path == path), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!(
                "layout_file: writing {}: creating a temporary file beside it: {}",
                path.display(),
                std::io::Error::from_raw_os_error(libc::ENOENT)
            )
        );
        let e = LayoutWriteError::TooLarge { bytes: MAX_FILE_BYTES + 1, max: MAX_FILE_BYTES };
        assert_eq!(e.to_string(), "layout_file: 134217729 bytes of layouts, past the 134217728 a start reads");
        let path = tmp.path().join("layouts.json");
        write(&path, volumes.clone()).unwrap();
        assert_eq!(read(&path).unwrap().map(|f| f.volumes), Some(volumes));
    }

    #[test]
    fn differences_name_the_volumes_that_changed_with_both_layouts() {
        let recorded = LayoutFile {
            version: VERSION,
            volumes: BTreeMap::from([
                ("a".to_string(), layout(&[("s1", 1), ("s2", 1)])),
                ("b".to_string(), layout(&[("s1", 1)])),
            ]),
        };
        let now = [("a", layout(&[("s2", 1), ("s1", 1)])), ("b", layout(&[("s1", 1)])), ("c", layout(&[("s3", 1)]))];
        assert_eq!(
            differences(&recorded, now, std::path::Path::new("gw.toml")),
            ["export a: gw.toml lays it out as 64 KiB units over s2 (export \"v\", width 1), s1 (export \"v\", width \
              1), its data was written as 64 KiB units over s1 (export \"v\", width 1), s2 (export \"v\", width 1)"]
        );
    }

    #[test]
    fn read_and_write() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("layouts.json");
        assert_eq!(read(&path).unwrap(), None, "none yet");
        let volumes = BTreeMap::from([("v".to_string(), layout(&[("s1", 2)]))]);
        write(&path, volumes.clone()).unwrap();
        assert_eq!(read(&path).unwrap().unwrap().volumes, volumes);
        std::fs::write(&path, "{").unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.starts_with(&format!("layout_file {}: ", path.display())) && e.contains("remove it"), "{e}");
    }
}
