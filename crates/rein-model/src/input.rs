//! Reading input files with a bound: a configuration, scenario, trace or instance path may name a file
//! of any size, or a device that never ends (`/dev/zero`), and reading it whole would take all the
//! memory. [`read_bounded`] reads at most `max` bytes and refuses a longer file; the size the file system
//! states is not trusted (a device or a pipe states 0). [`parse_toml`] then reads the text as TOML with an
//! error of one line that says where.

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

/// [`read_bounded`] as UTF-8 text (an error of kind `InvalidData` otherwise).
pub fn read_text_bounded(path: &Path, max: u64) -> std::io::Result<String> {
    String::from_utf8(read_bounded(path, max)?)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not UTF-8 text: {e}")))
}

/// A configuration file's or scenario's `text` as `T`, for the daemons (`rein serve`, `rein gateway`,
/// the pShift controller) and the simulator's scenarios alike. The error is one line (a reload's failure
/// is one log line too): where, by line and column (1-based, the column in characters), then the
/// parser's message and the line's first 80 characters, e.g. `line 3, column 13: invalid type: string
/// "yes", expected a boolean (in `admin_tls = "yes"`)`. An error the parser places nowhere is its
/// message alone.
pub fn parse_toml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    toml::from_str(text).map_err(|e| {
        let message = e.message().trim();
        match e.span() {
            Some(span) => {
                let start = (0..=span.start.min(text.len())).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
                let before = &text[..start];
                let line = before.matches('\n').count() + 1;
                let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
                // The line itself (a type error's message names no key), shortened.
                let at = text[before.rfind('\n').map_or(0, |i| i + 1)..].lines().next().unwrap_or("").trim();
                let at = match at.char_indices().nth(SHOWN_CHARS) {
                    Some((cut, _)) => format!("{} ...", &at[..cut]),
                    None => at.to_string(),
                };
                if at.is_empty() {
                    format!("line {line}, column {column}: {message}")
                } else {
                    format!("line {line}, column {column}: {message} (in `{at}`)")
                }
            }
            None => message.to_string(),
        }
    })
}

/// Characters of the offending line that [`parse_toml`]'s error shows.
const SHOWN_CHARS: usize = 80;

#[cfg(test)]
mod tests {
    use super::*;

    /// The error says the line and the column (in characters, 1-based) on one line.
    #[test]
    fn a_toml_error_says_where_on_one_line() {
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct T {
            name: String,
            size: Option<u32>,
        }
        let e = parse_toml::<T>("name = \"é\"\nsize = \"x\"").unwrap_err();
        assert!(e.starts_with("line 2, column 8: invalid type: string \"x\""), "{e}");
        assert!(e.ends_with(" (in `size = \"x\"`)"), "the key, which the message does not name: {e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        let long = format!("name = \"a\"\nsize = \"{}\"", "é".repeat(200));
        let e = parse_toml::<T>(&long).unwrap_err();
        assert!(e.ends_with(&format!("(in `size = \"{} ...`)", "é".repeat(72))), "{e}");
        let e = parse_toml::<T>("name = \"a\"\n\ncolour = 1").unwrap_err();
        assert!(e.starts_with("line 3, column 1: unknown field `colour`"), "{e}");
        assert_eq!(parse_toml::<T>("name = \"é\"").unwrap().name, "é");
    }

    #[test]
    fn a_file_is_read_up_to_its_bound_and_refused_beyond() {
        let dir = std::env::temp_dir().join(format!("rein-model-input-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        std::fs::write(&p, "0123456789").unwrap();
        assert_eq!(read_text_bounded(&p, 10).unwrap(), "0123456789");
        let e = read_bounded(&p, 9).unwrap_err();
        assert_eq!((e.kind(), e.to_string()), (std::io::ErrorKind::FileTooLarge, "larger than 9 bytes".into()));
        std::fs::write(&p, [0xff, 0xfe]).unwrap();
        assert_eq!(read_text_bounded(&p, 10).unwrap_err().kind(), std::io::ErrorKind::InvalidData);
        std::fs::remove_dir_all(&dir).unwrap();
        // A device that never ends (its stated size is 0): refused at the bound, not read for ever.
        if Path::new("/dev/zero").exists() {
            assert_eq!(
                read_bounded(Path::new("/dev/zero"), 1 << 20).unwrap_err().kind(),
                std::io::ErrorKind::FileTooLarge
            );
        }
    }
}
