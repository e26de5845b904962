//! The way in for coding clients: the repository's Claude Code marketplace and plugin, checked
//! by the real `claude plugin validate` (from npm's `@anthropic-ai/claude-code`, installed on
//! first use, offline after that), and `consort mcp install` for each client into an existing
//! configuration of the user's.
//!
//! Needs `npm` (`.ci/run` installs it).

use std::path::Path;

use crate::common::{assert_exit, assert_exit_saying, consort, run, says, toolchain, write};

/// The repository's root.
fn repository() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
}

#[test]
fn claude_validates_the_marketplace_and_the_plugin_strictly() {
    let modules = toolchain::npm("claude-code", &["@anthropic-ai/claude-code@2"], "claude");
    let claude = modules.join(".bin").join("claude");
    for (what, path) in [
        ("marketplace", repository().to_path_buf()),
        ("plugin", repository().join("plugins/consort")),
    ] {
        let home = tempfile::tempdir().expect("home");
        let o = run(std::process::Command::new(&claude)
            .args(["plugin", "validate", "--strict"])
            .arg(&path)
            .env("HOME", home.path())
            .env("DISABLE_AUTOUPDATER", "1"));
        assert_exit_saying(&o, 0, &format!("the {what} validates"), "Validation passed");
    }
    // The plugin's commands are the ones a session needs, and its server is `consort mcp`.
    let plugin = repository().join("plugins/consort");
    for command in ["start", "status", "next", "approve"] {
        let text = std::fs::read_to_string(plugin.join(format!("commands/{command}.md")))
            .unwrap_or_else(|e| panic!("commands/{command}.md: {e}"));
        assert!(text.starts_with("---\ndescription: "), "{command}: {text}");
    }
    let mcp: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(plugin.join(".mcp.json")).expect("the plugin's .mcp.json"),
    )
    .expect("JSON");
    assert_eq!(mcp["mcpServers"]["consort"]["command"], "consort");
    assert_eq!(mcp["mcpServers"]["consort"]["args"][0], "mcp");
}

#[test]
fn mcp_install_merges_into_each_clients_existing_configuration() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        dir.path(),
        &[
            (
                ".mcp.json",
                r#"{"mcpServers": {"github": {"command": "gh-mcp"}}, "theirs": true}"#,
            ),
            (
                ".cursor/mcp.json",
                r#"{"mcpServers": {"docs": {"url": "https://example.com/mcp"}}}"#,
            ),
            (
                ".codex/config.toml",
                "model = \"o3\" # mine\n\n[mcp_servers.docs]\ncommand = \"docs\"\n",
            ),
        ],
    );
    let install = |client: &str, extra: &[&str]| {
        run(consort()
            .args(["mcp", "install", client, "--dir"])
            .arg(dir.path())
            .args(extra))
    };
    for client in ["claude", "cursor", "codex"] {
        let o = install(client, &[]);
        assert_exit_saying(&o, 0, "installed", "added the server `consort`");
        says(&o, &format!("consort mcp --dir . --as {client}"));
        let o = install(client, &[]);
        assert_exit_saying(&o, 0, "twice", "nothing changed");
        let o = install(client, &["--as", "someone-else"]);
        assert_exit_saying(
            &o,
            1,
            "a different entry is refused",
            "differs from Consort's",
        );
    }
    let json = |file: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.path().join(file)).expect(file))
            .expect("JSON")
    };
    let claude = json(".mcp.json");
    assert_eq!(claude["mcpServers"]["github"]["command"], "gh-mcp");
    assert_eq!(claude["theirs"], true);
    assert_eq!(claude["mcpServers"]["consort"]["type"], "stdio");
    let cursor = json(".cursor/mcp.json");
    assert_eq!(
        cursor["mcpServers"]["docs"]["url"],
        "https://example.com/mcp"
    );
    assert_eq!(
        cursor["mcpServers"]["consort"]["args"],
        serde_json::json!(["mcp", "--dir", ".", "--as", "cursor"])
    );
    let codex = std::fs::read_to_string(dir.path().join(".codex/config.toml")).expect("toml");
    assert!(codex.starts_with("model = \"o3\" # mine\n"), "{codex}");
    let codex: toml::Table = toml::from_str(&codex).expect("TOML");
    assert_eq!(
        codex["mcp_servers"]["docs"]["command"].as_str(),
        Some("docs")
    );
    assert_eq!(
        codex["mcp_servers"]["consort"]["command"].as_str(),
        Some("consort")
    );

    let broken = tempfile::tempdir().expect("tempdir");
    write(broken.path(), &[(".mcp.json", "{\"mcpServers\": ")]);
    let o = run(consort()
        .args(["mcp", "install", "claude", "--dir"])
        .arg(broken.path()));
    assert_exit_saying(&o, 1, "a broken file is refused", "is not valid JSON");
    let o = run(consort().args(["mcp", "install", "vscode"]));
    assert_exit(&o, 2, "an unknown client is a usage error");
}
