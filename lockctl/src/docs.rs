//! `lockctl completions SHELL` and `lockctl man [--dir DIR]`: the shell completion scripts
//! and the man pages, generated from the clap definition so they never drift from `--help`.
//!
//! The man pages are git's layout: `lockctl.1` lists the commands, and each command has a
//! page of its own (`lockctl-run.1`, `lockctl-migration-check.1`, …) with its options, its
//! exit status and the environment it reads. `make install-lockctl` installs them all.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Command, CommandFactory};
use clap_complete::Shell;
use clap_mangen::roff::{bold, roman, Roff};
use clap_mangen::Man;

use crate::{BoxError, Cli};

/// The commands that use no lock service (`--url` reaches them as a global option).
const OFFLINE: &[&str] = &["completions", "man"];

/// `lockctl completions SHELL`.
#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: Shell,
}

/// `lockctl man [--dir DIR]`.
#[derive(Debug, Args)]
pub(crate) struct ManArgs {
    /// Write every page (lockctl.1 and one per command, lockctl-run.1 and so on) into DIR,
    /// created if need be, and print their paths; without it, print lockctl.1.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Prints the completion script for `args.shell`.
pub(crate) fn completions(args: &CompletionsArgs) -> Result<ExitCode, BoxError> {
    let mut command = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "lockctl", &mut script);
    print(&script)
}

/// Prints `lockctl.1`, or writes every page into `args.dir`.
pub(crate) fn man(args: &ManArgs) -> Result<ExitCode, BoxError> {
    let pages = pages();
    let Some(dir) = &args.dir else {
        let top = pages.into_iter().next().ok_or("no man page")?;
        return print(&top.1);
    };
    std::fs::create_dir_all(dir)
        .map_err(|err| format!("cannot create {}: {err}", dir.display()))?;
    let mut written = Vec::new();
    for (file, text) in pages {
        let path = dir.join(file);
        std::fs::write(&path, text)
            .map_err(|err| format!("cannot write {}: {err}", path.display()))?;
        writeln!(written, "{}", path.display())?;
    }
    print(&written)
}

/// Writes `bytes` to stdout; a reader that went away (`| head`) is not an error.
fn print(bytes: &[u8]) -> Result<ExitCode, BoxError> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => Err(err.into()),
        _ => Ok(ExitCode::SUCCESS),
    }
}

/// Every man page as (file name, roff text): `lockctl.1` first, then a page per command
/// and per nested command, in the order `--help` lists them.
fn pages() -> Vec<(String, Vec<u8>)> {
    let mut top = Cli::command().disable_help_subcommand(true);
    // Sets each command's display name (`lockctl-run`) and usage name (`lockctl run`).
    top.build();
    let mut pages = Vec::new();
    collect(&top, None, &mut pages);
    pages
}

fn collect(command: &Command, parent: Option<&str>, pages: &mut Vec<(String, Vec<u8>)>) {
    let name = page_name(command);
    pages.push((format!("{name}.1"), page(command, parent)));
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        collect(sub, Some(&name), pages);
    }
}

fn page_name(command: &Command) -> String {
    command
        .get_display_name()
        .unwrap_or_else(|| command.get_name())
        .to_owned()
}

/// One page: clap_mangen's NAME, SYNOPSIS, DESCRIPTION, OPTIONS and the list of commands,
/// then EXIT STATUS (the table `--help` prints, kept as laid out), ENVIRONMENT and SEE ALSO.
fn page(command: &Command, parent: Option<&str>) -> Vec<u8> {
    let exit_codes = command.get_after_help().map(ToString::to_string);
    // Left out of clap_mangen's part: the exit codes get a section of their own below, and
    // the version is in the page's footer (`.TH … "lockctl 0.1.0"`), not a section.
    let stripped = command
        .clone()
        .after_help(None::<&str>)
        .version(None::<&str>);
    let man = Man::new(stripped).source(format!("lockctl {}", env!("CARGO_PKG_VERSION")));
    let mut text = Vec::new();
    man.render(&mut text)
        .expect("rendering into memory does not fail");

    let mut roff = Roff::new();
    if let Some(exit_codes) = exit_codes {
        roff.control("SH", ["EXIT STATUS"]);
        // Laid out as a table already: no filling, no adjusting.
        roff.control("nf", []);
        for line in exit_codes.lines().skip_while(|line| line.ends_with(':')) {
            roff.text([roman(line)]);
        }
        roff.control("fi", []);
    }
    let uses_service = !OFFLINE.contains(&command.get_name());
    if uses_service && command.get_arguments().any(|arg| arg.get_id() == "url") {
        roff.control("SH", ["ENVIRONMENT"]);
        roff.control("TP", []);
        roff.text([bold("LOCK_URL")]);
        roff.text([roman(
            "The lock service URL when --url is not given, e.g. redis://127.0.0.1:6379, \
             zk://127.0.0.1:2181/locks, etcd://127.0.0.1:2379, \
             postgres://locks@127.0.0.1:5432/app or file:///run/lock/app. Without either, \
             a directory of this machine private to the user: \
             file://$XDG_RUNTIME_DIR/distlock, else /run/user/UID/distlock, else \
             /tmp/distlock-UID (migration needs a URL given).",
        )]);
    }
    roff.control("SH", ["SEE ALSO"]);
    let see_also = match parent {
        None => "flock(1)".to_owned(),
        Some("lockctl") => "lockctl(1)".to_owned(),
        Some(parent) => format!("{parent}(1), lockctl(1)"),
    };
    roff.text([roman(see_also)]);
    // `Roff::render` starts with the apostrophe preamble that `Man::render` wrote already.
    text.extend_from_slice(roff_lines(&roff).as_bytes());
    text
}

/// `roff` as text without its preamble (the lines that define `\*(Aq`).
fn roff_lines(roff: &Roff) -> String {
    roff.render()
        .lines()
        .filter(|line| !line.starts_with(".ie \\n(.g .ds Aq") && !line.starts_with(".el .ds Aq"))
        .map(|line| format!("{line}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_per_command_nested_ones_included_help_left_out() {
        let files: Vec<String> = pages().into_iter().map(|(file, _)| file).collect();
        assert_eq!(files[0], "lockctl.1");
        for file in [
            "lockctl-run.1",
            "lockctl-migration.1",
            "lockctl-migration-check.1",
        ] {
            assert!(files.iter().any(|f| f == file), "{file}: {files:?}");
        }
        assert!(!files.iter().any(|f| f.contains("help")), "{files:?}");
    }

    #[test]
    fn exit_codes_are_a_section_not_filled_text() {
        let pages = pages();
        let run = pages
            .iter()
            .find(|(file, _)| file == "lockctl-run.1")
            .map(|(_, text)| String::from_utf8_lossy(text).into_owned())
            .expect("lockctl-run.1");
        assert!(run.contains(".SH \"EXIT STATUS\"\n.nf\n"), "{run}");
        assert!(!run.contains(".SH EXTRA"), "{run}");
        assert!(!run.contains("Exit codes:"), "{run}");
        assert_eq!(run.matches(".ds Aq").count(), 2, "one preamble: {run}");
    }

    #[test]
    fn environment_only_where_a_lock_service_is_used() {
        let pages = pages();
        let text = |name: &str| {
            let (_, text) = pages.iter().find(|(file, _)| file == name).expect(name);
            String::from_utf8_lossy(text).into_owned()
        };
        for page in ["lockctl.1", "lockctl-status.1", "lockctl-migration-check.1"] {
            assert!(text(page).contains(".SH ENVIRONMENT"), "{page}");
        }
        for page in ["lockctl-man.1", "lockctl-completions.1"] {
            assert!(!text(page).contains(".SH ENVIRONMENT"), "{page}");
        }
    }
}
