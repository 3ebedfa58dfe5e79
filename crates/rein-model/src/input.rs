//! Reading input files with a bound: a configuration, scenario, trace or instance path may name a file
//! of any size, or a device that never ends (`/dev/zero`), and reading it whole would take all the
//! memory. [`read_bounded`] reads at most `max` bytes and refuses a longer file; the size the file system
//! states is not trusted (a device or a pipe states 0). [`parse_toml`] then reads the text as TOML with an
//! error of one line that says where.
//!
//! The simulator's inputs (a scenario, a trace) are read with [`read_text_regular`], which takes a regular
//! file only: a FIFO at the path would block the open until a writer came (for ever: `rein sim` hung),
//! and a device or a directory is no input either. The path is checked before it is opened, so a FIFO is
//! never opened, and the open file again (what the path named may have changed in between). A caller
//! that can open without blocking (rein-runtime's `durable::read`, with `O_NONBLOCK`, which this crate
//! does without: it has no libc) hands its file to [`read_regular_from`], the same check and read.

use std::io::Read;
use std::path::Path;

/// The file at `path`, if it holds at most `max` bytes; a longer one is an error of kind
/// `FileTooLarge` saying the bound (callers name the file).
pub fn read_bounded(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    read_bounded_from(std::fs::File::open(path)?, max)
}

/// [`read_bounded`] of what `r` gives (a file opened some other way).
pub fn read_bounded_from(r: impl Read, max: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    r.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::new(std::io::ErrorKind::FileTooLarge, format!("larger than {max} bytes")));
    }
    Ok(bytes)
}

/// Bytes read as UTF-8 text (an error of kind `InvalidData` otherwise).
pub fn text(bytes: Vec<u8>) -> std::io::Result<String> {
    String::from_utf8(bytes)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not UTF-8 text: {e}")))
}

/// The regular file at `path` (a link followed), if it holds at most `max` bytes ([`read_bounded`]'s
/// bound). Anything else (a FIFO, a device, a directory) is an error of kind `InvalidInput` naming what
/// it is ([`not_a_file`]), before it is opened (module comment).
pub fn read_regular(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(not_a_file(meta.file_type(), "so it is not read"));
    }
    read_regular_from(std::fs::File::open(path)?, max)
}

/// [`read_regular`] as UTF-8 text (an error of kind `InvalidData` otherwise).
pub fn read_text_regular(path: &Path, max: u64) -> std::io::Result<String> {
    text(read_regular(path, max)?)
}

/// [`read_bounded_from`] of an open `file` that must be a regular file (checked on the open file: of kind
/// `InvalidInput` otherwise, before a byte is read).
pub fn read_regular_from(file: std::fs::File, max: u64) -> std::io::Result<Vec<u8>> {
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_a_file(meta.file_type(), "so it is not read"));
    }
    read_bounded_from(file, max)
}

/// The error (of kind `InvalidInput`) for a path that names `t`, something other than a regular file,
/// naming what it is: `it is a FIFO, not a regular file, <then>`.
pub fn not_a_file(t: std::fs::FileType, then: &str) -> std::io::Error {
    let what = if t.is_dir() { "a directory" } else { special(t) };
    std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("it is {what}, not a regular file, {then}"))
}

#[cfg(unix)]
fn special(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "something else"
    }
}

#[cfg(not(unix))]
fn special(_: std::fs::FileType) -> &'static str {
    "something else"
}

/// A configuration file's or scenario's `text` as `T`, for the daemons (`rein serve`, `rein gateway`,
/// the pShift controller) and the simulator's scenarios alike. The error ([`TomlError`]) is one line (a
/// reload's failure is one log line too): where, by line and column (1-based, the column in characters),
/// then the parser's message and the line's first 80 characters, e.g. `line 3, column 13: invalid type:
/// string "yes", expected a boolean (in `admin_tls = "yes"`)`. An error the parser places nowhere is its
/// message alone. A message of several lines (a syntax error's: `invalid array` and `expected `]``) is
/// joined into one with "; ".
pub fn parse_toml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, TomlError> {
    toml::from_str(text).map_err(|e| {
        let message = e.message().lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ");
        match e.span() {
            Some(span) => {
                let start = (0..=span.start.min(text.len())).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
                let before = &text[..start];
                let line = before.matches('\n').count() + 1;
                let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
                // The line itself (a type error's message names no key), shortened.
                let at = text[before.rfind('\n').map_or(0, |i| i + 1)..].lines().next().unwrap_or("").trim();
                let shown = match at.char_indices().nth(SHOWN_CHARS) {
                    Some((cut, _)) => format!("{} ...", &at[..cut]),
                    None => at.to_string(),
                };
                TomlError::At { line, column, message, shown }
            }
            None => TomlError::Nowhere { message },
        }
    })
}

/// Why [`parse_toml`] refused a text: the TOML parser's message, placed where it can be. Its message is
/// one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TomlError {
    /// The parser places the error: ``line 3, column 13: MESSAGE (in `LINE`)``, without the parenthesis
    /// when the line is blank.
    #[error("line {line}, column {column}: {message}{}", in_line(shown))]
    At {
        /// The line (1-based).
        line: usize,
        /// The column (1-based, in characters).
        column: usize,
        /// The parser's message (TOML syntax, an unknown or missing field, a wrong type).
        message: String,
        /// The offending line, trimmed, its first 80 characters and ` ...` if it is longer (empty for a
        /// blank line).
        shown: String,
    },
    /// The parser places the error nowhere (a missing field of the whole text): its message alone.
    #[error("{message}")]
    Nowhere {
        /// The parser's message.
        message: String,
    },
}

/// [`TomlError::At`]'s tail: `` (in `LINE`)``, or nothing for a blank line.
fn in_line(shown: &str) -> String {
    if shown.is_empty() {
        String::new()
    } else {
        format!(" (in `{shown}`)")
    }
}

/// Characters of the offending line that [`parse_toml`]'s error shows.
const SHOWN_CHARS: usize = 80;

#[cfg(test)]
mod tests {
    use super::*;

    /// What the TOML tests parse: a name and an optional size, nothing else.
    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct T {
        name: String,
        size: Option<u32>,
    }

    /// The error says the line and the column (in characters, 1-based) on one line.
    #[test]
    fn a_toml_error_says_where_on_one_line() {
        let e = parse_toml::<T>("name = \"é\"\nsize = \"x\"").unwrap_err().to_string();
        assert!(e.starts_with("line 2, column 8: invalid type: string \"x\""), "{e}");
        assert!(e.ends_with(" (in `size = \"x\"`)"), "the key, which the message does not name: {e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        let long = format!("name = \"a\"\nsize = \"{}\"", "é".repeat(200));
        let e = parse_toml::<T>(&long).unwrap_err().to_string();
        assert!(e.ends_with(&format!("(in `size = \"{} ...`)", "é".repeat(72))), "{e}");
        let e = parse_toml::<T>("name = \"a\"\n\ncolour = 1").unwrap_err().to_string();
        assert!(e.starts_with("line 3, column 1: unknown field `colour`"), "{e}");
        assert_eq!(parse_toml::<T>("name = \"é\"").unwrap().name, "é");
    }

    /// [`TomlError`] carries where and what; its message is the one line `parse_toml` gave as a `String`
    /// before it was typed (the strings below are that function's output).
    #[test]
    fn a_toml_error_is_typed_with_its_place_and_says_the_same_line() {
        let e = parse_toml::<T>("name = \"a\"\nsize = -1").unwrap_err();
        assert!(
            matches!(&e, TomlError::At { line: 2, column: 8, message, shown } if message.starts_with("invalid value") && shown == "size = -1"),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "line 2, column 8: invalid value: integer `-1`, expected u32 (in `size = -1`)");
        // A missing field is placed at the start of its table.
        let e = parse_toml::<T>("size = 1").unwrap_err();
        assert!(matches!(&e, TomlError::At { line: 1, column: 1, .. }), "{e:?}");
        assert_eq!(e.to_string(), "line 1, column 1: missing field `name` (in `size = 1`)");
        // Placed on a blank line (an array the text never closes): no parenthesis.
        let e = parse_toml::<T>("name = [1,\n").unwrap_err();
        assert!(matches!(&e, TomlError::At { line: 2, column: 1, shown, .. } if shown.is_empty()), "{e:?}");
        assert!(e.to_string().starts_with("line 2, column 1: invalid array"), "{e}");
        assert!(!e.to_string().contains("(in `"), "{e}");
        // The parser's two lines (`invalid array`, then what it expected) as one: a reload's log line.
        assert_eq!(e.to_string(), "line 2, column 1: invalid array; expected `]`");
        // An error the parser places nowhere (none of the texts above) is its message alone.
        assert_eq!(TomlError::Nowhere { message: "missing field `name`".into() }.to_string(), "missing field `name`");
    }

    /// A FIFO at a scenario's or trace's path hung `rein sim` in its open (no writer ever comes): refused
    /// before it is opened, naming what it is, as a directory and a device are; a file and a link to one
    /// are read up to the bound.
    #[cfg(unix)]
    #[test]
    fn only_a_regular_file_is_read_and_a_fifo_is_never_opened() {
        // Removed when dropped, also when an assertion fails.
        let tmp = tempfile::Builder::new().prefix("rein-model-regular-").tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let fifo = dir.join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        // Run apart, so a regression fails the test rather than hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        let f = fifo.clone();
        std::thread::spawn(move || tx.send(read_text_regular(&f, 10).map_err(|e| (e.kind(), e.to_string()))));
        let got = rx.recv_timeout(std::time::Duration::from_secs(10));
        if got.is_err() {
            // Free the thread stuck in its open (a writer pairs with it), then fail.
            let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
        }
        let e = got.expect("read_text_regular returned: it did not wait on the FIFO").unwrap_err();
        assert_eq!(e, (std::io::ErrorKind::InvalidInput, "it is a FIFO, not a regular file, so it is not read".into()));
        assert!(read_regular(&dir, 10).unwrap_err().to_string().contains("it is a directory"));
        assert!(read_regular(Path::new("/dev/zero"), 10).unwrap_err().to_string().contains("it is a device"));
        let file = dir.join("f");
        std::fs::write(&file, "0123456789").unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_text_regular(&link, 10).unwrap(), "0123456789");
        assert_eq!(read_regular(&file, 9).unwrap_err().kind(), std::io::ErrorKind::FileTooLarge);
    }

    #[test]
    fn a_file_is_read_up_to_its_bound_and_refused_beyond() {
        // Removed when dropped, also when an assertion fails.
        let tmp = tempfile::Builder::new().prefix("rein-model-input-").tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let p = dir.join("f");
        std::fs::write(&p, "0123456789").unwrap();
        assert_eq!(text(read_bounded(&p, 10).unwrap()).unwrap(), "0123456789");
        let e = read_bounded(&p, 9).unwrap_err();
        assert_eq!((e.kind(), e.to_string()), (std::io::ErrorKind::FileTooLarge, "larger than 9 bytes".into()));
        std::fs::write(&p, [0xff, 0xfe]).unwrap();
        assert_eq!(text(read_bounded(&p, 10).unwrap()).unwrap_err().kind(), std::io::ErrorKind::InvalidData);
        // A device that never ends (its stated size is 0): refused at the bound, not read for ever.
        if Path::new("/dev/zero").exists() {
            assert_eq!(
                read_bounded(Path::new("/dev/zero"), 1 << 20).unwrap_err().kind(),
                std::io::ErrorKind::FileTooLarge
            );
        }
    }
}
