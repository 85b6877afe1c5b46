//! Temporary measurement (not committed).
use seckill::sale::SaleId;
use sqlx::PgPool;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure() {
    let url = std::env::var("TEST_DATABASE_URL").unwrap();
    seckill::startup::prepare_database(&url).await.unwrap();
    let drivers: usize = std::env::var("DRIVERS").map(|d| d.parse().unwrap()).unwrap_or(2);
    let seconds: f64 = std::env::var("SECONDS").map(|d| d.parse().unwrap()).unwrap_or(3.0);
    let sizes: Vec<usize> =
        std::env::var("SIZES").unwrap().split(',').map(|s| s.parse().unwrap()).collect();
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(drivers as u32)
        .connect(&url)
        .await
        .unwrap();
    for size in sizes {
        let sale: i64 = sqlx::query_scalar("INSERT INTO sales (name, total_stock, remaining_stock, strategy) VALUES ('m', 1000000000, 1000000000, 'sql/batched') RETURNING id").fetch_one(&db).await.unwrap();
        let t0 = std::time::Instant::now();
        let v = seckill::strategy::sql_batched::ceiling::units_per_s(
            &db,
            SaleId(sale),
            1,
            size,
            drivers,
            seconds,
        )
        .await
        .unwrap();
        let units = v * seconds;
        let batches = units / size as f64;
        println!(
            "batch {size:4}: {v:8.0} units/s, {:.2} ms per batch ({drivers} drivers)",
            t0.elapsed().as_secs_f64() * 1000.0 / batches * drivers as f64
        );
    }
    let _ = PgPool::close(&db).await;
}
