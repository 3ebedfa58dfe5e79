//! The Prometheus text format's pieces that every daemon's `/metrics` shares (rein serve's admin
//! endpoint, the gateway's, the pShift controller's and a pShift server's link), kept below all of them:
//! a label value escaped as the format asks, and the samples of a scrape read back ([`samples`], for
//! `rein admin status`).

/// `s` as a label value between double quotes: backslash, double quote and line feed escaped (the text
/// exposition format's rule), so that a tenant or bucket name cannot end its label or its line.
pub(crate) fn label(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// One sample of a scrape: its name, its labels in their order, its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series' name.
    pub name: String,
    /// Its labels, unescaped.
    pub labels: Vec<(String, String)>,
    /// Its value (`+Inf`, `-Inf` and `NaN` as the format spells them).
    pub value: f64,
}

impl Sample {
    /// The value of label `key`, if the sample has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// The samples of a `/metrics` text, in order: comments, blank lines and lines that are not a sample
/// (a name, optional `{labels}`, a value, an optional timestamp) are passed over, never an error, since
/// a reader of a scrape wants what it can use of it. Never panics (the `admin_response` fuzz target
/// runs it on every response body).
pub fn samples(text: &str) -> Vec<Sample> {
    text.lines().filter_map(sample).collect()
}

fn sample(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))?;
    let (name, mut rest) = line.split_at(name_end);
    if name.is_empty() {
        return None;
    }
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        rest = inner;
        loop {
            rest = rest.trim_start_matches([' ', ',']);
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = rest.find('=')?;
            let key = rest[..eq].trim().to_string();
            rest = rest[eq + 1..].trim_start().strip_prefix('"')?;
            let mut value = String::new();
            let mut chars = rest.char_indices();
            let end = loop {
                match chars.next()? {
                    (i, '"') => break i,
                    (_, '\\') => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        c => value.push(c),
                    },
                    (_, c) => value.push(c),
                }
            };
            labels.push((key, value));
            rest = &rest[end + 1..];
        }
    }
    let value = match rest.split_whitespace().next()? {
        "+Inf" | "Inf" | "inf" => f64::INFINITY,
        "-Inf" | "-inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample { name: name.to_string(), labels, value })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_cannot_end_its_label_or_its_line() {
        assert_eq!(label("dm \"x\"\\\nnext"), "dm \\\"x\\\"\\\\\\nnext");
    }

    /// What [`label`] escapes comes back whole; comments, blank and broken lines are passed over.
    #[test]
    fn samples_are_read_back_with_their_labels_unescaped() {
        let name = "dm \"x\"\\,}\nnext";
        let text = format!(
            "# HELP rein_tenant_iops IOs.\n# TYPE rein_tenant_iops gauge\nrein_tenant_iops{{tenant=\"{}\",b=\"2\"}} 12.5\n\
             \nrein_up 1 1700000000\nrein_limit{{t=\"a\"}} +Inf\nrein_broken{{t=\"a}} 1\nrein_novalue\n{{x=\"1\"}} 2\n",
            label(name)
        );
        let got = samples(&text);
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0].name, "rein_tenant_iops");
        assert_eq!(got[0].label("tenant"), Some(name));
        assert_eq!(got[0].label("b"), Some("2"));
        assert_eq!(got[0].value, 12.5);
        assert_eq!((got[1].name.as_str(), got[1].value), ("rein_up", 1.0));
        assert_eq!(got[2].value, f64::INFINITY);
    }
}
