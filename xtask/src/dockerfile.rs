//! Dockerfiles as the build reads them: instructions (continuations joined, comments
//! dropped), what an image COPYs from its context, and the ARG defaults it pins. Pure; the
//! graph (which image is built on which) and the build both read Dockerfiles through it.

use std::collections::BTreeMap;

/// One Dockerfile instruction with the line it starts on; continuation lines joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instruction {
    pub line: usize,
    pub keyword: String,
    pub args: String,
}

/// Splits a Dockerfile into instructions: comments and blank lines dropped, `\` continuations
/// joined, keywords upper-cased.
pub fn instructions(text: &str) -> Vec<Instruction> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let trimmed = raw.trim();
        if trimmed.starts_with('#') || trimmed.is_empty() {
            continue;
        }
        let (continues, body) = match trimmed.strip_suffix('\\') {
            Some(body) => (true, body),
            None => (false, trimmed),
        };
        let entry = pending.get_or_insert_with(|| (i + 1, String::new()));
        if !entry.1.is_empty() {
            entry.1.push(' ');
        }
        entry.1.push_str(body.trim());
        if !continues {
            let (line, joined) = pending.take().expect("pending was set");
            let (keyword, args) = joined.split_once(char::is_whitespace).unwrap_or((&joined, ""));
            out.push(Instruction {
                line,
                keyword: keyword.to_ascii_uppercase(),
                args: args.trim().to_string(),
            });
        }
    }
    out
}

/// `ARG NAME=default` lines of a Dockerfile, except `base_arg`, the one that names its base.
pub fn pinned_args(dockerfile: &str, base_arg: Option<&str>) -> BTreeMap<String, String> {
    instructions(dockerfile)
        .iter()
        .filter(|ins| ins.keyword == "ARG")
        .filter_map(|ins| ins.args.split_once('='))
        .filter(|(name, _)| Some(name.trim()) != base_arg)
        .map(|(name, value)| (name.trim().to_string(), value.trim().trim_matches('"').to_string()))
        .collect()
}

/// Whether a Dockerfile COPYs or ADDs `source` from its context.
pub fn copies(dockerfile: &str, source: &str) -> bool {
    instructions(dockerfile).iter().any(|ins| {
        (ins.keyword == "COPY" || ins.keyword == "ADD") && {
            let words: Vec<&str> = ins.args.split_whitespace().filter(|w| !w.starts_with("--")).collect();
            words.len() >= 2 && words[..words.len() - 1].contains(&source)
        }
    })
}

/// A value without its surrounding double quotes.
pub fn unquote(s: &str) -> &str {
    s.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_join_continuations_and_skip_comments() {
        let ins = instructions("# c\nfrom x\n\nRUN a \\\n  # inner comment\n  b\nLABEL k=v\n");
        let got: Vec<_> = ins.iter().map(|i| (i.line, i.keyword.as_str(), i.args.as_str())).collect();
        assert_eq!(got, [(2, "FROM", "x"), (4, "RUN", "a b"), (7, "LABEL", "k=v")]);
    }

    #[test]
    fn the_lock_records_a_dockerfiles_own_arg_defaults_not_its_base() {
        let dockerfile = "ARG BASE_IMAGE=agent-node\nFROM ${BASE_IMAGE}\nARG CLAUDE_CODE_VERSION=2.1.332\nARG QUOTED=\"x y\"\nARG NO_DEFAULT\n";
        let args = pinned_args(dockerfile, Some("BASE_IMAGE"));
        assert_eq!(
            args,
            BTreeMap::from([
                ("CLAUDE_CODE_VERSION".into(), "2.1.332".into()),
                ("QUOTED".into(), "x y".into())
            ])
        );
    }

    #[test]
    fn copies_reads_copy_and_add_sources_only() {
        assert!(copies("FROM x\nCOPY sandbox-init /usr/local/bin/\n", "sandbox-init"));
        assert!(copies("FROM x\ncopy --chmod=755 a sandbox-init /dst/\n", "sandbox-init"));
        assert!(copies("FROM x\nADD sandbox-init /x\n", "sandbox-init"));
        assert!(!copies("FROM x\nCOPY other /usr/local/bin/sandbox-init\n", "sandbox-init"));
        assert!(!copies("FROM x\nRUN cp sandbox-init /x\n", "sandbox-init"));
    }
}
