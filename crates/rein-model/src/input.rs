//! Reading input files with a bound: a configuration, scenario, trace or instance path may name a file
//! of any size, or a device that never ends (`/dev/zero`), and reading it whole would take all the
//! memory. [`read_bounded`] reads at most `max` bytes and refuses a longer file; the size the file system
//! states is not trusted (a device or a pipe states 0).

use std::io::Read;
use std::path::Path;

/// The file at `path`, if it holds at most `max` bytes; a longer one is an error of kind
/// `FileTooLarge` saying the bound (callers name the file).
pub fn read_bounded(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
