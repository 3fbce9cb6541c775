//! `lockctl completions` and `lockctl man` as a packager runs them: every shell's script
//! names every command (and bash's completes them), and every man page has its sections,
//! names every command and renders without a warning (where `groff` or `man` is installed).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::common::text;

/// The commands lockctl has at least: the test reads the full list from `--help`, so a
/// command added later is checked too, and this keeps an empty read from passing.
const KNOWN: &[&str] = &[
    "run",
    "elect",
    "leader",
    "observe",
    "hold",
    "try",
    "status",
    "list",
    "break",
    "migration",
    "completions",
    "man",
];

/// Runs `lockctl ARGS...` without a lock service (no `--url`, no `LOCK_URL`).
fn lockctl(args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(args)
        .env_remove("LOCK_URL")
        .output()
        .expect("lockctl runs");
    assert!(
        output.status.success(),
        "lockctl {args:?}: {}",
        text(&output)
    );
    output
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("UTF-8")
}

/// The commands `lockctl ARGS... --help` lists (clap's `help` included where listed).
fn commands(args: &[&str]) -> Vec<String> {
    let mut args = args.to_vec();
    args.push("--help");
    let help = stdout(&lockctl(&args));
    let listed: Vec<String> = help
        .lines()
        .skip_while(|line| *line != "Commands:")
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    assert!(!listed.is_empty(), "no commands in:\n{help}");
    listed
}

/// The top-level commands, checked against [`KNOWN`].
fn top_commands() -> Vec<String> {
    let listed = commands(&[]);
    for known in KNOWN {
        assert!(listed.iter().any(|c| c == known), "{known}: {listed:?}");
    }
    listed
}

/// The words of `script`: what a completion script can name a command by.
fn words(script: &str) -> Vec<&str> {
    script
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        .filter(|word| !word.is_empty())
        .collect()
}

/// Whether `program` can be run here.
fn installed(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Each shell's script names every command, and `migration`'s own `check`; a shell that
/// is installed parses it.
#[test]
fn completion_scripts_name_every_command() {
    let commands = top_commands();
    let nested = commands_of("migration");
    for shell in ["bash", "zsh", "fish"] {
        let script = stdout(&lockctl(&["completions", shell]));
        let words = words(&script);
        for command in commands.iter().chain(&nested) {
            assert!(
                words.contains(&command.as_str()),
                "{shell} script lacks `{command}`:\n{script}"
            );
        }
        let check = match shell {
            "fish" => ["--no-execute"],
            _ => ["-n"],
        };
        if installed(shell) {
            let parsed = shell_with_stdin(shell, &check, &script);
            assert!(parsed.status.success(), "{shell}: {}", text(&parsed));
        } else {
            println!("note: {shell} is not installed: its script's syntax was not checked");
        }
    }
}

/// The commands of `lockctl COMMAND`, `help` aside.
fn commands_of(command: &str) -> Vec<String> {
    let nested: Vec<String> = commands(&[command])
        .into_iter()
        .filter(|c| c != "help")
        .collect();
    assert!(!nested.is_empty(), "{command} has commands");
    nested
}

/// Runs `shell ARGS` with `input` on its standard input.
fn shell_with_stdin(shell: &str, args: &[&str], input: &str) -> Output {
    let mut child = Command::new(shell)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the shell starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("the shell reads the script");
    child.wait_with_output().expect("the shell ends")
}

/// What bash's completion offers for the words `line` (the last one being completed).
fn bash_completes(script: &Path, line: &[&str]) -> Vec<String> {
    let words: Vec<String> = line.iter().map(|w| format!("'{w}'")).collect();
    let source = std::fs::read_to_string(script).expect("script");
    let function = source
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("complete -F "))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the script registers a function with complete -F");
    let program = format!(
        "source '{}'\nCOMP_WORDS=({})\nCOMP_CWORD={}\nCOMP_LINE='{}'\nCOMP_POINT=${{#COMP_LINE}}\n\
         {function} lockctl '{}' '{}'\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        script.display(),
        words.join(" "),
        line.len() - 1,
        line.join(" "),
        line[line.len() - 1],
        line[line.len() - 2],
    );
    let output = shell_with_stdin("bash", &["--norc", "--noprofile"], &program);
    assert!(output.status.success(), "{}", text(&output));
    stdout(&output).lines().map(str::to_owned).collect()
}

/// bash completes every command after `lockctl`, `migration`'s after it, and a prefix to
/// the one command it starts.
#[test]
fn bash_completes_commands() {
    if !installed("bash") {
        println!("note: bash is not installed: its completion was not run");
        return;
    }
    let dir = temp_dir("completions");
    let script = dir.join("lockctl.bash");
    std::fs::write(&script, lockctl(&["completions", "bash"]).stdout).expect("script");

    let offered = bash_completes(&script, &["lockctl", ""]);
    for command in top_commands() {
        assert!(offered.contains(&command), "{command}: {offered:?}");
    }
    let offered = bash_completes(&script, &["lockctl", "migration", ""]);
    for command in commands_of("migration") {
        assert!(offered.contains(&command), "{command}: {offered:?}");
    }
    assert_eq!(bash_completes(&script, &["lockctl", "obs"]), ["observe"]);
    let _ = std::fs::remove_dir_all(dir);
}

/// A fresh directory under the system's temporary one.
fn temp_dir(what: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("lockctl-{what}-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// The sections every page has.
const SECTIONS: &[&str] = &[
    ".SH NAME",
    ".SH SYNOPSIS",
    ".SH DESCRIPTION",
    ".SH \"SEE ALSO\"",
];

fn assert_sections(name: &str, page: &str) {
    assert!(page.starts_with(".ie "), "{name}: roff with its preamble");
    assert!(page.contains(".TH "), "{name}");
    for section in SECTIONS {
        assert!(page.contains(section), "{name} lacks {section}:\n{page}");
    }
}

/// `lockctl man` is lockctl(1): its sections, every command by its page's name, the exit
/// codes and LOCK_URL; it renders without a warning.
#[test]
fn man_page_lists_every_command_and_renders_cleanly() {
    let page = stdout(&lockctl(&["man"]));
    assert_sections("lockctl.1", &page);
    assert!(page.contains(".TH lockctl 1 "), "{page}");
    for command in top_commands().iter().filter(|c| *c != "help") {
        let reference = format!("lockctl\\-{}(1)", command.replace('-', "\\-"));
        assert!(page.contains(&reference), "{reference}:\n{page}");
    }
    for section in [".SH \"EXIT STATUS\"", ".SH ENVIRONMENT", "LOCK_URL"] {
        assert!(page.contains(section), "{section}:\n{page}");
    }
    if let Some(rendered) = render(Path::new("lockctl.1"), page.as_bytes()) {
        for heading in [
            "NAME",
            "SYNOPSIS",
            "DESCRIPTION",
            "EXIT STATUS",
            "lockctl-run(1)",
        ] {
            assert!(rendered.contains(heading), "{heading}:\n{rendered}");
        }
    }
}

/// `lockctl man --dir DIR` writes lockctl.1 (the page `lockctl man` prints) and a page for
/// every command and nested command, each with its sections, rendering without a warning.
#[test]
fn man_dir_holds_a_page_per_command() {
    let dir = temp_dir("man").join("man1");
    let listed = stdout(&lockctl(&[
        "man",
        "--dir",
        dir.to_str().expect("UTF-8 path"),
    ]));

    let mut expected = vec!["lockctl.1".to_owned()];
    for command in top_commands().iter().filter(|c| *c != "help") {
        expected.push(format!("lockctl-{command}.1"));
    }
    for command in commands_of("migration") {
        expected.push(format!("lockctl-migration-{command}.1"));
    }
    let mut written: Vec<String> = std::fs::read_dir(&dir)
        .expect("the directory")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    written.sort();
    expected.sort();
    assert_eq!(written, expected);
    let listed: Vec<&str> = listed.lines().collect();
    assert_eq!(listed.len(), expected.len(), "{listed:?}");
    for file in &expected {
        let path = dir.join(file);
        assert!(
            listed.contains(&path.to_str().expect("UTF-8")),
            "{listed:?}"
        );
        let page = std::fs::read_to_string(&path).expect("page");
        assert_sections(file, &page);
        render(&path, page.as_bytes());
    }
    assert_eq!(
        std::fs::read(dir.join("lockctl.1")).expect("lockctl.1"),
        lockctl(&["man"]).stdout
    );

    let run = std::fs::read_to_string(dir.join("lockctl-run.1")).expect("run page");
    for part in [
        ".TH lockctl-run 1 ",
        "lockctl run",
        "\\-\\-nonblock",
        "DISTLOCK_FENCING_TOKEN",
        ".SH \"EXIT STATUS\"",
        ".SH ENVIRONMENT",
        "lockctl(1)",
    ] {
        assert!(run.contains(part), "{part}:\n{run}");
    }
    let check = std::fs::read_to_string(dir.join("lockctl-migration-check.1")).expect("page");
    assert!(check.contains("lockctl\\-migration(1)"), "{check}");
    let _ = std::fs::remove_dir_all(dir.parent().expect("parent"));
}

/// `page` rendered for a terminal by groff (`-ww`: every warning) or else `man -l`
/// (`--warnings`), which must warn about nothing; `None`, after a note, with neither.
fn render(name: &Path, page: &[u8]) -> Option<String> {
    let (program, args): (&str, &[&str]) = if installed("groff") {
        ("groff", &["-ww", "-b", "-man", "-Tutf8"])
    } else if installed("man") {
        ("man", &["--warnings", "-l", "-"])
    } else {
        println!("note: neither groff nor man is installed: {name:?} was not rendered");
        return None;
    };
    let mut child = Command::new(program)
        .args(args)
        .env("MANWIDTH", "80")
        .env("MAN_KEEP_FORMATTING", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the renderer starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(page)
        .expect("the renderer reads the page");
    let output = child.wait_with_output().expect("the renderer ends");
    assert!(
        output.status.success() && output.stderr.is_empty(),
        "{program} on {name:?}: {}",
        text(&output)
    );
    let rendered = String::from_utf8_lossy(&output.stdout).into_owned();
    // Bold and underline as overstrikes (groff's grotty): the plain text.
    Some(strip_overstrike(&rendered))
}

/// `text` without grotty's overstrikes (`X\bX` bold, `_\bX` underlined) and SGR escapes.
fn strip_overstrike(text: &str) -> String {
    let mut out: Vec<char> = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{8}' => {
                out.pop();
            }
            '\u{1b}' => {
                // ESC [ … m
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            c => out.push(c),
        }
    }
    out.into_iter().collect()
}
