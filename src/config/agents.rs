//! Agents the operator declares: external programs that speak the Agent
//! Client Protocol (ACP) over stdio, one `[[agents]]` table each in the
//! config file or one `--agent 'NAME=COMMAND ARG…'` flag each.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// One ACP agent the operator declared.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// Provider id (what `createSession`'s `provider` names).
    pub name: String,
    /// What pickers show; the name when unset.
    #[serde(default)]
    pub display_name: Option<String>,
    /// The program (looked up on `PATH` when it has no slash).
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables set for it (on top of the server's own).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory of the process and the ACP session's `cwd`
    /// (default: the server's working directory).
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Seconds a starting agent may take to answer `initialize` and
    /// `session/new`.
    #[serde(default = "default_start_timeout_secs")]
    pub start_timeout_secs: u64,
    /// Seconds a running turn may go without a word from the agent (while
    /// nobody is being asked anything) before the agent counts as hung and
    /// is stopped.
    #[serde(default = "default_idle_timeout_secs")]
    pub idle_timeout_secs: u64,
    /// A directory whose files the agent may read (ACP
    /// `fs/read_text_file`); none by default.
    #[serde(default)]
    pub files: Option<PathBuf>,
    /// Whether it may also write files there (`fs/write_text_file`).
    #[serde(default)]
    pub files_write: bool,
}

fn default_start_timeout_secs() -> u64 {
    60
}

fn default_idle_timeout_secs() -> u64 {
    600
}

impl AgentSpec {
    /// A spec with the defaults for everything but name and command line.
    pub fn new(name: impl Into<String>, command: impl Into<String>, args: Vec<String>) -> Self {
        Self {
            name: name.into(),
            display_name: None,
            command: command.into(),
            args,
            env: BTreeMap::new(),
            cwd: None,
            start_timeout_secs: default_start_timeout_secs(),
            idle_timeout_secs: default_idle_timeout_secs(),
            files: None,
            files_write: false,
        }
    }

    /// Parse `NAME=COMMAND ARG…` (the command line split like a POSIX shell
    /// would, quotes included).
    pub fn parse_flag(flag: &str) -> Result<Self, String> {
        let (name, command_line) = flag
            .split_once('=')
            .ok_or_else(|| format!("`--agent {flag}`: expected NAME=COMMAND ARG…"))?;
        let words = shell_words::split(command_line)
            .map_err(|e| format!("`--agent {flag}`: the command line does not parse: {e}"))?;
        let mut words = words.into_iter();
        let command = words
            .next()
            .ok_or_else(|| format!("`--agent {flag}`: no command after `=`"))?;
        let spec = Self::new(name.trim(), command, words.collect());
        spec.check()?;
        Ok(spec)
    }

    /// What pickers show.
    pub fn display_name(&self) -> &str {
        self.display_name.as_deref().unwrap_or(&self.name)
    }

    /// How long start-up may take.
    pub fn start_timeout(&self) -> Duration {
        Duration::from_secs(self.start_timeout_secs.max(1))
    }

    /// How long a turn may go silent.
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_secs(self.idle_timeout_secs.max(1))
    }

    /// The rules a declaration must follow.
    pub fn check(&self) -> Result<(), String> {
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if self.name.is_empty() || self.name.len() > 64 || !self.name.chars().all(ok_char) {
            return Err(format!(
                "agent name `{}`: use 1 to 64 letters, digits, `-`, `_` or `.`",
                self.name
            ));
        }
        if self.command.trim().is_empty() {
            return Err(format!("agent `{}`: `command` is empty", self.name));
        }
        if let Some(cwd) = &self.cwd {
            if !cwd.is_absolute() {
                return Err(format!(
                    "agent `{}`: `cwd` must be an absolute path, not `{}`",
                    self.name,
                    cwd.display()
                ));
            }
        }
        if let Some(files) = &self.files {
            if !files.is_absolute() {
                return Err(format!(
                    "agent `{}`: `files` must be an absolute path, not `{}`",
                    self.name,
                    files.display()
                ));
            }
        } else if self.files_write {
            return Err(format!(
                "agent `{}`: `files_write` needs `files`, the directory it applies to",
                self.name
            ));
        }
        Ok(())
    }

    /// Grant file access as `--agent-files NAME=DIR` (reading) or
    /// `--agent-files-rw NAME=DIR` (reading and writing) asks: the agent
    /// named, among `agents`.
    pub fn grant_files(agents: &mut [AgentSpec], flag: &str, write: bool) -> Result<(), String> {
        let opt = if write {
            "--agent-files-rw"
        } else {
            "--agent-files"
        };
        let (name, dir) = flag
            .split_once('=')
            .ok_or_else(|| format!("`{opt} {flag}`: expected NAME=DIR"))?;
        let agent = agents
            .iter_mut()
            .find(|a| a.name == name.trim())
            .ok_or_else(|| format!("`{opt} {flag}`: no agent `{}` is declared", name.trim()))?;
        agent.files = Some(PathBuf::from(dir));
        agent.files_write = write;
        agent.check()
    }
}

/// The config file's tables (its other keys are the flags', read by
/// [`super::cli`], which refuses the unknown ones).
#[derive(Debug, Default, Deserialize)]
pub struct ConfigFile {
    /// `[[agents]]` tables.
    #[serde(default)]
    pub agents: Vec<AgentSpec>,
    /// `[cluster]`: the same as `--cluster`, `--node-id`, `--lease-secs`.
    #[serde(default)]
    pub cluster: Option<ClusterTable>,
    /// `[notify]` and its `[[notify.webhooks]]`.
    #[serde(default)]
    pub notify: Option<NotifyTable>,
}

/// The `[notify]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyTable {
    /// Milliseconds a request waits before anyone is told (default 5000).
    #[serde(default)]
    pub quiet_delay_ms: Option<u64>,
    /// The web client's address as people reach it, for links.
    #[serde(default)]
    pub public_url: Option<String>,
    /// Attempts per delivery, the first included (default 5).
    #[serde(default)]
    pub retry_attempts: Option<u32>,
    /// Milliseconds before the second attempt, doubled after each (default
    /// 1000).
    #[serde(default)]
    pub retry_backoff_ms: Option<u64>,
    /// Milliseconds one attempt may take (default 10000).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Whether browsers may register for Web Push (default true).
    #[serde(default)]
    pub web_push: Option<bool>,
    /// The contact Web Push signatures name (`mailto:` or `https:`).
    #[serde(default)]
    pub push_contact: Option<String>,
    /// `[[notify.webhooks]]`.
    #[serde(default)]
    pub webhooks: Vec<WebhookTable>,
}

/// One `[[notify.webhooks]]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookTable {
    /// Its name (logs, metrics, the admin view).
    pub name: String,
    /// Where deliveries go (`http` or `https`).
    pub url: String,
    /// The sessions it is told of (default: every session).
    #[serde(default)]
    pub sessions: Option<Vec<String>>,
    /// `json` (default) or `slack`.
    #[serde(default)]
    pub format: crate::notify::Format,
    /// `all` (default) or `approvals`.
    #[serde(default)]
    pub only: crate::notify::Only,
    /// Whether deliveries say what is asked and who settled it.
    #[serde(default)]
    pub include_content: bool,
    /// File holding the signing secret (trailing whitespace trimmed).
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// Allow a loopback or link-local target on a server that listens
    /// beyond loopback.
    #[serde(default)]
    pub allow_loopback: bool,
}

impl NotifyTable {
    /// The notifications this table declares (secret files read).
    pub fn config(&self) -> Result<crate::notify::NotifyConfig, String> {
        let mut c = crate::notify::NotifyConfig::default();
        if let Some(ms) = self.quiet_delay_ms {
            c.quiet_delay = Duration::from_millis(ms);
        }
        if let Some(u) = &self.public_url {
            let parsed =
                url::Url::parse(u).map_err(|e| format!("`notify.public_url` `{u}`: {e}"))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(format!(
                    "`notify.public_url` `{u}` must be http:// or https://"
                ));
            }
            c.public_url = Some(u.trim_end_matches('/').to_owned());
        }
        if let Some(on) = self.web_push {
            c.web_push = on;
        }
        if let Some(contact) = &self.push_contact {
            if !(contact.starts_with("mailto:") || contact.starts_with("https://")) {
                return Err(format!(
                    "`notify.push_contact` `{contact}` must be a mailto: or https:// address"
                ));
            }
            c.push_contact = Some(contact.clone());
        }
        if let Some(n) = self.retry_attempts {
            c.retry.attempts = n.clamp(1, 20);
        }
        if let Some(ms) = self.retry_backoff_ms {
            c.retry.first_backoff = Duration::from_millis(ms);
        }
        if let Some(ms) = self.timeout_ms {
            c.retry.timeout = Duration::from_millis(ms.max(1));
        }
        let mut names = std::collections::HashSet::new();
        for w in &self.webhooks {
            if w.name.trim().is_empty() || !names.insert(w.name.as_str()) {
                return Err(format!("webhook name `{}` is empty or used twice", w.name));
            }
            let url = url::Url::parse(&w.url)
                .map_err(|e| format!("webhook `{}`: `{}`: {e}", w.name, w.url))?;
            crate::notify::target::check(&url, false)
                .map_err(|e| format!("webhook `{}`: {e}", w.name))?;
            let secret = match &w.secret_file {
                None => None,
                Some(p) => {
                    let text = std::fs::read(p).map_err(|e| {
                        format!("webhook `{}`: cannot read `{}`: {e}", w.name, p.display())
                    })?;
                    let trimmed = text.trim_ascii_end().to_vec();
                    if trimmed.len() < 16 {
                        return Err(format!(
                            "webhook `{}`: the secret in `{}` must be at least 16 bytes",
                            w.name,
                            p.display()
                        ));
                    }
                    Some(trimmed)
                }
            };
            c.webhooks.push(crate::notify::WebhookSpec {
                name: w.name.clone(),
                url,
                sessions: w.sessions.clone(),
                format: w.format,
                only: w.only,
                include_content: w.include_content,
                secret,
                allow_loopback: w.allow_loopback,
            });
        }
        Ok(c)
    }
}

/// The `[cluster]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterTable {
    /// NATS server URLs.
    pub urls: Vec<String>,
    /// This node's name.
    pub node_id: String,
    /// Seconds a channel lease lasts unrenewed.
    #[serde(default)]
    pub lease_secs: Option<f64>,
    /// NATS user name (with `password_file`).
    #[serde(default)]
    pub user: Option<String>,
    /// File holding the NATS user's password.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// File holding a NATS token.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// A NATS `.creds` file.
    #[serde(default)]
    pub creds_file: Option<PathBuf>,
    /// File holding a NATS NKey seed.
    #[serde(default)]
    pub nkey_file: Option<PathBuf>,
    /// CA certificate (PEM) for NATS's TLS.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS (with `key_file`).
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// The client certificate's key (PEM).
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

impl ClusterTable {
    /// The cluster this table declares, with `node_id` given on the command
    /// line winning over the file's.
    pub fn config(&self, node_id: Option<&str>) -> Result<crate::store::ClusterConfig, String> {
        let mut c = crate::store::ClusterConfig::parse(
            &self.urls.join(","),
            node_id.unwrap_or(&self.node_id),
        )?;
        if let Some(s) = self.lease_secs {
            c.lease = Duration::from_secs_f64(s.max(1.0));
        }
        c.auth = crate::store::NatsAuth {
            user: self.user.clone(),
            password_file: self.password_file.clone(),
            token_file: self.token_file.clone(),
            creds_file: self.creds_file.clone(),
            nkey_file: self.nkey_file.clone(),
            ca_file: self.ca_file.clone(),
            cert: match (&self.cert_file, &self.key_file) {
                (Some(c), Some(k)) => Some((c.clone(), k.clone())),
                (None, None) => None,
                _ => return Err("`[cluster]`: `cert_file` and `key_file` go together".into()),
            },
        };
        c.auth.check()?;
        Ok(c)
    }
}

impl ConfigFile {
    /// Parse and check a config file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: Self = toml::from_str(text).map_err(|e| e.to_string())?;
        for a in &file.agents {
            a.check()?;
        }
        if let Some(c) = &file.cluster {
            c.config(None)?;
        }
        if let Some(n) = &file.notify {
            n.config()?;
        }
        Ok(file)
    }
}

/// Join the file's agents and the flags' (flags last), refusing a name used
/// twice or one that is built in.
pub fn merge(
    file: Vec<AgentSpec>,
    flags: Vec<AgentSpec>,
    built_in: &[&str],
) -> Result<Vec<AgentSpec>, String> {
    let mut all: Vec<AgentSpec> = Vec::new();
    for spec in file.into_iter().chain(flags) {
        if built_in.contains(&spec.name.as_str()) {
            return Err(format!("agent name `{}` is a built-in provider", spec.name));
        }
        if all.iter().any(|a| a.name == spec.name) {
            return Err(format!("agent `{}` is declared twice", spec.name));
        }
        all.push(spec);
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn a_flag_splits_like_a_shell() {
        let s =
            AgentSpec::parse_flag("claude=npx -y '@zed-industries/claude-code-acp' --x \"a b\"")
                .expect("parses");
        assert_eq!(s.name, "claude");
        assert_eq!(s.command, "npx");
        assert_eq!(
            s.args,
            ["-y", "@zed-industries/claude-code-acp", "--x", "a b"]
        );
        assert_eq!(s.display_name(), "claude");
    }

    #[test]
    fn bad_flags_say_what_is_wrong() {
        for (flag, says) in [
            ("claude", "expected NAME=COMMAND"),
            ("claude=", "no command"),
            ("=cmd", "agent name ``"),
            ("a b=cmd", "agent name `a b`"),
            ("x=cmd 'unclosed", "does not parse"),
        ] {
            let e = AgentSpec::parse_flag(flag).expect_err(flag);
            assert!(e.contains(says), "{flag}: {e}");
        }
    }

    #[test]
    fn the_file_takes_every_key_and_refuses_unknown_ones() {
        let f = ConfigFile::parse(
            r#"
            [[agents]]
            name = "gemini"
            display_name = "Gemini CLI"
            command = "gemini"
            args = ["--experimental-acp"]
            env = { GEMINI_API_KEY = "k" }
            cwd = "/srv/work"
            start_timeout_secs = 5
            idle_timeout_secs = 30
            files = "/srv/work/docs"
            files_write = true
            "#,
        )
        .expect("parses");
        let a = &f.agents[0];
        assert_eq!(a.display_name(), "Gemini CLI");
        assert_eq!(a.args, ["--experimental-acp"]);
        assert_eq!(a.env["GEMINI_API_KEY"], "k");
        assert_eq!(a.cwd.as_deref(), Some(Path::new("/srv/work")));
        assert_eq!(a.idle_timeout(), Duration::from_secs(30));
        assert_eq!(a.files.as_deref(), Some(Path::new("/srv/work/docs")));
        assert!(a.files_write);

        let e = ConfigFile::parse("[[agents]]\nname = \"a\"\ncommand = \"b\"\ncomand = \"c\"\n")
            .expect_err("unknown key");
        assert!(e.contains("comand"), "{e}");
        assert!(e.contains("line 4"), "{e}");
        let e = ConfigFile::parse("[[agents]]\nname = \"a\"\ncommand = \"b\"\ncwd = \"rel\"\n")
            .expect_err("relative cwd");
        assert!(e.contains("absolute"), "{e}");
    }

    #[test]
    fn file_access_is_granted_per_agent_to_an_absolute_directory() {
        let mut agents = vec![AgentSpec::new("a", "x", vec![])];
        AgentSpec::grant_files(&mut agents, "a=/srv/docs", false).expect("grant");
        assert_eq!(agents[0].files.as_deref(), Some(Path::new("/srv/docs")));
        assert!(!agents[0].files_write);
        AgentSpec::grant_files(&mut agents, "a=/srv/docs", true).expect("grant rw");
        assert!(agents[0].files_write);
        for (flag, says) in [
            ("b=/srv", "no agent `b`"),
            ("a", "expected NAME=DIR"),
            ("a=rel", "absolute"),
        ] {
            let e = AgentSpec::grant_files(&mut agents, flag, false).expect_err(flag);
            assert!(e.contains(says), "{flag}: {e}");
        }
        let e =
            ConfigFile::parse("[[agents]]\nname = \"a\"\ncommand = \"b\"\nfiles_write = true\n")
                .expect_err("write without a directory");
        assert!(e.contains("needs `files`"), "{e}");
    }

    #[test]
    fn the_cluster_table_says_what_the_flags_say() {
        let f = ConfigFile::parse(
            "[cluster]\nurls = [\"nats://10.0.0.1:4222\", \"nats://10.0.0.2:4222\"]\nnode_id = \"n1\"\nlease_secs = 5\n",
        )
        .expect("parses");
        let c = f.cluster.expect("cluster").config(None).expect("valid");
        let flags =
            crate::store::ClusterConfig::parse("nats://10.0.0.1:4222,nats://10.0.0.2:4222", "n1")
                .map(|mut c| {
                    c.lease = Duration::from_secs(5);
                    c
                })
                .expect("flags");
        assert_eq!(c, flags);
        for (text, says) in [
            (
                "[cluster]\nurls = [\"http://x\"]\nnode_id = \"n\"\n",
                "nats://",
            ),
            (
                "[cluster]\nurls = [\"nats://x:1\"]\nnode_id = \"a b\"\n",
                "node id",
            ),
            ("[cluster]\nurls = [\"nats://x:1\"]\nnode = \"n\"\n", "node"),
        ] {
            let e = ConfigFile::parse(text).expect_err(text);
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn names_are_unique_and_not_built_in() {
        let a = || AgentSpec::new("a", "x", vec![]);
        assert!(merge(vec![a()], vec![a()], &[])
            .unwrap_err()
            .contains("twice"));
        let s = AgentSpec::new("scripted", "x", vec![]);
        assert!(merge(vec![], vec![s], &["scripted"])
            .unwrap_err()
            .contains("built-in"));
        assert_eq!(merge(vec![a()], vec![], &[]).expect("ok").len(), 1);
    }
}
