//! Redis restarted empty loses the line: as docs/waiting-room.md decides,
//! every buyer still waiting is told to join again (`404 not-in-line`), an
//! admission in hand is refused, and the line works again at once.

use std::time::Duration;

use test_support::RedisServer;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_redis_restarts_empty_waiting_buyers_are_told_to_join_again() {
    crate::support::provoking("a restart of its own Redis (lost connections, 503)");
    let mut redis = RedisServer::start().await;
    let url = redis.url();
    let app = TestApp::spawn_with(|config| config.backends.redis_url = url).await;
    let sale = room_sale(&app, "sql", 10, json!({ "concurrency": 1 })).await;
    for user in 1..=3 {
        join(&app, sale, user).await;
    }
    let (admitted, _) = until_called(&app, sale, 1, Duration::from_secs(10)).await;

    redis.restart().await;
    let mut told = None;
    for _ in 0..100 {
        match look(&app, sale, 2).await {
            (StatusCode::SERVICE_UNAVAILABLE, _) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            answer => {
                told = Some(answer);
                break;
            }
        }
    }
    let (status, problem) = told.expect("the service answers again");
    assert_eq!(status, StatusCode::NOT_FOUND, "{problem}");
    assert_eq!(problem["type"], "/problems/not-in-line");
    assert_refused(buy_with(&app, sale, 1, admission_of(&admitted)).await, "admission-refused")
        .await;

    // Joining again works at once, in the order of the new arrivals.
    join(&app, sale, 3).await;
    join(&app, sale, 2).await;
    let (place, _) = until_called(&app, sale, 3, Duration::from_secs(10)).await;
    assert_eq!(buy_with(&app, sale, 3, admission_of(&place)).await.status(), StatusCode::CREATED);
    assert_eq!(until_called(&app, sale, 2, Duration::from_secs(10)).await.0["state"], "admitted");
}
