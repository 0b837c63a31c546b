//! `vqos lab publish DIR` (and `vqos lab paper all --docs DOCS`): a `vqos lab paper all` run's
//! `summary.md` into the docs, as a generated page with its plots.
//!
//! ## Behavior
//! - A lab run becomes `DOCS/paper-lab.md`, a `--sim-only` run `DOCS/paper-sim.md` (told apart
//!   by the summary's header). The page is the summary with a title saying it is generated,
//!   from which run directory and by which command; the run's date, commit, duration scale and
//!   command line follow unchanged (the summary's own header).
//! - Every plot the summary links (`](img/NAME.svg)`) is copied from `DIR/img/` to
//!   `DOCS/img/lab/` (`img/sim/` for a simulator run) and the link rewritten to it, so the links
//!   work from `DOCS/`. That directory holds only generated plots: `.svg` files in it that the
//!   page does not link are removed, so it always matches the page.
//! - Refused, with nothing written: a file that is not such a summary, an interrupted run
//!   (its later experiments are missing), a partial run (`--only`: it would replace the whole
//!   page with a part of it, and remove the other experiments' plots), a linked plot missing
//!   from `DIR/img/` or in a subdirectory of it (the summary never writes one).
//! - A lab run's verdict tables ([`crate::verdict`]) replace the block between
//!   [`VERDICTS_BEGIN`] and [`VERDICTS_END`] in `DOCS/experiments.md`, when that file has both
//!   markers (in order); a run whose results do not line up with this checkout's scenario
//!   files is refused before anything is written.

use std::path::{Path, PathBuf};

use crate::summary::{SIM_ONLY_MODE, TITLE};
use crate::LabError;

/// Which generated page a summary becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageKind {
    /// A lab run (`paper-lab.md`, plots in `img/lab/`).
    Lab,
    /// A `--sim-only` run (`paper-sim.md`, plots in `img/sim/`).
    Sim,
}

impl PageKind {
    /// The page's file name under the docs.
    pub fn page(self) -> &'static str {
        match self {
            PageKind::Lab => "paper-lab.md",
            PageKind::Sim => "paper-sim.md",
        }
    }

    /// The plots' directory, relative to the docs.
    pub fn img_dir(self) -> &'static str {
        match self {
            PageKind::Lab => "img/lab",
            PageKind::Sim => "img/sim",
        }
    }

    fn title(self) -> &'static str {
        match self {
            PageKind::Lab => "# The papers' experiments: paper, simulator and lab (generated from one `vqos lab paper all` run)",
            PageKind::Sim => "# The papers' experiments: paper and simulator (generated from `vqos lab paper all --sim-only`)",
        }
    }
}

/// A page made from a summary.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// Lab or simulator.
    pub kind: PageKind,
    /// The page's Markdown.
    pub text: String,
    /// The plots it links, as file names under `DIR/img/` (each once, in order).
    pub plots: Vec<String>,
}

fn invalid(msg: String) -> LabError {
    LabError::Invalid(msg)
}

/// The page for `summary` (the text of a run's `summary.md`), `source` naming the run's
/// directory in the page. Pure: see [`publish`] for the files.
pub fn docs_page(summary: &str, source: &str) -> Result<Page, LabError> {
    let Some(rest) = summary.strip_prefix(TITLE) else {
        return Err(invalid(format!(
            "{source}/summary.md is not a `vqos lab paper all` summary"
        )));
    };
    if summary.contains(crate::summary::INTERRUPTED) {
        return Err(invalid(format!(
            "The run in {source} was interrupted: its later experiments are missing; run it again"
        )));
    }
    let command = summary
        .lines()
        .find_map(|l| l.strip_prefix("Command: `"))
        .unwrap_or("");
    if command.split_whitespace().any(|w| w == "--only") {
        return Err(invalid(format!(
            "The run in {source} is partial (--only): publishing it would replace the page \
             with part of it; publish a full run"
        )));
    }
    let kind = if summary.contains(SIM_ONLY_MODE) {
        PageKind::Sim
    } else {
        PageKind::Lab
    };
    let mut plots: Vec<String> = Vec::new();
    let mut body = String::with_capacity(rest.len() + 256);
    let mut tail = rest.trim_start_matches('\n');
    while let Some(i) = tail.find("](img/") {
        let (before, after) = tail.split_at(i);
        let after = &after["](img/".len()..];
        let end = after.find(')').unwrap_or(after.len());
        let name = &after[..end];
        if name.is_empty() || name.contains('/') {
            return Err(invalid(format!(
                "{source}/summary.md links `img/{name}`: not a plot of the run's img/ directory"
            )));
        }
        if !plots.iter().any(|p| p == name) {
            plots.push(name.to_string());
        }
        body.push_str(before);
        body.push_str("](");
        body.push_str(kind.img_dir());
        body.push('/');
        tail = after;
    }
    body.push_str(tail);
    let text = format!(
        "{}\n\n*Generated by `vqos lab publish {source}` from `{source}/summary.md`, the \
         summary of the run below (its date, commit and command): do not edit by hand; to \
         refresh, run that command again and publish its directory. The plots are in `{}/`.*\n\n\
         {body}",
        kind.title(),
        kind.img_dir()
    );
    Ok(Page { kind, text, plots })
}

/// The line that opens the generated verdict block of `DOCS/experiments.md`.
pub const VERDICTS_BEGIN: &str =
    "<!-- verdicts: generated by `vqos lab publish` from the run's results; do not edit -->";
/// The line that closes it.
pub const VERDICTS_END: &str = "<!-- /verdicts -->";

/// `doc` with the text between its verdict markers replaced by `block`; `None` when `doc`
/// does not have both markers, the opening one first.
pub fn replace_verdicts(doc: &str, block: &str) -> Option<String> {
    let b = doc.find(VERDICTS_BEGIN)? + VERDICTS_BEGIN.len();
    let e = b + doc[b..].find(VERDICTS_END)?;
    Some(format!("{}\n{}\n{}", &doc[..b], block.trim(), &doc[e..]))
}

/// What [`publish`] wrote.
#[derive(Debug, Clone)]
pub struct Published {
    /// The page.
    pub page: PathBuf,
    /// `DOCS/experiments.md` when its verdict block was rewritten.
    pub verdicts: Option<PathBuf>,
    /// The plots copied.
    pub plots: usize,
    /// Plots of an earlier run removed (not linked by the new page).
    pub removed: usize,
}

fn io(what: &Path) -> impl FnOnce(std::io::Error) -> LabError + '_ {
    move |source| LabError::Io {
        what: what.display().to_string(),
        source,
    }
}

/// Publishes the run in `run_dir` (its `summary.md` and `img/`) into `docs_dir`.
pub fn publish(run_dir: &Path, docs_dir: &Path) -> Result<Published, LabError> {
    let summary_path = run_dir.join("summary.md");
    let summary = std::fs::read_to_string(&summary_path).map_err(io(&summary_path))?;
    let page = docs_page(&summary, &run_dir.display().to_string())?;
    for p in &page.plots {
        let from = run_dir.join("img").join(p);
        if !from.is_file() {
            return Err(invalid(format!(
                "{} is linked from the summary but missing",
                from.display()
            )));
        }
    }
    // The verdicts first: a run that does not line up with the scenario files writes nothing.
    let experiments = docs_dir.join("experiments.md");
    let verdicts = match (page.kind, std::fs::read_to_string(&experiments)) {
        (PageKind::Lab, Ok(doc)) if replace_verdicts(&doc, "").is_some() => {
            let block = crate::verdict::verdicts_md(run_dir, &crate::paper::scenarios_dir())?;
            replace_verdicts(&doc, &block)
        }
        _ => None,
    };
    let img = docs_dir.join(page.kind.img_dir());
    std::fs::create_dir_all(&img).map_err(io(&img))?;
    for p in &page.plots {
        let to = img.join(p);
        std::fs::copy(run_dir.join("img").join(p), &to).map_err(io(&to))?;
    }
    let mut removed = 0;
    for e in std::fs::read_dir(&img).map_err(io(&img))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".svg") && !page.plots.contains(&name) {
            std::fs::remove_file(e.path()).map_err(io(&e.path()))?;
            removed += 1;
        }
    }
    let to = docs_dir.join(page.kind.page());
    std::fs::write(&to, &page.text).map_err(io(&to))?;
    if let Some(doc) = &verdicts {
        std::fs::write(&experiments, doc).map_err(io(&experiments))?;
    }
    Ok(Published {
        page: to,
        verdicts: verdicts.map(|_| experiments),
        plots: page.plots.len(),
        removed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(mode: &str) -> String {
        format!(
            "{TITLE}\n\nRun 2026-11-24 12:00 UTC · commit `abc1234` · duration scale 1 · {mode}  \n\
             Command: `vqos lab paper all --out lab-out/paper-all`\n\n| [a](#a) | 1 s |\n\n## a\n\n\
             ![a vqos](img/a.svg)\n![a htb](img/a-htb.svg)\n![a vqos again](img/a.svg)\n\
             ![cpu](img/ancs-fig8.svg)\n"
        )
    }

    #[test]
    fn a_lab_summary_becomes_paper_lab_with_its_plots_under_img_lab() {
        let p = docs_page(
            &summary("lab runs with the simulator's prediction"),
            "lab-out/paper-all",
        )
        .unwrap();
        assert_eq!(p.kind, PageKind::Lab);
        assert_eq!(p.kind.page(), "paper-lab.md");
        assert_eq!(p.plots, ["a.svg", "a-htb.svg", "ancs-fig8.svg"]);
        assert!(p
            .text
            .starts_with("# The papers' experiments: paper, simulator and lab (generated"));
        assert!(
            p.text.contains("`vqos lab publish lab-out/paper-all`"),
            "{}",
            p.text
        );
        assert!(p
            .text
            .contains("Run 2026-11-24 12:00 UTC · commit `abc1234`"));
        assert!(p.text.contains("![a htb](img/lab/a-htb.svg)"), "{}", p.text);
        assert!(p.text.contains("![cpu](img/lab/ancs-fig8.svg)"));
        assert!(!p.text.contains("](img/a"), "{}", p.text);
        assert!(!p.text.contains("\n\n\n"), "{}", p.text);
        // Anchors inside the page are untouched.
        assert!(p.text.contains("| [a](#a) |"));
    }

    #[test]
    fn a_sim_only_summary_becomes_paper_sim() {
        let p = docs_page(&summary(SIM_ONLY_MODE), "/tmp/x").unwrap();
        assert_eq!(p.kind, PageKind::Sim);
        assert!(p.text.contains("![a htb](img/sim/a-htb.svg)"));
        assert!(p.text.contains("paper and simulator (generated"));
    }

    #[test]
    fn interrupted_runs_and_other_files_are_refused() {
        let mut s = summary("lab runs");
        s.push_str(crate::summary::INTERRUPTED);
        let e = docs_page(&s, "d").unwrap_err().to_string();
        assert!(e.contains("interrupted"), "{e}");
        let e = docs_page("# Something else\n", "d")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a `vqos lab paper all` summary"), "{e}");
    }

    #[test]
    fn partial_runs_and_links_outside_img_are_refused() {
        let s = summary("lab runs").replace(
            "paper all --out lab-out/paper-all",
            "paper all --only ancs-fig5 --out x",
        );
        let e = docs_page(&s, "d").unwrap_err().to_string();
        assert!(e.contains("partial (--only)"), "{e}");
        // A word that only starts like the option is no option.
        let s = summary("lab runs").replace("--out lab-out/paper-all", "--out lab-out/--only-x");
        assert!(docs_page(&s, "d").is_ok());
        let s = summary("lab runs").replace("(img/a-htb.svg)", "(img/sub/a-htb.svg)");
        let e = docs_page(&s, "d").unwrap_err().to_string();
        assert!(e.contains("img/sub/a-htb.svg"), "{e}");
    }

    #[test]
    fn publish_copies_the_linked_plots_and_drops_stale_ones() {
        let base = std::env::temp_dir().join(format!("vqos-publish-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (run, docs) = (base.join("run"), base.join("docs"));
        std::fs::create_dir_all(run.join("img")).unwrap();
        std::fs::create_dir_all(docs.join("img/lab")).unwrap();
        std::fs::write(run.join("summary.md"), summary("lab runs")).unwrap();
        for p in ["a.svg", "a-htb.svg"] {
            std::fs::write(run.join("img").join(p), p).unwrap();
        }
        // A plot is missing: nothing is written.
        let e = publish(&run, &docs).unwrap_err().to_string();
        assert!(e.contains("ancs-fig8.svg"), "{e}");
        assert!(!docs.join("paper-lab.md").exists());
        std::fs::write(run.join("img/ancs-fig8.svg"), "cpu").unwrap();
        std::fs::write(docs.join("img/lab/old.svg"), "old").unwrap();
        std::fs::write(docs.join("img/lab/notes.txt"), "kept").unwrap();
        let p = publish(&run, &docs).unwrap();
        assert_eq!((p.plots, p.removed), (3, 1));
        assert_eq!(
            std::fs::read_to_string(docs.join("img/lab/a-htb.svg")).unwrap(),
            "a-htb.svg"
        );
        assert!(!docs.join("img/lab/old.svg").exists());
        assert!(docs.join("img/lab/notes.txt").exists());
        let page = std::fs::read_to_string(docs.join("paper-lab.md")).unwrap();
        assert!(page.contains("](img/lab/a.svg)"));
        assert!(p.verdicts.is_none(), "no experiments.md: no verdicts");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn only_the_marked_block_of_experiments_md_is_replaced() {
        let doc = format!("# E\n\nintro\n{VERDICTS_BEGIN}\nold table\n{VERDICTS_END}\n\n## Next\n");
        let new = replace_verdicts(&doc, "\nnew table\n").unwrap();
        assert_eq!(
            new,
            format!("# E\n\nintro\n{VERDICTS_BEGIN}\nnew table\n{VERDICTS_END}\n\n## Next\n")
        );
        // Idempotent: publishing the same run twice gives the same page.
        assert_eq!(replace_verdicts(&new, "new table").unwrap(), new);
        assert!(replace_verdicts("# E\n", "x").is_none());
        let reversed = format!("{VERDICTS_END}\n{VERDICTS_BEGIN}\n");
        assert!(replace_verdicts(&reversed, "x").is_none());
    }

    #[test]
    fn a_lab_run_writes_its_verdicts_into_experiments_md_or_nothing_at_all() {
        let base = std::env::temp_dir().join(format!("vqos-publish-v-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (run, docs) = (base.join("run"), base.join("docs"));
        std::fs::create_dir_all(run.join("img")).unwrap();
        std::fs::create_dir_all(&docs).unwrap();
        std::fs::write(run.join("summary.md"), summary("lab runs")).unwrap();
        for p in ["a.svg", "a-htb.svg", "ancs-fig8.svg"] {
            std::fs::write(run.join("img").join(p), p).unwrap();
        }
        let doc = format!("# E\n{VERDICTS_BEGIN}\nold\n{VERDICTS_END}\n");
        std::fs::write(docs.join("experiments.md"), &doc).unwrap();
        // Without the run's run-info.json its verdicts cannot be made: nothing is written.
        let e = publish(&run, &docs).unwrap_err().to_string();
        assert!(e.contains("run-info.json"), "{e}");
        assert!(!docs.join("paper-lab.md").exists());
        let info = r#"{"commit": "abc1234", "duration_scale": 1.0, "repeats": 1, "started": "2026-12-07 12:50 UTC"}"#;
        std::fs::write(run.join("run-info.json"), info).unwrap();
        let p = publish(&run, &docs).unwrap();
        assert_eq!(p.verdicts, Some(docs.join("experiments.md")));
        let new = std::fs::read_to_string(docs.join("experiments.md")).unwrap();
        assert!(
            new.starts_with(&format!(
                "# E\n{VERDICTS_BEGIN}\nGenerated by `vqos lab publish`"
            )),
            "{new}"
        );
        assert!(
            new.contains("#### ANCS") && !new.contains("\nold\n"),
            "{new}"
        );
        assert!(new.ends_with(&format!("{VERDICTS_END}\n")));
        std::fs::remove_dir_all(&base).unwrap();
    }
}
