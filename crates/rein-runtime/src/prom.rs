//! The Prometheus text format's pieces that every daemon's `/metrics` shares (rein serve's admin
//! endpoint, the gateway's, the pShift controller's and a pShift server's link), kept below all of them:
//! a label value escaped as the format asks.

/// `s` as a label value between double quotes: backslash, double quote and line feed escaped (the text
/// exposition format's rule), so that a tenant or bucket name cannot end its label or its line.
pub(crate) fn label(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_name_cannot_end_its_label_or_its_line() {
        assert_eq!(super::label("dm \"x\"\\\nnext"), "dm \\\"x\\\"\\\\\\nnext");
    }
}
