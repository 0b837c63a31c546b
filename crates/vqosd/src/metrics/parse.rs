//! A strict parser of the text exposition, for the tests and for consumers that check a scrape.

/// One sample line of the exposition, as [`parse`] reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name.
    pub name: String,
    /// Labels in order.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

/// A parsed exposition.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Exposition {
    /// The sample lines.
    pub samples: Vec<Sample>,
    /// The declared `(name, type)` pairs.
    pub types: Vec<(String, String)>,
}

/// Parses an exposition strictly: every line is `# HELP name text`, `# TYPE name type`, or
/// `name{labels} value`. Returns the samples and the declared types, or the first
/// bad line. Used by tests and by `vqos stats` consumers that want to check a scrape.
pub fn parse(text: &str) -> Result<Exposition, String> {
    let mut samples = Vec::new();
    let mut types = Vec::new();
    for line in text.lines() {
        let bad = || format!("Bad exposition line {line:?}");
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("");
            if !valid_name(name) {
                return Err(bad());
            }
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split(' ');
            let (name, kind) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
            let known = ["counter", "gauge", "histogram", "summary", "untyped"];
            if !valid_name(name) || !known.contains(&kind) || it.next().is_some() {
                return Err(bad());
            }
            types.push((name.to_string(), kind.to_string()));
        } else {
            samples.push(parse_sample(line).ok_or_else(bad)?);
        }
    }
    Ok(Exposition { samples, types })
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    if !valid_name(name) {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices().peekable();
        let mut end = None;
        // label="value" pairs separated by commas, values with \\ \" \n escapes.
        loop {
            match chars.peek() {
                Some(&(i, '}')) => {
                    end = Some(i);
                    break;
                }
                None => break,
                _ => {}
            }
            let start = chars.peek()?.0;
            let eq = body[start..].find('=')? + start;
            let lname = &body[start..eq];
            if !valid_name(lname) || !body[eq + 1..].starts_with('"') {
                return None;
            }
            while chars.peek()?.0 <= eq + 1 {
                chars.next();
            }
            let mut value = String::new();
            loop {
                let (_, c) = chars.next()?;
                match c {
                    '"' => break,
                    '\\' => match chars.next()?.1 {
                        '\\' => value.push('\\'),
                        '"' => value.push('"'),
                        'n' => value.push('\n'),
                        _ => return None,
                    },
                    c => value.push(c),
                }
            }
            labels.push((lname.to_string(), value));
            if let Some(&(_, ',')) = chars.peek() {
                chars.next();
            }
        }
        rest = &body[end? + 1..];
    }
    let value_text = rest.strip_prefix(' ')?;
    if value_text.contains(' ') {
        return None;
    }
    let value = match value_text {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parser_rejects_bad_lines() {
        for bad in [
            "no_value",
            "1bad 1",
            "m{a=\"x\"} ",
            "m{a=x} 1",
            "m{a=\"x} 1",
            "m 1 2",
            "m abc",
            "# TYPE m thing",
            "m{a=\"\\q\"} 1",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
        let s = parse("m{a=\"x\\\\y\",b=\"\"} 1.5\nn 2").unwrap().samples;
        assert_eq!(
            s[0].labels,
            vec![("a".into(), "x\\y".into()), ("b".into(), "".into())]
        );
        assert_eq!(s[1].value, 2.0);
    }
}
