//! The report and the approval page in headless Chromium (Debian's `chromium` and
//! `chromium-driver`), on StockFlow runs on the embedded cluster.

#[path = "../common/mod.rs"]
mod common;

mod report;
mod serve;
