use super::*;

fn entry(client: Client) -> ServerEntry {
    ServerEntry::for_client(client, "consort", "consort", None)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).expect("the written file")
}

#[test]
fn a_new_file_gets_each_clients_documented_shape() {
    let dir = tempfile::tempdir().expect("tempdir");
    for client in [Client::Claude, Client::Cursor] {
        let (path, outcome) = install(dir.path(), client, &entry(client)).expect("installed");
        assert_eq!(outcome, Outcome::Added);
        let v: serde_json::Value = serde_json::from_str(&read(&path)).expect("JSON");
        let server = &v["mcpServers"]["consort"];
        assert_eq!(server["command"], "consort");
        let args = ["mcp", "--dir", ".", "--as", client.identity()];
        assert_eq!(server["args"], serde_json::json!(args));
        assert_eq!(server["type"] == "stdio", client == Client::Claude);
    }
    let (path, _) = install(dir.path(), Client::Codex, &entry(Client::Codex)).expect("codex");
    assert!(path.ends_with(".codex/config.toml"));
    let v: toml::Table = toml::from_str(&read(&path)).expect("TOML");
    let server = &v["mcp_servers"]["consort"];
    assert_eq!(server["command"].as_str(), Some("consort"));
    assert_eq!(server["args"].as_array().map(Vec::len), Some(5), "{server}");
}

#[test]
fn the_users_entries_keys_and_order_stay_as_they_were() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mine = r#"{
  "zeta": 1,
  "mcpServers": {
    "github": {"command": "npx", "args": ["-y", "gh"], "env": {"TOKEN": "${GH}"}},
    "alpha": {"url": "https://example.com/mcp"}
  },
  "alpha": [true, null, 2.5]
}"#;
    std::fs::write(dir.path().join(".mcp.json"), mine).expect("write");
    install(dir.path(), Client::Claude, &entry(Client::Claude)).expect("installed");
    let text = read(&dir.path().join(".mcp.json"));
    let order = |keys: &[&str]| {
        let at: Vec<usize> = keys
            .iter()
            .map(|k| text.find(&format!("\"{k}\"")).expect(k))
            .collect();
        at.windows(2).all(|w| w[0] < w[1])
    };
    assert!(
        order(&["zeta", "mcpServers", "github", "command", "env"]),
        "{text}"
    );
    assert!(order(&["github", "alpha", "consort"]), "{text}");
    let before: serde_json::Value = serde_json::from_str(mine).expect("mine");
    let after: serde_json::Value = serde_json::from_str(&text).expect("theirs");
    assert_eq!(
        after["mcpServers"]["github"],
        before["mcpServers"]["github"]
    );
    assert_eq!(after["mcpServers"]["alpha"], before["mcpServers"]["alpha"]);
    assert_eq!(after["alpha"], before["alpha"]);
    assert_eq!(after["zeta"], 1);

    let toml = "# my servers\n[mcp_servers.docs]\ncommand = \"docs-mcp\" # local\n\n[profile]\nmodel = \"o3\"\n";
    std::fs::create_dir_all(dir.path().join(".codex")).expect("mkdir");
    std::fs::write(dir.path().join(".codex/config.toml"), toml).expect("write");
    install(dir.path(), Client::Codex, &entry(Client::Codex)).expect("installed");
    let text = read(&dir.path().join(".codex/config.toml"));
    let mut rest = text.as_str();
    for line in toml.lines().filter(|l| !l.is_empty()) {
        let at = rest
            .find(line)
            .unwrap_or_else(|| panic!("{line:?} kept, in order:\n{text}"));
        rest = &rest[at + line.len()..];
    }
    assert!(text.contains("[mcp_servers.consort]"), "{text}");
}

#[test]
fn the_same_entry_twice_writes_nothing_and_a_different_one_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    for client in [Client::Claude, Client::Cursor, Client::Codex] {
        let (path, first) = install(dir.path(), client, &entry(client)).expect("first");
        assert_eq!(first, Outcome::Added);
        let written = read(&path);
        let (_, again) = install(dir.path(), client, &entry(client)).expect("again");
        assert_eq!(again, Outcome::AlreadyThere, "{}", client.label());
        let other = ServerEntry::for_client(client, "consort", "consort", Some("someone"));
        let e = install(dir.path(), client, &other).expect_err("refused");
        assert!(matches!(e, InstallError::Taken { .. }), "{e}");
        assert!(e.to_string().contains("--name"), "{e}");
        assert_eq!(read(&path), written, "nothing was written");
        let renamed = ServerEntry {
            name: "consort-someone".into(),
            ..other
        };
        let (_, added) = install(dir.path(), client, &renamed).expect("another name");
        assert_eq!(added, Outcome::Added);
    }
}

#[test]
fn a_file_that_does_not_parse_or_holds_no_table_is_left_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases: [(Client, &str, &str); 5] = [
        (Client::Claude, "{\"mcpServers\": {", "JSON"),
        (Client::Claude, "{\"mcpServers\": [1]}", "mcpServers"),
        (Client::Cursor, "[1, 2]", "whole file"),
        (Client::Codex, "mcp_servers = [", "TOML"),
        (Client::Codex, "mcp_servers = 3\n", "mcp_servers"),
    ];
    for (client, text, says) in cases {
        let path = dir.path().join(client.file());
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, text).expect("write");
        let e = install(dir.path(), client, &entry(client)).expect_err("refused");
        assert!(e.to_string().contains(says), "{e}");
        assert!(e.to_string().contains("nothing was written"), "{e}");
        assert_eq!(read(&path), text);
    }
}
