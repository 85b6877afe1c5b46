use reqwest::StatusCode;

use crate::support::TestApp;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_sale_sells_exactly_its_stock_to_distinct_buyers() {
    let app = TestApp::spawn().await;
    let sale = app.sale("sql", 3).await;
    let statuses = app.burst(sale, 1, 5).await;
    let placed = statuses.iter().filter(|s| **s == StatusCode::CREATED).count();
    assert_eq!(placed, 3);
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.ledger_drift), (3, 0, 0));
}
