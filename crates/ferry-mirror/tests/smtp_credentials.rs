//! `ferry-mirror validate`, the real binary, on email channels' credentials: a password is never sent in clear text
//! to another host, and one server's password is never offered to another.
//!
//! - Credentials with `tls = "none"` are refused unless the SMTP host is loopback.
//! - Each channel has its own password source (`password_file` or `password_env`); `FERRY_SMTP_PASSWORD` serves
//!   only when there is exactly one email channel.
//! - Every problem names the channel, and no output carries a password.

use std::path::Path;
use std::process::Output;

const BASE: &str = "[source]\ncluster = \"dc-a\"\n[[source.routes]]\nname = \"primary\"\nbrokers = [\"127.0.0.1:7411\"]\n\
                    [target]\ncluster = \"dc-b\"\nbrokers = [\"127.0.0.1:7412\"]\n[topics]\ninclude = [\"^orders$\"]\n";
const SHARED: &str = "shared-secret-1";
const OWN: &str = "own-secret-2";

fn email(name: &str, smtp: &str, tls: &str, extra: &str) -> String {
    format!(
        "[[alarms.email]]\nname = \"{name}\"\nsmtp = \"{smtp}\"\ntls = \"{tls}\"\nfrom = \"ferry@example\"\n\
         to = [\"oncall@example\"]\n{extra}"
    )
}

/// Runs `ferry-mirror validate` on `BASE` + `channels`, with `FERRY_SMTP_PASSWORD` set or not, and `OWN_PASSWORD`
/// set to [`OWN`].
fn validate(dir: &Path, channels: &str, shared: bool) -> Output {
    let config = dir.join("mirror.toml");
    std::fs::write(&config, format!("{BASE}{channels}")).unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ferry-mirror"));
    cmd.args(["validate", "--config"]).arg(&config).env("OWN_PASSWORD", OWN).env_remove("FERRY_SMTP_PASSWORD");
    if shared {
        cmd.env("FERRY_SMTP_PASSWORD", SHARED);
    }
    cmd.output().unwrap()
}

/// The exit code and the problem lines (`  - ...`), with no password printed anywhere.
fn problems(out: &Output) -> (Option<i32>, Vec<String>) {
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    for secret in [SHARED, OWN] {
        assert!(!stdout.contains(secret) && !stderr.contains(secret), "a password was printed:\n{stdout}\n{stderr}");
    }
    let lines = stderr.lines().filter_map(|l| l.trim_start().strip_prefix("- ")).map(str::to_owned).collect();
    (out.status.code(), lines)
}

#[test]
fn credentials_over_plain_smtp_are_refused_unless_the_relay_is_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let login = "username = \"ferry\"\npassword_env = \"OWN_PASSWORD\"\n";
    let remote = email("relay", "smtp.example:25", "none", login);
    let (code, lines) = problems(&validate(dir.path(), &remote, false));
    assert_eq!(code, Some(2));
    assert_eq!(
        lines,
        ["alarms.email[0].tls: channel \"relay\": credentials over tls = \"none\" would cross the network in clear \
          text to smtp.example; use tls = \"starttls\" or \"tls\", or a relay on loopback (127.0.0.1, ::1, \
          localhost)"]
    );
    // The same to loopback relays, or over STARTTLS to the remote one, is valid.
    for (smtp, tls) in
        [("127.0.0.1:25", "none"), ("[::1]:25", "none"), ("localhost:25", "none"), ("smtp.example:587", "starttls")]
    {
        let out = validate(dir.path(), &email("relay", smtp, tls, login), false);
        assert_eq!(problems(&out), (Some(0), vec![]), "{smtp} {tls}: {}", String::from_utf8_lossy(&out.stderr));
    }
    // Without credentials, plain SMTP to a remote relay sends no secret: valid.
    let out = validate(dir.path(), &email("relay", "smtp.example:25", "none", ""), false);
    assert_eq!(problems(&out), (Some(0), vec![]));
}

#[test]
fn the_shared_password_serves_only_a_single_email_channel() {
    let dir = tempfile::tempdir().unwrap();
    let login = "username = \"ferry\"\n";
    // One channel: FERRY_SMTP_PASSWORD is its password.
    let one = email("oncall", "127.0.0.1:25", "none", login);
    assert_eq!(problems(&validate(dir.path(), &one, true)), (Some(0), vec![]));
    // Two channels: it would be offered to both servers. Refused, naming each channel that relies on it; a channel
    // with its own password_env is fine.
    let two = format!(
        "{one}{}{}",
        email("pager", "127.0.0.1:26", "none", login),
        email("audit", "127.0.0.1:27", "none", "username = \"ferry\"\npassword_env = \"OWN_PASSWORD\"\n")
    );
    let (code, lines) = problems(&validate(dir.path(), &two, true));
    assert_eq!(code, Some(2));
    let refusal = |i: usize, name: &str| {
        format!(
            "alarms.email[{i}].password_env: channel \"{name}\": FERRY_SMTP_PASSWORD applies only when there is exactly \
             one email channel (there are 3); give each channel with a username its own password_file or password_env"
        )
    };
    assert_eq!(lines, [refusal(0, "oncall"), refusal(1, "pager")]);
    // Without the shared variable, those two have no password at all: named too.
    let (code, lines) = problems(&validate(dir.path(), &two, false));
    assert_eq!(code, Some(2));
    assert_eq!(lines.len(), 2, "{lines:?}");
    for (line, name) in lines.iter().zip(["oncall", "pager"]) {
        assert!(line.contains(&format!("\"{name}\"")) && line.contains("there is no password"), "{line}");
    }
    // Each with its own source: valid. Both sources at once, or a variable that is not set, is a problem.
    let own = |name: &str, port: u16| {
        email(name, &format!("127.0.0.1:{port}"), "none", "username = \"ferry\"\npassword_env = \"OWN_PASSWORD\"\n")
    };
    assert_eq!(
        problems(&validate(dir.path(), &format!("{}{}", own("oncall", 25), own("pager", 26)), true)),
        (Some(0), vec![])
    );
    let both = email(
        "oncall",
        "127.0.0.1:25",
        "none",
        "username = \"ferry\"\npassword_env = \"OWN_PASSWORD\"\npassword_file = \"/etc/x\"\n",
    );
    let (code, lines) = problems(&validate(dir.path(), &both, false));
    assert_eq!(code, Some(2));
    assert_eq!(
        lines,
        ["alarms.email[0].password_env: channel \"oncall\": set password_file or password_env, not both"]
    );
    let unset =
        email("oncall", "127.0.0.1:25", "none", "username = \"ferry\"\npassword_env = \"NO_SUCH_VARIABLE_X\"\n");
    let (code, lines) = problems(&validate(dir.path(), &unset, false));
    assert_eq!(code, Some(2));
    assert_eq!(
        lines[0],
        "alarms.email[0].password_env: channel \"oncall\": \"NO_SUCH_VARIABLE_X\" is not set, or empty"
    );
}
