//! StockFlow's twins for the benches: the scripted StockFlow feature with every table,
//! function, file, test and migration renamed, so that a twin and StockFlow (and two twins)
//! share no object and no file, and each is a feature of the same size.
#![allow(dead_code)]

use consort_cli::init::STOCKFLOW_FEATURE_ID;

/// A twin: its feature id, the word that replaces `stock`, and its migrations' versions.
pub(crate) struct Twin {
    pub id: &'static str,
    pub word: &'static str,
    pub title: &'static str,
    pub versions: [&'static str; 3],
}

/// The depot twin.
pub(crate) const DEPOT: Twin = Twin {
    id: "F2-warehouse-depot",
    word: "depot",
    title: "Depot",
    versions: [
        "0004_depot_records",
        "0005_depot_records_par_level",
        "0006_depot_adjustments",
    ],
};

/// The shelf twin.
pub(crate) const SHELF: Twin = Twin {
    id: "F3-warehouse-shelf",
    word: "shelf",
    title: "Shelf",
    versions: [
        "0007_shelf_records",
        "0008_shelf_records_par_level",
        "0009_shelf_adjustments",
    ],
};

/// `text` (StockFlow's request or script) as `twin`'s: StockFlow's names replaced, longer
/// names first, so that `stock` is replaced last.
pub(crate) fn twin(text: &str, twin: &Twin) -> String {
    let w = twin.word;
    let renames = [
        (STOCKFLOW_FEATURE_ID.to_string(), twin.id.to_string()),
        (
            "location_empty_state".into(),
            format!("{w}_location_empty_state"),
        ),
        ("sku_detail".into(), format!("{w}_sku_detail")),
        (
            "require_non_negative".into(),
            format!("{w}_require_non_negative"),
        ),
        (
            "src/adjustments.sql".into(),
            format!("src/{w}_adjustments.sql"),
        ),
        ("tests/s".into(), format!("tests/{w}_s")),
        ("0001_stock_records".into(), twin.versions[0].to_string()),
        (
            "0002_stock_records_par_level".into(),
            twin.versions[1].to_string(),
        ),
        (
            "0003_stock_adjustments".into(),
            twin.versions[2].to_string(),
        ),
        ("stock".into(), w.to_string()),
        ("Stock".into(), twin.title.to_string()),
    ];
    renames.iter().fold(text.to_owned(), |t, (from, to)| {
        t.replace(from.as_str(), to)
    })
}
