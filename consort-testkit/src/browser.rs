//! Headless Chromium for the tests that look at a page (feature `browser`): chromedriver on a
//! free loopback port (its process group killed on drop), a WebDriver session through
//! fantoccini, the page's console errors from the browser's own log, and screenshots.
//!
//! ```no_run
//! # async fn demo() {
//! use consort_testkit::browser::Browser;
//! let browser = Browser::start().await.unwrap_or_else(|e| panic!("{e}"));
//! browser.open(&Browser::file_url(std::path::Path::new("/tmp/report.html"))).await.unwrap();
//! assert!(browser.console_errors().await.unwrap().is_empty());
//! browser.screenshot(std::path::Path::new("/tmp/report.png")).await.unwrap();
//! browser.close().await;
//! # }
//! ```
//!
//! A missing Chromium or chromedriver is an error that says how to install them: a test that
//! needs the browser fails with it; nothing is skipped.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::wd::{Capabilities, WebDriverCompatibleCommand};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

/// What can go wrong with the browser.
#[derive(Debug)]
pub enum BrowserError {
    /// A program the browser tests need is not installed.
    Missing(&'static str),
    /// chromedriver did not start or listen.
    Driver(String),
    /// A WebDriver command failed.
    Command(String),
    /// A file could not be written.
    Io(std::io::Error),
}

impl std::fmt::Display for BrowserError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BrowserError::Missing(program) => write!(
                f,
                "the browser tests need {program}, which is not installed; install Debian's packages with `apt-get install chromium chromium-driver` (.ci/run does)"
            ),
            BrowserError::Driver(e) => write!(f, "chromedriver: {e}"),
            BrowserError::Command(e) => write!(f, "WebDriver: {e}"),
            BrowserError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for BrowserError {}

fn command_error(e: impl std::fmt::Display) -> BrowserError {
    BrowserError::Command(e.to_string())
}

/// The first of `names` found on `PATH` (or as an absolute path).
fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    names.iter().find_map(|name| {
        let direct = Path::new(name);
        if direct.is_absolute() && direct.is_file() {
            return Some(direct.to_path_buf());
        }
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// chromedriver, in its own process group, killed with everything it started on drop.
#[derive(Debug)]
struct Driver {
    child: Child,
    port: u16,
}

impl Driver {
    fn start() -> Result<Driver, BrowserError> {
        use std::os::unix::process::CommandExt;
        let program = find_program(&["chromedriver", "/usr/lib/chromium/chromedriver"]).ok_or(
            BrowserError::Missing("chromedriver (package chromium-driver)"),
        )?;
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .map_err(BrowserError::Io)?
            .port();
        let child = Command::new(program)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| BrowserError::Driver(format!("cannot start: {e}")))?;
        let mut driver = Driver { child, port };
        let start = Instant::now();
        while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
            if let Ok(Some(status)) = driver.child.try_wait() {
                return Err(BrowserError::Driver(format!("ended at start: {status}")));
            }
            if start.elapsed() > Duration::from_secs(30) {
                return Err(BrowserError::Driver(format!(
                    "not listening on port {port} after 30 s"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(driver)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// chromedriver's command for the browser's log (`goog:loggingPrefs`).
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/se/log",
            session_id.unwrap_or_default()
        ))
    }

    fn method_and_body(&self, _request_url: &url::Url) -> (http::Method, Option<String>) {
        (
            http::Method::POST,
            Some(json!({"type": "browser"}).to_string()),
        )
    }
}

/// A headless Chromium session.
#[derive(Debug)]
pub struct Browser {
    client: Client,
    _driver: Driver,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium (`--headless=new --no-sandbox
    /// --disable-gpu --disable-dev-shm-usage`, 1280 pixels wide), recording every browser log
    /// entry.
    pub async fn start() -> Result<Browser, BrowserError> {
        let chromium = find_program(&["chromium", "chromium-browser", "google-chrome"])
            .ok_or(BrowserError::Missing("chromium (package chromium)"))?;
        let driver = Driver::start()?;
        let mut caps = Capabilities::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,1000"],
            }),
        );
        caps.insert("goog:loggingPrefs".into(), json!({"browser": "ALL"}));
        let client = ClientBuilder::rustls()
            .map_err(BrowserError::Io)?
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{}", driver.port))
            .await
            .map_err(|e| BrowserError::Driver(format!("no session: {e}")))?;
        Ok(Browser {
            client,
            _driver: driver,
        })
    }

    /// The `file://` URL of a local file.
    pub fn file_url(path: &Path) -> String {
        let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        format!("file://{}", absolute.display())
    }

    /// Loads `url` and waits until the document is complete.
    pub async fn open(&self, url: &str) -> Result<(), BrowserError> {
        self.client.goto(url).await.map_err(command_error)?;
        let start = Instant::now();
        while self.eval("return document.readyState").await? != json!("complete") {
            if start.elapsed() > Duration::from_secs(30) {
                return Err(BrowserError::Command(format!(
                    "{url} did not finish loading"
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Runs `script` (a function body: `return …`) in the page and returns its value.
    pub async fn eval(&self, script: &str) -> Result<Value, BrowserError> {
        self.client
            .execute(script, Vec::new())
            .await
            .map_err(command_error)
    }

    /// The text of every element `css` selects, in document order.
    pub async fn texts(&self, css: &str) -> Result<Vec<String>, BrowserError> {
        let mut out = Vec::new();
        for element in self
            .client
            .find_all(Locator::Css(css))
            .await
            .map_err(command_error)?
        {
            out.push(element.text().await.map_err(command_error)?);
        }
        Ok(out)
    }

    /// The browser log's errors since the last call: JavaScript errors, failed loads, console
    /// errors (level `SEVERE`), each as `source: message`.
    pub async fn console_errors(&self) -> Result<Vec<String>, BrowserError> {
        let log = self
            .client
            .issue_cmd(BrowserLog)
            .await
            .map_err(command_error)?;
        let entries = log.as_array().cloned().unwrap_or_default();
        Ok(entries
            .iter()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| {
                format!(
                    "{}: {}",
                    e["source"].as_str().unwrap_or("browser"),
                    e["message"].as_str().unwrap_or_default()
                )
            })
            .collect())
    }

    /// Saves a PNG of the whole page (the window is first made as tall as the document, up to
    /// 12 000 pixels) at `path`, making its directory; returns its size in bytes.
    pub async fn screenshot(&self, path: &Path) -> Result<u64, BrowserError> {
        let height = self
            .eval("return document.documentElement.scrollHeight")
            .await?
            .as_u64()
            .unwrap_or(1000)
            .clamp(600, 12_000);
        let height = u32::try_from(height).unwrap_or(12_000);
        self.client
            .set_window_size(1280, height)
            .await
            .map_err(command_error)?;
        let png = self.client.screenshot().await.map_err(command_error)?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(BrowserError::Io)?;
        }
        std::fs::write(path, &png).map_err(BrowserError::Io)?;
        Ok(png.len() as u64)
    }

    /// Ends the session (Chromium quits); chromedriver stops when dropped.
    pub async fn close(self) {
        let _ = self.client.close().await;
    }
}
